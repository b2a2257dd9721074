// Tests of strata/train/checkpoint.hpp: the strict checkpoint reader, on files built by hand
// with SafetensorsWriter in the layout Model::save writes.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "strata/io/safetensors.hpp"
#include "strata/train/checkpoint.hpp"

namespace fs = std::filesystem;
using namespace strata::train;
using strata::io::SafetensorsWriter;
using strata_test::error_of;
using strata_test::has;
using strata_test::TempDir;

namespace {

// A model of two parameters, 8 values: dense/kernel {3, 2} at 0 and dense/bias {2} at 6.
CheckpointSpec spec(std::string optimizer = "Adam", std::vector<std::string> slots = {"m", "v"}) {
    CheckpointSpec s;
    s.params = {{"dense/kernel", {3, 2}, 0}, {"dense/bias", {2}, 6}};
    s.num_params = 8;
    s.optimizer = std::move(optimizer);
    s.slots = std::move(slots);
    return s;
}

// Value i of the flat buffer for slot `scale` (1 = the parameters, 10 = slot m, 100 = slot v).
template <class T>
std::vector<T> values(T scale, std::size_t first, std::size_t n) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = scale * T(first + i + 1) + T(0.25);
    return v;
}

// What Model::save writes for spec(): parameters, optimizer slots, metadata.
template <class T = float>
SafetensorsWriter checkpoint(const std::string& optimizer = "Adam", const std::vector<std::string>& slots = {"m", "v"}) {
    SafetensorsWriter w;
    w.add<T>("dense/kernel", {3, 2}, values<T>(1, 0, 6));
    w.add<T>("dense/bias", {2}, values<T>(1, 6, 2));
    T scale = 10;
    for (const auto& slot : slots) {
        w.add<T>("optimizer/" + slot + "/dense/kernel", {3, 2}, values<T>(scale, 0, 6));
        w.add<T>("optimizer/" + slot + "/dense/bias", {2}, values<T>(scale, 6, 2));
        scale *= 10;
    }
    if (!optimizer.empty()) {
        w.set_metadata("optimizer", optimizer);
        w.set_metadata("optimizer_iterations", "42");
    }
    w.set_metadata("format", "strata-checkpoint");
    w.set_metadata("format_version", "1");
    w.set_metadata("epoch", "3");
    w.set_metadata("step", "120");
    w.set_metadata("seed", "18446744073709551615");
    return w;
}

struct Fixture {
    TempDir dir{"strata_ckpt"};
    fs::path save(const SafetensorsWriter& w) const {
        const auto p = dir / "model.safetensors";
        w.save(p);
        return p;
    }
    template <class T = float>
    std::string error(const SafetensorsWriter& w, const CheckpointSpec& s) const {
        return error_of<strata::CheckpointError>([&] { read_checkpoint<T>(save(w), s); });
    }
};

}  // namespace

TEST_CASE("checkpoint: a complete checkpoint reads back every value and the metadata") {
    Fixture fx;
    const auto d = read_checkpoint<float>(fx.save(checkpoint()), spec());
    CHECK(d.params == values<float>(1, 0, 8));
    REQUIRE(d.slots.size() == 2);
    CHECK(d.slots[0].first == "m");
    CHECK(d.slots[0].second == values<float>(10, 0, 8));
    CHECK(d.slots[1].first == "v");
    CHECK(d.slots[1].second == values<float>(100, 0, 8));
    CHECK(d.optimizer_iterations == 42);
    CHECK(d.epoch == 3);
    CHECK(d.step == 120);
    CHECK(d.seed == std::numeric_limits<std::uint64_t>::max());
    CHECK(!d.learning_rate);

    // Slots come back in the spec's order, not the file's.
    const auto r = read_checkpoint<float>(fx.save(checkpoint()), spec("Adam", {"v", "m"}));
    CHECK(r.slots[0].first == "v");
    CHECK(r.slots[0].second == values<float>(100, 0, 8));

    // Parameters land at their offsets, whatever the order of the spec.
    auto s = spec();
    s.params = {{"dense/bias", {2}, 0}, {"dense/kernel", {3, 2}, 2}};
    const auto moved = read_checkpoint<float>(fx.save(checkpoint()), s);
    CHECK(moved.params[0] == values<float>(1, 6, 2)[0]);
    CHECK(moved.params[2] == values<float>(1, 0, 6)[0]);
}

TEST_CASE("checkpoint: F32 files load into double models and F64 files into float models") {
    Fixture fx;
    const auto d = read_checkpoint<double>(fx.save(checkpoint<float>()), spec());
    const auto f32 = values<float>(1, 0, 8);
    for (std::size_t i = 0; i < 8; ++i) CHECK(d.params[i] == double(f32[i]));
    const auto f = read_checkpoint<float>(fx.save(checkpoint<double>()), spec());
    const auto f64 = values<double>(100, 0, 8);
    for (std::size_t i = 0; i < 8; ++i) CHECK(f.slots[1].second[i] == float(f64[i]));
}

TEST_CASE("checkpoint: the learning rate is read when the file has it") {
    Fixture fx;
    auto w = checkpoint();
    w.set_metadata("learning_rate", "0.001");
    CHECK(read_checkpoint<float>(fx.save(w), spec()).learning_rate == 0.001);
    for (const char* bad : {"abc", "nan", "inf", "-0.5", " 0.1", "0.1x", ""}) {
        INFO(bad);
        w.set_metadata("learning_rate", bad);
        const auto m = fx.error(w, spec());
        CHECK(has(m, "metadata 'learning_rate': expected a finite number >= 0"));
        CHECK(has(m, std::string("found '") + bad + "'"));
    }
}

TEST_CASE("checkpoint: another file, format or version is refused before anything else") {
    Fixture fx;
    SafetensorsWriter plain;
    plain.add("x", {1}, std::vector<float>{1});
    auto m = fx.error(plain, spec());
    CHECK(has(m, "model.safetensors"));
    CHECK(has(m, "not a strata checkpoint: expected metadata format = 'strata-checkpoint', found none"));

    auto w = checkpoint();
    w.set_metadata("format", "keras");
    CHECK(has(fx.error(w, spec()), "found 'keras'"));

    w = checkpoint();
    w.set_metadata("format_version", "2");
    CHECK(has(fx.error(w, spec()), "checkpoint format version 2; this strata reads version 1"));
    w.set_metadata("format_version", "1.0");
    CHECK(has(fx.error(w, spec()), "metadata 'format_version': expected a decimal integer"));

    // Not even a safetensors file: the parser's CheckpointError.
    const auto p = fx.dir / "junk";
    { std::ofstream(p) << "not a checkpoint at all"; }
    CHECK_THROWS_AS(read_checkpoint<float>(p, spec()), strata::CheckpointError);
    CHECK_THROWS_AS(read_checkpoint<float>(fx.dir / "absent", spec()), strata::IoError);
}

TEST_CASE("checkpoint: missing tensors are all named, a few then how many more") {
    Fixture fx;
    SafetensorsWriter w;
    w.add("dense/bias", {2}, std::vector<float>(2));
    w.set_metadata("format", "strata-checkpoint");
    w.set_metadata("format_version", "1");
    w.set_metadata("optimizer", "Adam");
    auto m = fx.error(w, spec());
    CHECK(has(m, "missing parameter tensor 'dense/kernel'"));

    CheckpointSpec big;
    for (int i = 0; i < 8; ++i) big.params.push_back({"layer" + std::to_string(i) + "/kernel", {1}, i});
    big.num_params = 8;
    m = fx.error(w, big);
    CHECK(has(m, "8 missing parameter tensors 'layer0/kernel', 'layer1/kernel', 'layer2/kernel', 'layer3/kernel', "
                 "'layer4/kernel' and 3 more"));

    // A slot of the same optimizer that is missing.
    auto partial = checkpoint("Adam", {"m"});
    m = fx.error(partial, spec());
    CHECK(has(m, "2 missing optimizer slot tensors 'optimizer/v/dense/kernel', 'optimizer/v/dense/bias'"));
    // Not strict: another configuration of the optimizer; its state is left out.
    auto loose = spec();
    loose.strict = false;
    const auto d = read_checkpoint<float>(fx.save(partial), loose);
    CHECK(d.slots.empty());
    CHECK(!d.optimizer_iterations);
    CHECK(d.params == values<float>(1, 0, 8));
}

TEST_CASE("checkpoint: a tensor of another shape or dtype names both") {
    Fixture fx;
    SafetensorsWriter w = checkpoint("");
    auto s = spec("");
    s.params[0].dims = {2, 3};
    CHECK(has(fx.error(w, s), "tensor 'dense/kernel': the model expects shape [2, 3], the checkpoint holds [3, 2]"));

    SafetensorsWriter ints;
    ints.add("dense/kernel", {3, 2}, std::vector<std::int32_t>(6));
    ints.add("dense/bias", {2}, std::vector<float>(2));
    ints.set_metadata("format", "strata-checkpoint");
    ints.set_metadata("format_version", "1");
    CHECK(has(fx.error(ints, spec("")), "tensor 'dense/kernel': expected dtype F32 or F64, found I32"));

    // A slot tensor's shape is checked too.
    SafetensorsWriter slot = checkpoint("Adam", {"m"});
    slot.add("optimizer/v/dense/kernel", {6}, std::vector<float>(6));
    slot.add("optimizer/v/dense/bias", {2}, std::vector<float>(2));
    CHECK(has(fx.error(slot, spec()), "tensor 'optimizer/v/dense/kernel': the model expects shape [3, 2], the checkpoint holds [6]"));
}

TEST_CASE("checkpoint: unknown tensors are refused when strict and ignored when not") {
    Fixture fx;
    auto w = checkpoint();
    w.add("dense_1/kernel", {1}, std::vector<float>{1});
    auto m = fx.error(w, spec());
    CHECK(has(m, "the checkpoint holds 1 tensor the model does not have: 'dense_1/kernel'"));
    CHECK(has(m, "strict = false"));
    for (int i = 0; i < 7; ++i) w.add("extra" + std::to_string(i), {1}, std::vector<float>{1});
    m = fx.error(w, spec());
    CHECK(has(m, "holds 8 tensors the model does not have: "));
    CHECK(has(m, " and 3 more"));
    // A slot the compiled optimizer does not have is unknown too.
    auto slots = checkpoint("Adam", {"m", "v", "extra"});
    CHECK(has(fx.error(slots, spec()), "'optimizer/extra/dense/"));

    auto loose = spec();
    loose.strict = false;
    const auto d = read_checkpoint<float>(fx.save(w), loose);
    CHECK(d.params == values<float>(1, 0, 8));
    CHECK(d.slots.size() == 2);
}

TEST_CASE("checkpoint: another optimizer's state is refused when strict, left out when not") {
    Fixture fx;
    const auto path = fx.save(checkpoint("Adam", {"m", "v"}));
    auto rms = spec("RMSprop", {"velocity"});
    CHECK(has(error_of<strata::CheckpointError>([&] { read_checkpoint<float>(path, rms); }),
              "the checkpoint holds Adam state; the model is compiled with RMSprop"));
    rms.strict = false;
    const auto d = read_checkpoint<float>(path, rms);
    CHECK(d.slots.empty());
    CHECK(!d.optimizer_iterations);
    CHECK(d.params == values<float>(1, 0, 8));
    CHECK(d.epoch == 3);

    // A checkpoint saved before compile, into a compiled model.
    const auto weights_only = fx.save(checkpoint(""));
    CHECK(has(error_of<strata::CheckpointError>([&] { read_checkpoint<float>(weights_only, spec()); }),
              "the checkpoint holds no optimizer state (it was saved before compile); the model is compiled with Adam"));
    auto loose = spec();
    loose.strict = false;
    CHECK(read_checkpoint<float>(weights_only, loose).slots.empty());
}

TEST_CASE("checkpoint: an uncompiled model reads the weights and ignores the optimizer's state, strict or not") {
    Fixture fx;
    const auto d = read_checkpoint<float>(fx.save(checkpoint()), spec(""));
    CHECK(d.params == values<float>(1, 0, 8));
    CHECK(d.slots.empty());
    CHECK(!d.optimizer_iterations);
    CHECK(d.epoch == 3);
}

TEST_CASE("checkpoint: metadata integers are strict") {
    Fixture fx;
    struct Case {
        const char* key;
        const char* text;
        const char* range;
    };
    const Case cases[] = {
        {"epoch", "-1", "[0, 2147483647]"},
        {"epoch", "7x", "[0, 2147483647]"},
        {"epoch", "1e3", "[0, 2147483647]"},
        {"epoch", " 3", "[0, 2147483647]"},
        {"epoch", "3 ", "[0, 2147483647]"},
        {"epoch", "+3", "[0, 2147483647]"},
        {"epoch", "", "[0, 2147483647]"},
        {"epoch", "2147483648", "[0, 2147483647]"},
        {"epoch", "99999999999999999999", "[0, 2147483647]"},
        {"step", "-1", "[0, 18446744073709551615]"},
        {"step", "18446744073709551616", "[0, 18446744073709551615]"},
        {"seed", "0x10", "[0, 18446744073709551615]"},
        {"optimizer_iterations", "-5", "[0, 9223372036854775807]"},
        {"optimizer_iterations", "9223372036854775808", "[0, 9223372036854775807]"},
    };
    for (const auto& c : cases) {
        INFO(c.key, " = '", c.text, "'");
        auto w = checkpoint();
        w.set_metadata(c.key, c.text);
        const auto m = fx.error(w, spec());
        CHECK(has(m, std::string("metadata '") + c.key + "': expected a decimal integer in " + c.range));
        CHECK(has(m, std::string("found '") + c.text + "'"));
    }
    // The dynamic loss scale (precision::MixedFloat16): a corrupt scale or count is refused, named.
    const Case scales[] = {{"loss_scale", "nan", "a finite number >= 0"},  {"loss_scale", "-2", "a finite number >= 0"},
                           {"loss_scale", "inf", "a finite number >= 0"},  {"loss_scale", "0", "a finite number > 0"},
                           {"loss_scale", "x", "a finite number >= 0"}};
    for (const auto& c : scales) {
        INFO(c.key, " = '", c.text, "'");
        auto w = checkpoint();
        w.set_metadata(c.key, c.text);
        const auto m = fx.error(w, spec());
        CHECK(has(m, std::string("metadata 'loss_scale': expected ") + c.range));
        CHECK(has(m, std::string("'") + c.text + "'"));
    }
    {
        auto w = checkpoint();
        w.set_metadata("loss_scale", "32768");
        w.set_metadata("loss_scale_skipped_steps", "-1");
        CHECK(has(fx.error(w, spec()), "metadata 'loss_scale_skipped_steps': expected a decimal integer in [0, 9223372036854775807]"));
        auto ok = checkpoint();
        ok.set_metadata("loss_scale", "1024");
        ok.set_metadata("loss_scale_good_steps", "7");
        ok.set_metadata("loss_scale_skipped_steps", "3");
        const auto d = read_checkpoint<float>(fx.save(ok), spec());
        CHECK(d.loss_scale == 1024.0);
        CHECK(d.loss_scale_good_steps == 7);
        CHECK(d.loss_scale_skipped_steps == 3);
    }
    // optimizer_iterations is not read (so not checked) when the optimizer state is not.
    auto w = checkpoint();
    w.set_metadata("optimizer_iterations", "junk");
    CHECK_NOTHROW(read_checkpoint<float>(fx.save(w), spec("")));
}

TEST_CASE("parse_metadata_int: digits only, in range") {
    CHECK(parse_metadata_int("k", "0", 0, 10) == 0);
    CHECK(parse_metadata_int("k", "10", 0, 10) == 10);
    CHECK(parse_metadata_int("k", "-7", -10, 10) == -7);
    CHECK(parse_metadata_int("k", "9223372036854775807", 0, std::numeric_limits<std::int64_t>::max()) ==
          std::numeric_limits<std::int64_t>::max());
    CHECK(parse_metadata_int("k", "-9223372036854775808", std::numeric_limits<std::int64_t>::min(), 0) ==
          std::numeric_limits<std::int64_t>::min());
    CHECK(parse_metadata_uint("seed", "18446744073709551615") == std::numeric_limits<std::uint64_t>::max());
    for (const char* bad : {"11", "-1", "-11", "1.0", "1,0", "\t1", "1\n", "١", "0x1", "-", "--1"}) {
        INFO(bad);
        const auto m = error_of<strata::CheckpointError>([&] { parse_metadata_int("k", bad, 0, 10); });
        CHECK(has(m, "metadata 'k': expected a decimal integer in [0, 10]"));
        CHECK(has(m, "no sign"));
    }
    CHECK(has(error_of<strata::CheckpointError>([] { parse_metadata_int("k", "-11", -10, 10); }), "[-10, 10] (digits only: no sign but '-'"));
    CHECK_THROWS_AS(parse_metadata_uint("seed", "18446744073709551616"), strata::CheckpointError);
    CHECK_THROWS_AS(parse_metadata_uint("seed", "-0"), strata::CheckpointError);
}

TEST_CASE("checkpoint: an inconsistent spec is the caller's ValueError") {
    Fixture fx;
    const auto path = fx.save(checkpoint());
    auto s = spec();
    s.num_params = 9;
    CHECK(has(error_of<strata::ValueError>([&] { read_checkpoint<float>(path, s); }), "hold 8 values, but num_params is 9"));
    s = spec();
    s.params[1].offset = 7;
    CHECK(has(error_of<strata::ValueError>([&] { read_checkpoint<float>(path, s); }), "does not fit the flat buffer of 8"));
    s = spec();
    s.params[1].name = "dense/kernel";
    s.params[1].dims = {3, 2};
    s.num_params = 12;
    CHECK(has(error_of<strata::ValueError>([&] { read_checkpoint<float>(path, s); }), "listed twice"));
}
