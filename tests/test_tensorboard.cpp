// TensorBoard event files (strata/io/tensorboard.hpp) and the callback
// (strata/train/tensorboard.hpp): CRC-32C, protobuf encoding, TFRecord
// framing, the callback's files and tags. An independent decoder (Python's protobuf) reads the
// files in tests/check_tensorboard.py.
#include <doctest/doctest.h>

#include <strata/io/tensorboard.hpp>
#include <strata/train/tensorboard.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace fs = std::filesystem;
namespace tb = strata::io::tensorboard;
using strata_test::TempDir;
using strata_test::error_of;
using strata_test::has;

namespace {

std::string bytes(std::initializer_list<int> b) {
    std::string s;
    for (int c : b) s += char(c);
    return s;
}

std::string read_binary(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

// The least a callback needs from a model.
struct FakeContext : strata::train::TrainingContext {
    double lr = 1e-5;
    double learning_rate() const override { return lr; }
    void set_learning_rate(double v) override { lr = v; }
    std::vector<double> weights_snapshot() const override { return {}; }
    void restore_weights(const std::vector<double>&) override {}
};

strata::train::Logs logs_of(std::initializer_list<std::pair<const char*, double>> figures) {
    strata::train::Logs l;
    for (const auto& [name, value] : figures) l.set(name, value);
    return l;
}

// Two epochs of four batches, figures as tests/check_tensorboard.py's SAMPLE_CALLBACK expects.
void run_sample_callback(strata::train::TensorBoard& cb) {
    FakeContext ctx;
    cb.on_train_begin(ctx);
    const double batch_loss[] = {1.1, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4};
    for (int epoch = 0; epoch < 2; ++epoch) {
        cb.on_epoch_begin(ctx, epoch);
        for (int b = 0; b < 4; ++b) cb.on_train_batch_end(ctx, b + 1, logs_of({{"loss", batch_loss[epoch * 4 + b]}}));
        const auto logs = epoch == 0 ? logs_of({{"loss", 0.9}, {"accuracy", 0.7}, {"val_loss", 0.6}, {"val_accuracy", 0.75}, {"lr", 1e-5}})
                                     : logs_of({{"loss", 0.5}, {"accuracy", 0.8}, {"val_loss", 0.55}, {"val_accuracy", 0.78}, {"lr", 5e-6}});
        cb.on_epoch_end(ctx, epoch, logs);
    }
    cb.on_train_end(ctx, {});
}

}  // namespace

TEST_CASE("crc32c: the CRC catalogue's check value and RFC 3720's vectors") {
    CHECK(tb::crc32c("123456789", 9) == 0xe3069283u);
    CHECK(tb::crc32c("", 0) == 0u);
    const std::string zeros(32, '\0'), ones(32, '\xff');
    CHECK(tb::crc32c(zeros.data(), 32) == 0x8a9136aau);
    CHECK(tb::crc32c(ones.data(), 32) == 0x62a8ab43u);
    const std::uint32_t c = tb::crc32c("123456789", 9);
    CHECK(tb::masked_crc32c("123456789", 9) == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_CASE("protobuf encoding: varints, fixed-width fields, an Event byte for byte") {
    std::string s;
    tb::proto::varint(s, 300);
    CHECK(s == bytes({0xac, 0x02}));
    s.clear();
    tb::proto::field_int64(s, 2, -1);  // ten bytes, as protobuf writes a negative int64
    CHECK(s == bytes({0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
    s.clear();
    tb::proto::field_int64(s, 2, 0);  // proto3: a zero is not written
    CHECK(s.empty());
    // Event{wall_time: 1.0, step: 1, summary{value{tag: "a", simple_value: 1.0}}}
    CHECK(tb::scalar_event(1.0, 1, {{"a", 1.0}}) ==
          bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x10, 0x01, 0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, 'a', 0x15, 0, 0, 0x80, 0x3f}));
    CHECK(has(error_of<strata::ValueError>([] { tb::scalar_event(1.0, 0, {{"", 1.0}}); }), "needs a tag"));
}

TEST_CASE("tf_record: length, masked CRC of the length, data, masked CRC of the data") {
    const std::string data = "hello";
    const std::string r = tb::tf_record(data);
    REQUIRE(r.size() == 8 + 4 + 5 + 4);
    CHECK(r.substr(0, 8) == bytes({5, 0, 0, 0, 0, 0, 0, 0}));
    auto u32 = [&](std::size_t at) {
        return std::uint32_t(std::uint8_t(r[at])) | std::uint32_t(std::uint8_t(r[at + 1])) << 8 |
               std::uint32_t(std::uint8_t(r[at + 2])) << 16 | std::uint32_t(std::uint8_t(r[at + 3])) << 24;
    };
    CHECK(u32(8) == tb::masked_crc32c(r.data(), 8));
    CHECK(r.substr(12, 5) == data);
    CHECK(u32(17) == tb::masked_crc32c(data.data(), 5));
}

TEST_CASE("EventFileWriter: named as TensorBoard expects, file version first, records appended and flushed") {
    TempDir dir;
    tb::EventFileWriter w(dir / "run");
    const std::string name = w.path().filename().string();
    CHECK(name.rfind("events.out.tfevents.", 0) == 0);
    CHECK(name.size() > 30);
    const auto first = read_binary(w.path());
    CHECK(first == tb::tf_record(first.substr(12, first.size() - 16)));  // one whole record
    CHECK(has(first, "brain.Event:2"));
    w.add_scalar("loss", 0.5, 3);
    CHECK(read_binary(w.path()).size() > first.size());  // flushed at once
    tb::EventFileWriter second(dir / "run");
    CHECK(second.path() != w.path());  // two writers in one second: two files
}

TEST_CASE("TensorBoard callback: train/ and validation/ as Keras writes them; errors name the path") {
    TempDir dir;
    strata::train::TensorBoard cb(dir / "logs", {.update_freq = 2});
    run_sample_callback(cb);
    REQUIRE(cb.files().size() == 2);
    CHECK(cb.files()[0].parent_path() == dir / "logs" / "train");
    CHECK(cb.files()[1].parent_path() == dir / "logs" / "validation");
    const auto train = read_binary(cb.files()[0]);
    CHECK(has(train, "epoch_loss"));
    CHECK(has(train, "epoch_lr"));
    CHECK(has(train, "batch_loss"));
    CHECK_FALSE(has(train, "val_"));
    const auto val = read_binary(cb.files()[1]);
    CHECK(has(val, "epoch_accuracy"));
    CHECK_FALSE(has(val, "epoch_lr"));

    CHECK(has(error_of<strata::ValueError>([] { strata::train::TensorBoard bad("x", {.update_freq = -1}); }), "got -1"));
    std::ofstream(dir / "file") << "not a directory";
    strata::train::TensorBoard blocked(dir / "file" / "logs");
    FakeContext ctx;
    const auto msg = error_of<strata::IoError>([&] { blocked.on_train_begin(ctx); });
    CHECK(has(msg, "cannot create the log directory"));
    CHECK(has(msg, "file/logs"));
}

// Written for tests/check_tensorboard.py (`--writer`); without STRATA_TENSORBOARD_SAMPLE it
// only writes the files.
TEST_CASE("tensorboard: python sample") {
    TempDir dir;
    const char* env = std::getenv("STRATA_TENSORBOARD_SAMPLE");
    const fs::path out = env ? fs::path(env) : dir.path;
    {
        tb::EventFileWriter w(out / "writer");
        w.add_scalar("loss", 1.5, 0);
        w.add_scalar("loss", 0.25, 1);
        w.add_scalar("loss", 1e-30, -3);
        w.add_scalar("weird tag/with spaces \xc3\xa9", -2.0, std::int64_t(1) << 40);
    }
    strata::train::TensorBoard cb(out / "callback", {.update_freq = 2});
    run_sample_callback(cb);
    CHECK(cb.files().size() == 2);
}
