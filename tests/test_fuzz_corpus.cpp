// A deterministic fuzz corpus for the two file parsers a stranger's file reaches: IDX
// (strata/io/idx.hpp) and safetensors (strata/io/safetensors.hpp), and the checkpoint
// reader on top of the latter. Thousands of mutants of valid files (every truncation, every bit
// flip of the headers, header fields at their extremes, mangled JSON, seeded random edits).
// Every case must end in a correct read (checked against the input bytes) or in the parser's
// typed error (IoError for IDX, CheckpointError for safetensors) -- never another exception,
// a crash, a single allocation far larger than the input, or a case that takes long.
//
// tests/fuzz/ has libFuzzer targets for long runs of the same parsers (scripts/fuzz).
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <new>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "strata/io/idx.hpp"
#include "strata/io/safetensors.hpp"
#include "strata/io/text.hpp"
#include "strata/train/checkpoint.hpp"

// ---- The largest single allocation of each case: a header field that sizes a buffer before it
// is checked against the file shows up here, whatever the machine's memory. ----
namespace {
std::atomic<std::size_t> largest_allocation{0};
// Far above anything a case may legitimately allocate: past it the parser is already wrong, and
// refusing keeps a bug from taking the machine's memory before the check below reports it.
constexpr std::size_t allocation_cap = std::size_t(1) << 30;

void* counted_new(std::size_t n) {
    std::size_t seen = largest_allocation.load(std::memory_order_relaxed);
    while (n > seen && !largest_allocation.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
    }
    if (n > allocation_cap) throw std::bad_alloc();
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted_new(n); }
void* operator new[](std::size_t n) { return counted_new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;
using strata_test::TempDir;

namespace {

// SplitMix64: the corpus is the same on every run and every machine.
struct Rng {
    std::uint64_t s;
    std::uint64_t next() {
        std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    std::size_t below(std::size_t n) { return n ? static_cast<std::size_t>(next() % n) : 0; }
};

// Runs cases and keeps the outcome: how many read, how many were refused, the failures (with
// the case's name), the slowest case and the largest allocation relative to the input.
struct Harness {
    // A case that runs this long is hung in all but name: the largest input is a few hundred KB.
    static constexpr double max_seconds = 10.0;
    // Reading may convert 1-byte elements to 8-byte doubles and keep a copy of the input: a few
    // times the input, plus fixed buffers. A header field trusted before the size check asks for
    // gigabytes.
    static constexpr std::size_t allocation_factor = 16, allocation_slack = std::size_t(1) << 20;

    int reads = 0, refusals = 0;
    std::vector<std::string> failures;
    double slowest = 0;
    std::string slowest_case;

    // `body` returns normally for a correct read (it checks what it read and throws
    // std::logic_error when that is wrong) or throws `Expected`.
    template <class Expected>
    void run(const std::string& name, std::size_t input_size, const std::function<void()>& body) {
        largest_allocation.store(0);
        const auto start = std::chrono::steady_clock::now();
        try {
            body();
            ++reads;
        } catch (const Expected&) {
            ++refusals;
        } catch (const std::exception& e) {
            fail(name, std::string("escaped: ") + e.what());
        } catch (...) {
            fail(name, "escaped: a non-standard exception");
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (s > slowest) {
            slowest = s;
            slowest_case = name;
        }
        if (s > max_seconds) fail(name, "took " + std::to_string(s) + " s");
        const std::size_t bound = allocation_factor * input_size + allocation_slack;
        if (largest_allocation.load() > bound)
            fail(name, "allocated " + std::to_string(largest_allocation.load()) + " bytes at once for a " +
                           std::to_string(input_size) + "-byte input");
    }
    void fail(const std::string& name, const std::string& what) {
        if (failures.size() < 20) failures.push_back(name + ": " + strata::io::clipped(what, 400));
        else if (failures.size() == 20) failures.push_back("...");
    }
    void report(const char* parser, int at_least) {
        MESSAGE(std::string(parser), ": ", reads + refusals, " cases, ", reads, " read, ", refusals, " refused; slowest ",
                slowest * 1000, " ms (", slowest_case, ")");
        for (const auto& f : failures) FAIL_CHECK(f);
        CHECK(failures.empty());
        CHECK(reads + refusals >= at_least);
        CHECK(reads > 0);     // the corpus reaches the success path,
        CHECK(refusals > 0);  // and the refusals
    }
};

[[noreturn]] void wrong(const std::string& what) { throw std::logic_error("wrong read: " + what); }

// ---------------------------------------------------------------------------------------------
// IDX
// ---------------------------------------------------------------------------------------------

// An independent decoder of the spec (LeCun's page): what a correct read must return.
struct IdxReference {
    bool valid = false;
    std::vector<std::size_t> dims;
    std::vector<double> values;
    bool is_float = false;
};

IdxReference idx_reference(const Bytes& b) {
    IdxReference r;
    if (b.size() < 4 || b[0] != 0 || b[1] != 0) return r;
    std::size_t size = 0;
    switch (b[2]) {
        case 0x08: case 0x09: size = 1; break;
        case 0x0B: size = 2; break;
        case 0x0C: case 0x0D: size = 4; break;
        case 0x0E: size = 8; break;
        default: return r;
    }
    const std::size_t rank = b[3];
    if (b.size() < 4 + 4 * rank) return r;
    // Exact arithmetic in 128 bits: no overflow question at all.
    unsigned __int128 count = 1;
    bool zero = false;
    for (std::size_t i = 0; i < rank; ++i) {
        const std::size_t d = (std::size_t(b[4 + 4 * i]) << 24) | (std::size_t(b[5 + 4 * i]) << 16) |
                              (std::size_t(b[6 + 4 * i]) << 8) | std::size_t(b[7 + 4 * i]);
        r.dims.push_back(d);
        if (d == 0) zero = true;
        if (!zero && count <= (unsigned __int128)(b.size())) count *= d;
    }
    if (zero) count = 0;
    if (count * size != (unsigned __int128)(b.size() - 4 - 4 * rank)) return r;
    const unsigned char* p = b.data() + 4 + 4 * rank;
    for (std::size_t i = 0; i < static_cast<std::size_t>(count); ++i, p += size) {
        std::uint64_t u = 0;
        for (std::size_t k = 0; k < size; ++k) u = (u << 8) | p[k];
        double v = 0;
        switch (b[2]) {
            case 0x08: v = double(std::uint8_t(u)); break;
            case 0x09: v = double(std::int8_t(std::uint8_t(u))); break;
            case 0x0B: v = double(std::int16_t(std::uint16_t(u))); break;
            case 0x0C: v = double(std::int32_t(std::uint32_t(u))); break;
            case 0x0D: { std::uint32_t w = std::uint32_t(u); float f; std::memcpy(&f, &w, 4); v = double(f); break; }
            case 0x0E: std::memcpy(&v, &u, 8); break;
        }
        r.values.push_back(v);
    }
    r.is_float = b[2] == 0x0D || b[2] == 0x0E;
    r.valid = true;
    return r;
}

bool same_value(double a, double b) { return a == b || (a != a && b != b); }

void write_file(const fs::path& p, const Bytes& b) {
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, b.data(), b.size()) == static_cast<::ssize_t>(b.size()));
    ::close(fd);
}

// A refusal of a file the reference reads is as wrong as reading one it refuses.
template <class F>
void read_or_refuse(bool valid, F&& read) {
    try {
        read();
    } catch (const strata::IoError& e) {
        if (valid) wrong(std::string("refused a valid file: ") + e.what());
        throw;
    }
    if (!valid) wrong("accepted an invalid file");
}

// Reads `b` every way the IDX API offers and checks each outcome against the reference.
void idx_case(Harness& h, const fs::path& file, const std::string& name, const Bytes& b) {
    write_file(file, b);
    const IdxReference ref = idx_reference(b);
    h.run<strata::IoError>(name + " [header]", b.size(), [&] {
        read_or_refuse(ref.valid, [&] {
            const auto hd = strata::io::read_idx_header(file);
            if (hd.dims != ref.dims || hd.element_count() != ref.values.size()) wrong("header differs from the reference");
        });
    });
    h.run<strata::IoError>(name + " [double]", b.size(), [&] {
        read_or_refuse(ref.valid, [&] {
            const auto a = strata::io::read_idx<double>(file);
            if (a.dims != ref.dims || a.data.size() != ref.values.size()) wrong("dims or size differ from the reference");
            for (std::size_t i = 0; i < a.data.size(); ++i)
                if (!same_value(a.data[i], ref.values[i])) wrong("element " + std::to_string(i) + " differs");
        });
    });
    // Every integer type of IDX fits int32: a refusal can only be the float types' IoError.
    h.run<strata::IoError>(name + " [int32]", b.size(), [&] {
        read_or_refuse(ref.valid && !ref.is_float, [&] {
            const auto a = strata::io::read_idx<std::int32_t>(file);
            for (std::size_t i = 0; i < a.data.size(); ++i)
                if (double(a.data[i]) != ref.values[i]) wrong("element " + std::to_string(i) + " differs");
        });
    });
}

template <class T>
Bytes idx_seed(const fs::path& dir, const std::vector<std::size_t>& dims, const std::vector<T>& data) {
    const auto p = dir / "seed";
    strata::io::write_idx<T>(p, dims, data);
    std::ifstream f(p, std::ios::binary);
    return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void put_be32(Bytes& b, std::size_t at, std::uint32_t v) {
    for (int k = 0; k < 4; ++k) b[at + std::size_t(k)] = static_cast<unsigned char>(v >> (24 - 8 * k));
}

// ---------------------------------------------------------------------------------------------
// safetensors
// ---------------------------------------------------------------------------------------------

Bytes to_bytes(const std::vector<std::byte>& v) {
    Bytes b(v.size());
    if (!v.empty()) std::memcpy(b.data(), v.data(), v.size());
    return b;
}

std::uint64_t header_length(const Bytes& f) {
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | f[std::size_t(i)];
    return n;
}

void set_header_length(Bytes& f, std::uint64_t n) {
    for (int i = 0; i < 8; ++i) f[std::size_t(i)] = static_cast<unsigned char>(n >> (8 * i));
}

Bytes st_file(const std::string& header, std::size_t data_bytes, unsigned char fill = 0x3C) {
    Bytes f(8 + header.size() + data_bytes, fill);
    set_header_length(f, header.size());
    std::memcpy(f.data() + 8, header.data(), header.size());
    return f;
}

// What a correct read must satisfy, checked against the raw input: the tensors tile the data
// buffer in order, each one's bytes are exactly its slice of the file, its byte size matches
// dtype and shape; and the content survives a write and a second read unchanged.
void check_safetensors_read(const strata::io::SafetensorsFile& f, const Bytes& input) {
    using namespace strata::io;
    const std::uint64_t n = header_length(input);
    const std::size_t data_at = static_cast<std::size_t>(8 + n);
    std::uint64_t at = 0;
    SafetensorsWriter w;
    for (const auto& t : f.tensors()) {
        if (t.begin != at) wrong("tensors do not tile the buffer at " + t.name);
        std::uint64_t numel = 1;
        for (auto d : t.shape) numel *= d;
        if (numel * dtype_size(t.dtype) != t.end - t.begin) wrong("size of " + t.name);
        const auto bytes = f.bytes(t.name);
        if (bytes.size() != t.end - t.begin ||
            (bytes.size() && std::memcmp(bytes.data(), input.data() + data_at + t.begin, bytes.size()) != 0))
            wrong("bytes of " + t.name);
        at = t.end;
        w.add_bytes(t.name, t.dtype, t.shape, bytes);
    }
    if (data_at + at != input.size()) wrong("the tensors do not cover the data buffer");
    for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
    const auto again = SafetensorsFile::parse(w.serialize());
    // The writer orders tensors its own way (by element size, then name): compare as sets.
    auto sorted = [](std::vector<std::string> v) {
        std::sort(v.begin(), v.end());
        return v;
    };
    if (sorted(again.names()) != sorted(f.names()) || again.metadata() != f.metadata())
        wrong("names or metadata change in a round trip");
    for (const auto& t : f.tensors())
        if (again.shape(t.name) != t.shape || again.dtype(t.name) != t.dtype) wrong("a round trip changes " + t.name);
}

void st_case(Harness& h, const std::string& name, const Bytes& b) {
    h.run<strata::CheckpointError>(name, b.size(), [&] {
        std::vector<std::byte> copy(b.size());
        if (!b.empty()) std::memcpy(copy.data(), b.data(), b.size());
        const auto f = strata::io::SafetensorsFile::parse(std::move(copy), "fuzz");
        check_safetensors_read(f, b);
    });
}

// The header text of a file (without the length prefix), and the file rebuilt around a new one.
std::string header_of(const Bytes& f) {
    return std::string(reinterpret_cast<const char*>(f.data()) + 8, static_cast<std::size_t>(header_length(f)));
}
Bytes with_header(const Bytes& f, const std::string& header) {
    const std::size_t data_at = static_cast<std::size_t>(8 + header_length(f));
    Bytes out = st_file(header, 0);
    out.insert(out.end(), f.begin() + static_cast<std::ptrdiff_t>(data_at), f.end());
    return out;
}

strata::io::SafetensorsWriter st_sample() {
    strata::io::SafetensorsWriter w;
    w.add("weights/f32", {2, 3}, std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f});
    w.add("weights/f64", {3}, std::vector<double>{0.1, -2.5, 1e300});
    w.add("counts/i32", {2, 2}, std::vector<std::int32_t>{-7, -1, 0, 7});
    w.add("step", {}, std::vector<std::int64_t>{1234567890123});
    w.add("empty", {0, 5}, std::vector<float>{});
    w.add("bytes", {3}, std::vector<std::uint8_t>{0, 1, 255});
    w.set_metadata("format", "strata-test");
    w.set_metadata("unicode", "\xc3\xa9\xe2\x9c\x93 \"quoted\"\n");
    return w;
}

}  // namespace

TEST_CASE("fuzz corpus: IDX mutants end in a correct read or an IoError") {
    TempDir dir("strata_fuzz_idx");
    const auto file = dir / "case";
    using strata::io::idx_type_of;
    std::vector<std::pair<std::string, Bytes>> seeds = {
        {"ubyte 2x3", idx_seed<std::uint8_t>(dir.path, {2, 3}, {0, 1, 2, 127, 128, 255})},
        {"sbyte 5", idx_seed<std::int8_t>(dir.path, {5}, {-128, -1, 0, 1, 127})},
        {"short 2x2", idx_seed<std::int16_t>(dir.path, {2, 2}, {-32768, -1, 1, 32767})},
        {"int 3", idx_seed<std::int32_t>(dir.path, {3}, {-2147483647 - 1, 0, 2147483647})},
        {"float 2x1x2", idx_seed<float>(dir.path, {2, 1, 2}, {-1.5f, 0.0f, 3.25f, 1e30f})},
        {"double 2", idx_seed<double>(dir.path, {2}, {0.1, -1e300})},
        {"scalar", idx_seed<std::uint8_t>(dir.path, {}, {42})},
        {"empty 0x5", idx_seed<float>(dir.path, {0, 5}, {})},
    };
    Harness h;
    Rng rng{0x1D5};
    for (const auto& [seed_name, seed] : seeds) {
        const std::size_t header = 4 + 4 * std::size_t(seed[3]);
        idx_case(h, file, seed_name, seed);
        // Truncation at every length, and trailing bytes.
        for (std::size_t len = 0; len < seed.size(); ++len)
            idx_case(h, file, seed_name + " cut to " + std::to_string(len), Bytes(seed.begin(), seed.begin() + std::ptrdiff_t(len)));
        for (std::size_t extra : {1u, 3u, 8u}) {
            Bytes b = seed;
            b.insert(b.end(), extra, 0xAB);
            idx_case(h, file, seed_name + " +" + std::to_string(extra) + " bytes", b);
        }
        // Every bit of the header, and a few of the data (which must read as the reference says).
        for (std::size_t i = 0; i < seed.size(); ++i) {
            if (i >= header && rng.below(4) != 0) continue;
            for (int bit = 0; bit < 8; ++bit) {
                Bytes b = seed;
                b[i] ^= static_cast<unsigned char>(1u << bit);
                idx_case(h, file, seed_name + " bit " + std::to_string(i * 8 + std::size_t(bit)), b);
            }
        }
        // Every type code and every rank.
        for (int v = 0; v < 256; ++v) {
            Bytes b = seed;
            b[2] = static_cast<unsigned char>(v);
            idx_case(h, file, seed_name + " type " + std::to_string(v), b);
            b = seed;
            b[3] = static_cast<unsigned char>(v);
            idx_case(h, file, seed_name + " rank " + std::to_string(v), b);
        }
        // Each dimension at its extremes.
        for (std::size_t d = 0; d < seed[3]; ++d)
            for (std::uint32_t v : {0u, 1u, 2u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFEu, 0xFFFFFFFFu}) {
                Bytes b = seed;
                put_be32(b, 4 + 4 * d, v);
                idx_case(h, file, seed_name + " dim " + std::to_string(d) + " = " + std::to_string(v), b);
            }
    }
    // Headers at the extremes: rank 255 with every dimension huge, or one of them zero (a valid
    // empty array), and the largest rank with nothing after the magic.
    for (unsigned char type : {0x08, 0x0E}) {
        Bytes b = {0, 0, type, 255};
        b.resize(4 + 4 * 255, 0xFF);
        idx_case(h, file, "rank 255 all huge", b);
        put_be32(b, 4 + 4 * 200, 0);
        idx_case(h, file, "rank 255 huge with a zero", b);
        idx_case(h, file, "rank 255 without dims", Bytes{0, 0, type, 255});
    }
    // Seeded random edits of several bytes at once.
    for (int i = 0; i < 1500; ++i) {
        const auto& [seed_name, seed] = seeds[rng.below(seeds.size())];
        Bytes b = seed;
        for (std::size_t k = 0, edits = 1 + rng.below(4); k < edits && !b.empty(); ++k) {
            const std::size_t at = rng.below(std::min<std::size_t>(b.size(), 24));
            switch (rng.below(4)) {
                case 0: b[at] = static_cast<unsigned char>(rng.next()); break;
                case 1: b[at] = std::array<unsigned char, 6>{0, 1, 0x7F, 0x80, 0xFE, 0xFF}[rng.below(6)]; break;
                case 2: b.erase(b.begin() + std::ptrdiff_t(at)); break;
                default: b.insert(b.begin() + std::ptrdiff_t(at), static_cast<unsigned char>(rng.next())); break;
            }
        }
        idx_case(h, file, seed_name + " random " + std::to_string(i), b);
    }
    h.report("IDX", 15000);
}

TEST_CASE("fuzz corpus: safetensors mutants end in a correct read or a CheckpointError") {
    using strata::io::SafetensorsWriter;
    strata::io::SafetensorsWriter meta_only;
    meta_only.set_metadata("format", "strata-checkpoint");
    std::vector<std::pair<std::string, Bytes>> seeds = {
        {"sample", to_bytes(st_sample().serialize())},
        {"empty", to_bytes(SafetensorsWriter().serialize())},
        {"metadata only", to_bytes(meta_only.serialize())},
    };
    Harness h;
    Rng rng{0x5AFE};
    for (const auto& [seed_name, seed] : seeds) {
        const std::string header = header_of(seed);
        st_case(h, seed_name, seed);
        // Truncation of the file at every length (the length prefix then lies), and of the
        // header text at every length with the prefix telling the truth.
        for (std::size_t len = 0; len < seed.size(); ++len)
            st_case(h, seed_name + " cut to " + std::to_string(len), Bytes(seed.begin(), seed.begin() + std::ptrdiff_t(len)));
        for (std::size_t len = 0; len < header.size(); ++len)
            st_case(h, seed_name + " header cut to " + std::to_string(len), with_header(seed, header.substr(0, len)));
        // Every bit of the length prefix and the header.
        for (std::size_t i = 0; i < 8 + header.size(); ++i)
            for (int bit = 0; bit < 8; ++bit) {
                Bytes b = seed;
                b[i] ^= static_cast<unsigned char>(1u << bit);
                st_case(h, seed_name + " bit " + std::to_string(i * 8 + std::size_t(bit)), b);
            }
        // Each header byte replaced by each JSON-significant or invalid byte.
        for (std::size_t i = 0; i < header.size(); ++i)
            for (char c : std::string("\"\\{}[],:0-e \x01\x7f\x80\xff", 16)) {
                std::string mangled = header;
                mangled[i] = c;
                st_case(h, seed_name + " byte " + std::to_string(i) + " = " + std::to_string(int(c)), with_header(seed, mangled));
            }
        // The length prefix at its extremes.
        const std::uint64_t n = header.size(), rest = seed.size() - 8;
        for (std::uint64_t v : {std::uint64_t(0), std::uint64_t(1), std::uint64_t(2), n - 1, n + 1, rest, rest + 1,
                                std::uint64_t(100'000'000), std::uint64_t(100'000'001), std::uint64_t(1) << 32,
                                std::uint64_t(1) << 63, ~std::uint64_t(0)}) {
            Bytes b = seed;
            set_header_length(b, v);
            st_case(h, seed_name + " length " + std::to_string(v), b);
        }
        // The data buffer one byte short or long.
        Bytes shorter(seed.begin(), seed.end() - (seed.size() > 8 + n ? 1 : 0));
        st_case(h, seed_name + " data short", shorter);
        Bytes longer = seed;
        longer.push_back(0);
        st_case(h, seed_name + " data long", longer);
    }

    // Mangled JSON, written by hand around a valid two-tensor header; each with data buffers of
    // several sizes (28 bytes is the right one for the unmangled offsets).
    const std::string a = R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
    const std::string b = R"("b":{"dtype":"U8","shape":[4],"data_offsets":[24,28]})";
    const std::string meta = R"("__metadata__":{"k":"v"})";
    auto tensor = [](const std::string& name, const std::string& dtype, const std::string& shape, const std::string& offsets) {
        return "\"" + name + "\":{\"dtype\":" + dtype + ",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
    };
    std::vector<std::string> headers = {
        "{" + meta + "," + a + "," + b + "}",
        "{" + a + "," + b + "}   \t\n\r",
        // duplicate keys, also spelled differently
        "{" + a + "," + a + "}",
        "{" + a + "," + b + "," + a + "}",
        "{" + meta + "," + meta + "," + a + "}",
        R"({"__metadata__":{"k":"v","k":"w"}})",
        R"({"__metadata__":{"k":"v","\u006b":"w"}})",
        "{" + a + ",\"\\u0061\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[24,28]}}",
        R"({"a":{"dtype":"F32","dtype":"F32","shape":[6],"data_offsets":[0,24]}})",
        // values of every kind where objects, strings and numbers belong
        R"({"a":null})", R"({"a":1})", R"({"a":"x"})", R"({"a":[]})", R"({"a":{}})", R"({"a":true})",
        R"({"__metadata__":null})", R"({"__metadata__":"x"})", R"({"__metadata__":{"k":1}})",
        R"({"__metadata__":{"k":{"x":"y"}}})", R"({"__metadata__":{"k":["v"]}})", R"({"__metadata__":{"k":null}})",
        "{" + tensor("a", "null", "[6]", "[0,24]") + "}", "{" + tensor("a", "32", "[6]", "[0,24]") + "}",
        "{" + tensor("a", "\"f32\"", "[6]", "[0,24]") + "}", "{" + tensor("a", "\"F32 \"", "[6]", "[0,24]") + "}",
        "{" + tensor("a", "\"\"", "[6]", "[0,24]") + "}", "{" + tensor("a", "\"BOOL\"", "[24]", "[0,24]") + "}",
        "{" + tensor("a", "\"F8_E4M3\"", "[4,6]", "[0,24]") + "}", "{" + tensor("a", "\"F32\"", "6", "[0,24]") + "}",
        "{" + tensor("a", "\"F32\"", "null", "[0,24]") + "}", "{" + tensor("a", "\"F32\"", "[6]", "null") + "}",
        R"({"a":{"dtype":"F32","shape":[6]}})", R"({"a":{"shape":[6],"data_offsets":[0,24]}})",
        R"({"a":{"dtype":"F32","shape":[6],"data_offsets":[0,24],"extra":0}})",
        // numbers at and past their limits
        "{" + tensor("a", "\"U8\"", "[18446744073709551615]", "[0,24]") + "}",
        "{" + tensor("a", "\"U8\"", "[18446744073709551616]", "[0,24]") + "}",
        "{" + tensor("a", "\"F64\"", "[4294967296,4294967296]", "[0,24]") + "}",
        "{" + tensor("a", "\"U8\"", "[2305843009213693952,8]", "[0,0]") + "}",
        "{" + tensor("a", "\"U8\"", "[0,18446744073709551615,18446744073709551615]", "[0,0]") + "}",
        "{" + tensor("a", "\"U8\"", "[1e400]", "[0,24]") + "}", "{" + tensor("a", "\"U8\"", "[-0]", "[0,0]") + "}",
        "{" + tensor("a", "\"U8\"", "[24.0]", "[0,24]") + "}", "{" + tensor("a", "\"U8\"", "[2.4e1]", "[0,24]") + "}",
        "{" + tensor("a", "\"U8\"", "[024]", "[0,24]") + "}", "{" + tensor("a", "\"U8\"", "[-24]", "[0,24]") + "}",
        "{" + tensor("a", "\"U8\"", "[" + std::string(5000, '9') + "]", "[0,24]") + "}",
        "{" + tensor("a", "\"U8\"", "[24]", "[0,18446744073709551615]") + "}",
        "{" + tensor("a", "\"U8\"", "[24]", "[18446744073709551615,0]") + "}",
        "{" + tensor("a", "\"U8\"", "[0]", "[18446744073709551615,18446744073709551615]") + "}",
        "{" + tensor("a", "\"U8\"", "[24]", "[0,18446744073709551616]") + "}",
        "{" + tensor("a", "\"U8\"", "[24]", "[-1,23]") + "}", "{" + tensor("a", "\"U8\"", "[24]", "[0]") + "}",
        "{" + tensor("a", "\"U8\"", "[24]", "[0,24,48]") + "}", "{" + tensor("a", "\"U8\"", "[24]", "[]") + "}",
        "{" + tensor("a", "\"U8\"", "[24]", "[\"0\",\"24\"]") + "}", "{" + tensor("a", "\"U8\"", "[24]", "[0.0,24]") + "}",
        // offsets overlapping, with gaps, past the end, out of order
        "{" + tensor("a", "\"U8\"", "[24]", "[0,24]") + "," + tensor("b", "\"U8\"", "[4]", "[20,24]") + "}",
        "{" + tensor("a", "\"U8\"", "[24]", "[0,24]") + "," + tensor("b", "\"U8\"", "[4]", "[26,30]") + "}",
        "{" + tensor("a", "\"U8\"", "[24]", "[0,24]") + "," + tensor("b", "\"U8\"", "[4]", "[0,4]") + "}",
        "{" + tensor("b", "\"U8\"", "[4]", "[24,28]") + "," + tensor("a", "\"U8\"", "[24]", "[0,24]") + "}",
        "{" + tensor("a", "\"U8\"", "[0]", "[0,0]") + "," + tensor("b", "\"U8\"", "[0]", "[0,0]") + "}",
        "{" + tensor("a", "\"U8\"", "[0]", "[5,5]") + "}",
        "{" + tensor("a", "\"U8\"", "[24]", "[0,24]") + "," + tensor("b", "\"U8\"", "[4]", "[24,28]") + "," +
            tensor("c", "\"U8\"", "[0]", "[28,28]") + "}",
        // bad escapes and strings
        R"({"a\x":1})", R"({"a\u12":1})", R"({"a\uZZZZ":1})", R"({"\ud800":1})", R"({"\udc00":1})",
        R"({"\ud800\u0041":1})", R"({"\ud800\n":1})", R"({"a\":1})", R"({"a)", "{\"a\x01\":1}", "{\"a\n\":1}",
        R"({"\u0000":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})",
        R"({"\ud83d\ude00":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})",
        "{\"\xc0\x80\":1}", "{\"\xed\xa0\x80\":1}", "{\"\xf5\x80\x80\x80\":1}", "{\"\xe2\x82\":1}", "{\"a\":1}\xe2",
        // syntax
        "", "{", "}", "{}", "{ }", " {}", "\xef\xbb\xbf{}", "[]", "{}x", "{}}", "{},", "{\"a\"}", "{\"a\":}", "{,}",
        "{\"a\":1,}", "{\"a\" 1}", "{'a':1}", "{a:1}", R"({"a":tru})", R"({"a":nul})", R"({"a":falsey})",
        R"({"a":-})", R"({"a":1.})", R"({"a":.5})", R"({"a":1e})", R"({"a":1e+})", R"({"a":01})", R"({"a":--1})",
        std::string("{}\0\0\0", 5), "{}\t\t", R"({"a":[1,2,]})", R"({"a":[,1]})", R"({"a":[1 2]})",
        std::string("{\"__metadata__\":{\"k\":\"v\"}}") + std::string(1000, ' '),
    };
    // Nesting around the depth limit and far past it (recursion must stop at the limit).
    for (std::size_t depth : {63u, 64u, 65u, 66u, 1000u, 100000u}) {
        headers.push_back("{\"a\":" + std::string(depth, '[') + std::string(depth, ']') + "}");
        headers.push_back("{\"__metadata__\":{\"k\":" + std::string(depth, '[') + "}}");
        std::string objects = "{\"a\":";
        for (std::size_t i = 0; i < depth; ++i) objects += "{\"a\":";
        headers.push_back(objects + "1" + std::string(depth + 1, '}'));
    }
    // Many keys, and a late duplicate among them.
    {
        std::string many = "{\"__metadata__\":{";
        for (int i = 0; i < 20000; ++i) many += "\"k" + std::to_string(i) + "\":\"v\",";
        headers.push_back(many + "\"end\":\"v\"}}");
        headers.push_back(many + "\"k12345\":\"v\"}}");
    }
    int json_cases = 0;
    for (const auto& header : headers)
        for (std::size_t data : {0u, 24u, 28u, 29u}) {
            st_case(h, "json #" + std::to_string(json_cases++) + " + " + std::to_string(data) + " data bytes", st_file(header, data));
        }

    // Seeded random edits of the sample's header, the length prefix kept true.
    const Bytes& sample = seeds[0].second;
    const std::string sample_header = header_of(sample);
    const std::string tokens[] = {"\"", "\\", "{", "}", "[", "]", ",", ":", "0", "-1", "1e999", "18446744073709551616",
                                  "null", "\"__metadata__\"", "\"dtype\"", "\"F32\"", "\\u0000", "\\ud800", "\xff", " "};
    for (int i = 0; i < 2500; ++i) {
        std::string m = sample_header;
        for (std::size_t k = 0, edits = 1 + rng.below(3); k < edits; ++k) {
            const std::size_t at = rng.below(m.size() + 1);
            switch (rng.below(4)) {
                case 0: if (at < m.size()) m[at] = static_cast<char>(rng.next()); break;
                case 1: m.insert(at, tokens[rng.below(std::size(tokens))]); break;
                case 2: m.erase(at, std::min<std::size_t>(1 + rng.below(8), m.size() - std::min(at, m.size()))); break;
                default: {  // duplicate a span somewhere else
                    const std::size_t from = rng.below(m.size()), len = 1 + rng.below(40);
                    m.insert(at, m.substr(from, len));
                }
            }
        }
        st_case(h, "random " + std::to_string(i), with_header(sample, m));
    }
    h.report("safetensors", 15000);
}

TEST_CASE("fuzz corpus: the checkpoint reader refuses mutants of a checkpoint with CheckpointError") {
    using namespace strata::train;
    using strata::io::SafetensorsWriter;
    TempDir dir("strata_fuzz_ckpt");
    SafetensorsWriter w;
    w.add("dense/kernel", {2, 2}, std::vector<float>{1, 2, 3, 4});
    w.add("dense/bias", {2}, std::vector<float>{5, 6});
    w.add("optimizer/m/dense/kernel", {2, 2}, std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f});
    w.add("optimizer/m/dense/bias", {2}, std::vector<float>{0.5f, 0.6f});
    w.set_metadata("format", "strata-checkpoint");
    w.set_metadata("format_version", "1");
    w.set_metadata("optimizer", "SGD");
    w.set_metadata("optimizer_iterations", "12");
    w.set_metadata("epoch", "2");
    w.set_metadata("step", "40");
    w.set_metadata("seed", "7");
    const Bytes seed = to_bytes(w.serialize());
    CheckpointSpec spec{.params = {{"dense/kernel", {2, 2}, 0}, {"dense/bias", {2}, 4}}, .num_params = 6,
                        .optimizer = "SGD", .slots = {"m"}};
    const auto path = dir / "ckpt.safetensors";
    Harness h;
    auto run = [&](const std::string& name, const Bytes& b) {
        write_file(path, b);
        h.run<strata::CheckpointError>(name, b.size(), [&] {
            const auto d = read_checkpoint<float>(path, spec);
            // A mutant that still reads must still be a checkpoint of this model.
            if (d.params.size() != 6 || d.slots.size() != 1 || d.slots[0].second.size() != 6) wrong("sizes");
        });
    };
    run("seed", seed);
    const std::string header = header_of(seed);
    for (std::size_t i = 0; i < 8 + header.size(); ++i)
        for (int bit = 0; bit < 8; ++bit) {
            Bytes b = seed;
            b[i] ^= static_cast<unsigned char>(1u << bit);
            run("bit " + std::to_string(i * 8 + std::size_t(bit)), b);
        }
    for (std::size_t len = 0; len < header.size(); len += 3) run("header cut to " + std::to_string(len), with_header(seed, header.substr(0, len)));
    h.report("checkpoint", 3000);
}
