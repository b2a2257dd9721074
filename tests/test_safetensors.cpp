// Tests of strata/io/safetensors.hpp and strata/io/atomic_file.hpp: round trips, the byte
// layout, atomic saving, and every kind of corrupt file the reader must refuse.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <climits>
#include <utility>

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "strata/io/atomic_file.hpp"
#include "strata/io/safetensors.hpp"

namespace fs = std::filesystem;
using namespace strata::io;
using strata_test::error_of;
using strata_test::has;
using strata_test::TempDir;

namespace {


std::string read_text(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_text(const fs::path& p, const std::string& s) {
    std::ofstream f(p, std::ios::binary);
    f << s;
}

// A file with `header` as its JSON header (unpadded) and `data_bytes` zero bytes of data.
std::vector<std::byte> make_file(const std::string& header, std::size_t data_bytes) {
    std::vector<std::byte> f(8 + header.size() + data_bytes);
    std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
    std::memcpy(f.data() + 8, header.data(), header.size());
    return f;
}


std::string parse_error(const std::string& header, std::size_t data_bytes) {
    return error_of<strata::CheckpointError>([&] { SafetensorsFile::parse(make_file(header, data_bytes), "t.st"); });
}


// The tensors of tests/check_safetensors.py's SAMPLE.
SafetensorsWriter sample_writer() {
    SafetensorsWriter w;
    w.add("weights/f32", {2, 3}, std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f});
    w.add("weights/f64", {3}, std::vector<double>{0.1, -2.5, 1e300});
    w.add("counts/i32", {2, 2}, std::vector<std::int32_t>{-2147483647 - 1, -1, 0, 2147483647});
    w.add("step", {}, std::vector<std::int64_t>{1234567890123});
    w.add("empty", {0}, std::vector<float>{});
    w.set_metadata("format", "strata-test");
    w.set_metadata("unicode", "\xc3\xa9\xe2\x9c\x93 \"quoted\"\n");
    return w;
}

}  // namespace

TEST_CASE("safetensors: round trip of several dtypes, shapes and metadata") {
    TempDir dir;
    auto w = sample_writer();
    w.add("bytes", {4}, std::vector<std::uint8_t>{0, 1, 254, 255});
    w.add("tiny/i64", {1, 1, 1}, std::vector<std::int64_t>{-5});
    w.set_metadata("control", std::string("tab\there\x01", 9));
    CHECK(w.size() == 7);
    w.save(dir / "m.safetensors");

    const auto f = SafetensorsFile::load(dir / "m.safetensors");
    CHECK(f.size() == 7);
    // Data order: 8-byte elements, then 4-byte, then 1-byte; by name within each size.
    CHECK(f.names() == std::vector<std::string>{"step", "tiny/i64", "weights/f64", "counts/i32", "empty", "weights/f32", "bytes"});
    CHECK(f.dtype("weights/f32") == Dtype::F32);
    CHECK(f.shape("weights/f32") == std::vector<std::size_t>{2, 3});
    CHECK(f.shape("step").empty());
    CHECK(f.get<float>("weights/f32", {2, 3}) == std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f});
    CHECK(f.get<double>("weights/f64") == std::vector<double>{0.1, -2.5, 1e300});
    CHECK(f.get<std::int32_t>("counts/i32", {2, 2}) == std::vector<std::int32_t>{-2147483647 - 1, -1, 0, 2147483647});
    CHECK(f.get<std::int64_t>("step", {}) == std::vector<std::int64_t>{1234567890123});
    CHECK(f.get<float>("empty", {0}).empty());
    CHECK(f.get<std::uint8_t>("bytes") == std::vector<std::uint8_t>{0, 1, 254, 255});
    CHECK(f.get<std::int64_t>("tiny/i64", {1, 1, 1}) == std::vector<std::int64_t>{-5});
    CHECK(f.bytes("weights/f32").size() == 24);
    CHECK(f.info("counts/i32").numel() == 4);

    std::vector<float> out(6);
    f.copy_to<float>("weights/f32", std::span<float>(out), {2, 3});
    CHECK(out[5] == 1.5f);

    CHECK(f.metadata().size() == 3);
    CHECK(f.metadata("format") == "strata-test");
    CHECK(f.metadata("unicode") == "\xc3\xa9\xe2\x9c\x93 \"quoted\"\n");
    CHECK(f.metadata("control") == std::string("tab\there\x01", 9));
    CHECK(f.has_metadata("format"));
    CHECK(!f.has_metadata("epoch"));

    // serialize() and save() produce the same bytes.
    const auto mem = w.serialize();
    CHECK(std::string(reinterpret_cast<const char*>(mem.data()), mem.size()) == read_text(dir / "m.safetensors"));
}

TEST_CASE("safetensors: byte layout (length prefix, padded header, aligned tensors)") {
    SafetensorsWriter w;
    w.add("b", {3}, std::vector<std::uint8_t>{1, 2, 3});
    w.add("a", {2}, std::vector<double>{1.0, 2.0});
    w.set_metadata("k", "v");
    const auto bytes = w.serialize();
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(bytes[static_cast<std::size_t>(i)]);
    CHECK((8 + n) % 8 == 0);
    const std::string header(reinterpret_cast<const char*>(bytes.data()) + 8, n);
    CHECK(header.rfind("{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                       "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]}}",
                       0) == 0);
    CHECK(header.find_first_not_of(' ', header.find_last_of('}') + 1) == std::string::npos);
    CHECK(bytes.size() == 8 + n + 19);
    double first;
    std::memcpy(&first, bytes.data() + 8 + n, 8);
    CHECK(first == 1.0);
    CHECK(std::to_integer<int>(bytes.back()) == 3);
}

TEST_CASE("safetensors: the writer checks names and shapes") {
    SafetensorsWriter w;
    const auto msg = error_of<strata::ShapeError>([&] { w.add("dense/kernel", {3, 4}, std::vector<float>(10)); });
    CHECK(has(msg, "'dense/kernel'"));
    CHECK(has(msg, "shape [3, 4] holds 12 elements, but the data has 10"));
    w.add("x", {1}, std::vector<float>{1});
    CHECK(has(error_of<strata::ValueError>([&] { w.add("x", {1}, std::vector<float>{1}); }), "'x' was already added"));
    CHECK_THROWS_AS(w.add("", {1}, std::vector<float>{1}), strata::ValueError);
    CHECK_THROWS_AS(w.add("__metadata__", {1}, std::vector<float>{1}), strata::ValueError);
    CHECK_THROWS_AS(w.add("bad\xff", {1}, std::vector<float>{1}), strata::ValueError);
    CHECK_THROWS_AS(w.set_metadata("k", "\xc3"), strata::ValueError);
    const std::byte raw[3]{};
    CHECK_THROWS_AS(w.add_bytes("h", Dtype::F16, {2}, raw), strata::ShapeError);
    w.add_bytes("h", Dtype::BF16, {1}, std::span<const std::byte>(raw, 2));
    CHECK(SafetensorsFile::parse(w.serialize()).dtype("h") == Dtype::BF16);
}

TEST_CASE("safetensors: typed reads check dtype and shape, naming the tensor") {
    SafetensorsWriter w;
    w.add("dense/kernel", {784, 64}, std::vector<float>(784 * 64, 0.5f));
    w.set_metadata("epoch", "3");
    const auto f = SafetensorsFile::parse(w.serialize(), "model.safetensors");

    const auto shape = error_of<strata::CheckpointError>([&] { f.get<float>("dense/kernel", {64, 784}); });
    CHECK(has(shape, "'model.safetensors'"));
    CHECK(has(shape, "tensor 'dense/kernel': expected shape [64, 784], found [784, 64]"));

    const auto dtype = error_of<strata::CheckpointError>([&] { f.get<double>("dense/kernel", {784, 64}); });
    CHECK(has(dtype, "tensor 'dense/kernel': expected dtype F64, found F32"));

    const auto missing = error_of<strata::CheckpointError>([&] { f.get<float>("dense/bias"); });
    CHECK(has(missing, "has no tensor 'dense/bias'"));
    CHECK(has(missing, "its tensors are: dense/kernel"));

    CHECK(has(error_of<strata::CheckpointError>([&] { f.metadata("step"); }), "no metadata key 'step'"));
    std::vector<float> small(10);
    CHECK_THROWS_AS(f.copy_to<float>("dense/kernel", std::span<float>(small), {784, 64}), strata::ShapeError);
}

TEST_CASE("safetensors: corrupt headers and offsets are refused precisely") {
    const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
    REQUIRE(SafetensorsFile::parse(make_file("{" + ok_entry + "}", 24)).size() == 1);
    // Padding with spaces is allowed.
    CHECK(SafetensorsFile::parse(make_file("{" + ok_entry + "}   ", 24)).size() == 1);

    SUBCASE("file shorter than the length prefix") {
        const auto m = error_of<strata::CheckpointError>([] { SafetensorsFile::parse(std::vector<std::byte>(5), "t.st"); });
        CHECK(has(m, "file is 5 bytes long"));
    }
    SUBCASE("header length beyond the file") {
        auto f = make_file("{}", 0);
        f[0] = std::byte{200};
        const auto m = error_of<strata::CheckpointError>([&] { SafetensorsFile::parse(f, "t.st"); });
        CHECK(has(m, "header length 200 exceeds the file: only 2 bytes follow"));
    }
    SUBCASE("header length absurd") {
        auto f = make_file("{}", 0);
        f[7] = std::byte{0x7f};
        CHECK(has(error_of<strata::CheckpointError>([&] { SafetensorsFile::parse(f, "t.st"); }), "exceeds the file"));
    }
    SUBCASE("not JSON") {
        CHECK(has(parse_error("{\"w\":{\"dtype\":F32}}", 0), "invalid JSON at byte 14: expected a value, found 'F'"));
        CHECK(has(parse_error("{\"w\":[1,2}", 0), "expected ',' or ']'"));
        CHECK(has(parse_error("{\"w\":\"abc}", 0), "unterminated string"));
        CHECK(has(parse_error("{} x", 0), "after the end of the JSON value"));
        CHECK(has(parse_error("[]", 0), "must start with '{'"));
        CHECK(has(parse_error(std::string("{\"a\xff\":1}"), 0), "not valid UTF-8"));
        CHECK(has(parse_error("{\"w\":" + std::string(100, '[') + std::string(100, ']') + "}", 0), "nesting deeper"));
    }
    SUBCASE("duplicate tensor") {
        CHECK(has(parse_error("{" + ok_entry + "," + ok_entry + "}", 24), "duplicate key \"w\""));
    }
    SUBCASE("unknown dtype") {
        const auto m = parse_error(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16);
        CHECK(has(m, "tensor 'w': unknown dtype 'F128'"));
        CHECK(has(m, "F32"));
    }
    SUBCASE("missing or extra fields") {
        CHECK(has(parse_error(R"({"w":{"dtype":"F32","shape":[1]}})", 4), "tensor 'w' lacks the field data_offsets"));
        CHECK(has(parse_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4), "unknown field 'x'"));
        CHECK(has(parse_error(R"({"w":[1]})", 0), "tensor 'w' is an array"));
    }
    SUBCASE("bad shape entries") {
        CHECK(has(parse_error(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "shape entry -1"));
        CHECK(has(parse_error(R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4), "shape entry 1.0"));
        CHECK(has(parse_error(R"({"w":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", 4), "shape entry a string"));
    }
    SUBCASE("byte length disagrees with dtype and shape") {
        const auto m = parse_error(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20);
        CHECK(has(m, "tensor 'w': dtype F32 and shape [2, 3] need 24 bytes, but data_offsets [0, 20] cover 20"));
    }
    SUBCASE("offsets reversed") {
        CHECK(has(parse_error(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4), "end before they begin"));
    }
    SUBCASE("gap, overlap, excess, truncation") {
        const auto gap = parse_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                     R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
                                     10);
        CHECK(has(gap, "tensor 'b' begins at byte 6 but tensor 'a' ends at byte 4"));
        CHECK(has(gap, "without gaps"));
        const auto overlap = parse_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                         R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                                         6);
        CHECK(has(overlap, "without overlaps"));
        const auto first = parse_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6);
        CHECK(has(first, "expected the first tensor to begin at byte 0"));
        const auto excess = parse_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 9);
        CHECK(has(excess, "the tensors cover 4 bytes, but the data buffer has 9 bytes"));
        const auto truncated = parse_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 3);
        CHECK(has(truncated, "tensor 'a' ends at byte 4 of the data buffer, but the buffer has only 3 bytes"));
    }
    SUBCASE("metadata must be strings") {
        CHECK(has(parse_error(R"({"__metadata__":{"epoch":3}})", 0), "__metadata__ value of 'epoch' is a number"));
        CHECK(has(parse_error(R"({"__metadata__":[]})", 0), "__metadata__ is an array"));
    }
    SUBCASE("escapes in names decode") {
        const auto f = SafetensorsFile::parse(
            make_file(R"({"a\"b\u00e9\ud83d\ude00":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1));
        CHECK(f.contains("a\"b\xc3\xa9\xf0\x9f\x98\x80"));
        CHECK(has(parse_error(R"({"\ud83d":1})", 0), "low surrogate"));
    }
}

TEST_CASE("safetensors: load reports files that cannot be read") {
    TempDir dir;
    const auto missing = error_of<strata::IoError>([&] { SafetensorsFile::load(dir / "none.safetensors"); });
    CHECK(has(missing, "none.safetensors"));
    CHECK(has(missing, "No such file or directory"));
    CHECK(has(error_of<strata::IoError>([&] { SafetensorsFile::load(dir.path); }), "is a directory"));

    // A file cut short on disk.
    sample_writer().save(dir / "m.safetensors");
    fs::resize_file(dir / "m.safetensors", fs::file_size(dir / "m.safetensors") - 3);
    const auto cut = error_of<strata::CheckpointError>([&] { SafetensorsFile::load(dir / "m.safetensors"); });
    CHECK(has(cut, "but the buffer has only"));
}

TEST_CASE("safetensors: saving is atomic") {
    TempDir dir;
    const auto target = dir / "ckpt.safetensors";
    write_text(target, "old checkpoint");

    SUBCASE("a successful save replaces the file and leaves no temporary file") {
        sample_writer().save(target);
        CHECK(SafetensorsFile::load(target).size() == 5);
        CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});
    }
    SUBCASE("an exception before commit leaves the old file and no temporary file") {
        fs::path temp;
        try {
            AtomicFileWriter out(target);
            temp = out.temp_path();
            CHECK(temp.parent_path() == dir.path);
            CHECK(fs::exists(temp));
            out.write("new", 3);
            throw std::runtime_error("simulated crash while writing");
        } catch (const std::runtime_error&) {
        }
        CHECK(read_text(target) == "old checkpoint");
        CHECK(!fs::exists(temp));
        CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});
    }
    SUBCASE("a write that fails part-way (file size limit) leaves the old file") {
        SafetensorsWriter w;
        w.add("big", {4096}, std::vector<float>(4096, 1.0f));
        rlimit old_limit{};
        REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
        auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
        rlimit small = old_limit;
        small.rlim_cur = 1000;
        REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
        const auto msg = error_of<strata::IoError>([&] { w.save(target); });
        ::setrlimit(RLIMIT_FSIZE, &old_limit);
        std::signal(SIGXFSZ, old_handler);
        CHECK(has(msg, "cannot write the temporary file"));
        CHECK(has(msg, "File too large"));
        CHECK(read_text(target) == "old checkpoint");
        CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});
    }
    SUBCASE("a target that cannot be replaced (a directory)") {
        fs::create_directory(dir / "sub");
        const auto msg = error_of<strata::IoError>([&] { sample_writer().save(dir / "sub"); });
        CHECK(has(msg, "expected a regular file or a new name, found a directory"));
        CHECK(fs::is_directory(dir / "sub"));
        CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors", "sub"});
    }
    SUBCASE("a directory that does not exist") {
        const auto msg = error_of<strata::IoError>([&] { sample_writer().save(dir / "no/such/ckpt.safetensors"); });
        CHECK(has(msg, "cannot create the temporary file"));
        CHECK(has(msg, "No such file or directory"));
    }
    SUBCASE("a directory without write permission") {
        if (::geteuid() == 0) {
            MESSAGE("skipped: root ignores directory permissions");
            return;
        }
        fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
        const auto msg = error_of<strata::IoError>([&] { sample_writer().save(target); });
        fs::permissions(dir.path, fs::perms::owner_all);
        CHECK(has(msg, "Permission denied"));
        CHECK(read_text(target) == "old checkpoint");
    }
}

// Issue 41: the writer renamed over any non-directory, so `--json /dev/null` as root would have
// replaced the machine's /dev/null. Nodes made here stand in for it (a FIFO, a socket, and as
// root a character device of our own): each is refused, named, and left as it was.
TEST_CASE("atomic file: a device, FIFO or socket at the target is refused and left alone") {
    TempDir dir;
    std::vector<std::pair<fs::path, std::string>> nodes;
    REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
    nodes.push_back({dir / "fifo", "found a FIFO"});
    {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
        REQUIRE(fd >= 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        const std::string sp = (dir / "sock").string();
        REQUIRE(sp.size() < sizeof addr.sun_path);
        std::memcpy(addr.sun_path, sp.c_str(), sp.size() + 1);
        REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
        ::close(fd);
        nodes.push_back({dir / "sock", "found a socket"});
    }
    if (::geteuid() == 0 && ::mknod((dir / "null").c_str(), S_IFCHR | 0666, ::makedev(1, 3)) == 0)
        nodes.push_back({dir / "null", "found a character device"});
    for (const auto& [node, found] : nodes) {
        CAPTURE(node);
        struct stat before {};
        REQUIRE(::lstat(node.c_str(), &before) == 0);
        const auto msg = error_of<strata::IoError>([&] { sample_writer().save(node); });
        CHECK(has(msg, node.string()));
        CHECK(has(msg, "expected a regular file or a new name, " + found));
        struct stat after {};
        REQUIRE(::lstat(node.c_str(), &after) == 0);
        CHECK(after.st_ino == before.st_ino);  // the same node, not a new file renamed over it
        CHECK(after.st_mode == before.st_mode);
        CHECK_THROWS_AS(check_output_target(node), strata::IoError);
    }
    // Nothing written beside them either.
    for (const auto& e : dir.entries()) CHECK(e.find(".tmp.") == std::string::npos);
}

TEST_CASE("atomic file: a node put at the target while writing is refused at the rename") {
    TempDir dir;
    const auto target = dir / "out.json";
    AtomicFileWriter out(target);  // a new name: accepted
    out.write("{}", 2);
    REQUIRE(::mkfifo(target.c_str(), 0600) == 0);
    const auto msg = error_of<strata::IoError>([&] { out.commit(); });
    CHECK(has(msg, "found a FIFO; it is left as it is (found just before the rename)"));
    struct stat st {};
    REQUIRE(::lstat(target.c_str(), &st) == 0);
    CHECK(S_ISFIFO(st.st_mode));
    CHECK(dir.entries() == std::vector<std::string>{"out.json"});  // the temporary file removed
}

TEST_CASE("atomic file: regular files and links are still replaced (the negative control)") {
    TempDir dir;
    write_text(dir / "old", "old");
    sample_writer().save(dir / "old");
    CHECK(SafetensorsFile::load(dir / "old").size() == 5);
    write_text(dir / "elsewhere", "kept");
    fs::create_symlink(dir / "elsewhere", dir / "link");
    sample_writer().save(dir / "link");
    CHECK(!fs::is_symlink(dir / "link"));  // the link replaced, not followed
    CHECK(read_text(dir / "elsewhere") == "kept");
    CHECK_NOTHROW(check_output_target(dir / "new-name"));
}

TEST_CASE("atomic file: a name or path longer than the file system allows is refused before writing") {
    TempDir dir;
    const long name_max = ::pathconf(dir.path.c_str(), _PC_NAME_MAX);
    REQUIRE(name_max > 0);
    const auto too_long = dir / std::string(std::size_t(name_max) + 1, 'n');
    auto msg = error_of<strata::IoError>([&] { AtomicFileWriter out(too_long); });
    CHECK(has(msg, "expected a file name of at most " + std::to_string(name_max) + " bytes"));
    CHECK(has(msg, "found one of " + std::to_string(name_max + 1) + " bytes"));
    CHECK(dir.entries().empty());
    CHECK_NOTHROW(check_output_target(dir / std::string(std::size_t(name_max), 'n')));  // the longest allowed
    // A path of PATH_MAX bytes, of names that each fit.
    fs::path deep = dir.path;
    while (deep.native().size() < PATH_MAX) deep /= std::string(100, 'd');
    msg = error_of<strata::IoError>([&] { check_output_target(deep); });
    CHECK(has(msg, "(PATH_MAX)"));
}

TEST_CASE("safetensors: a save removes its target's temporary files left by dead processes, and no others") {
    TempDir dir;
    const auto target = dir / "ckpt.safetensors";
    // A pid that is certainly dead: a child that exited and was reaped.
    const pid_t dead = ::fork();
    REQUIRE(dead >= 0);
    if (dead == 0) ::_exit(0);
    REQUIRE(::waitpid(dead, nullptr, 0) == dead);
    // A pid that is certainly alive while the save runs: a child waiting to be killed.
    const pid_t alive = ::fork();
    REQUIRE(alive >= 0);
    if (alive == 0) {
        ::pause();
        ::_exit(0);
    }
    const std::string d = std::to_string(dead), a = std::to_string(alive), self = std::to_string(::getpid());
    const std::vector<std::string> stale = {".ckpt.safetensors.tmp." + d + ".0", ".ckpt.safetensors.tmp." + d + ".17"};
    const std::vector<std::string> kept = {
        ".ckpt.safetensors.tmp." + a + ".0",       // a live process is still writing it
        ".ckpt.safetensors.tmp." + self + ".999",  // this process's (another thread may be writing it)
        ".other.safetensors.tmp." + d + ".0",      // another target's
        ".ckpt.safetensors.tmp." + d + ".x",       // not a name the writer makes
        ".ckpt.safetensors.tmp." + d,              //
        ".ckpt.safetensors.tmp.+" + d + ".0",      //
        "ckpt.safetensors.tmp." + d + ".0",        //
    };
    for (const auto& name : stale) write_text(dir / name, "torn");
    for (const auto& name : kept) write_text(dir / name, "keep");

    SUBCASE("a failed save removes nothing") {
        fs::create_directory(dir / "sub");
        write_text(dir / (".sub.tmp." + d + ".0"), "torn");
        CHECK_THROWS_AS(sample_writer().save(dir / "sub"), strata::IoError);
        CHECK(fs::exists(dir / (".sub.tmp." + d + ".0")));
    }
    SUBCASE("a successful save removes exactly the stale ones") {
        sample_writer().save(target);
        CHECK(SafetensorsFile::load(target).size() == 5);
        for (const auto& name : stale) CHECK_MESSAGE(!fs::exists(dir / name), name);
        for (const auto& name : kept) CHECK_MESSAGE(read_text(dir / name) == "keep", name);
    }
    ::kill(alive, SIGKILL);
    ::waitpid(alive, nullptr, 0);
}

TEST_CASE("safetensors: parsing time is linear in the header (400 000 metadata keys)") {
    // Checking each key against every earlier one took 11 s for 80 000 keys: for 400 000 it
    // would take minutes and run past this suite's timeout, which is what this test relies on.
    SafetensorsWriter w;
    for (int i = 0; i < 400000; ++i) w.set_metadata("key" + std::to_string(i), "v");
    const auto f = SafetensorsFile::parse(w.serialize());
    CHECK(f.metadata().size() == 400000);
    CHECK(f.metadata("key399999") == "v");
    // A duplicate among them is still found, whichever two keys it is.
    std::string header = "{\"__metadata__\":{";
    for (int i = 0; i < 100000; ++i) header += "\"k" + std::to_string(i) + "\":\"v\",";
    header += "\"k77777\":\"again\"}}";
    CHECK(has(parse_error(header, 0), "duplicate key \"k77777\""));
}

// Written for tests/check_safetensors.py (`--writer`), which reads the file with an independent
// Python reader; without STRATA_SAFETENSORS_SAMPLE it checks the sample with the C++ reader.
TEST_CASE("safetensors: python sample") {
    TempDir dir;
    const char* env = std::getenv("STRATA_SAFETENSORS_SAMPLE");
    const fs::path path = env ? fs::path(env) : dir / "sample.safetensors";
    sample_writer().save(path);
    const auto f = SafetensorsFile::load(path);
    CHECK(f.size() == 5);
    CHECK(f.get<double>("weights/f64", {3})[0] == 0.1);
}
