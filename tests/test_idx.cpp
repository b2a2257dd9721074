// Tests of strata/io/idx.hpp (IDX round trips, byte layout, every kind of bad file) and
// strata/data/mnist.hpp (the MNIST loaders, on small generated files, and on the real files
// when data/mnist has them; the Fashion-MNIST loader on the files of Debian's
// dataset-fashion-mnist, which scripts/install-deps installs).
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "strata/data/mnist.hpp"
#include "strata/io/idx.hpp"

namespace fs = std::filesystem;
using namespace strata::io;
using strata::data::load_fashion_mnist;
using strata::data::load_mnist;
using strata::data::load_mnist_images;
using strata::data::load_mnist_labels;
using strata::data::MnistFormat;
using strata_test::error_of;
using strata_test::has;
using strata_test::TempDir;

namespace {


void write_bytes(const fs::path& p, const std::vector<unsigned char>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<unsigned char> read_bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}


}  // namespace

TEST_CASE("idx: round trip of every element type and several ranks") {
    TempDir dir;
    SUBCASE("ubyte rank 3") {
        std::vector<std::uint8_t> v(2 * 3 * 4);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint8_t>(i * 11);
        write_idx(dir / "a", {2, 3, 4}, v);
        const auto a = read_idx<std::uint8_t>(dir / "a");
        CHECK(a.dims == std::vector<std::size_t>{2, 3, 4});
        CHECK(a.data == v);
        CHECK(a.stored_type == IdxType::UInt8);
        CHECK(a.count() == 2);
        CHECK(a.row_size() == 12);
        CHECK(fs::file_size(dir / "a") == 4 + 3 * 4 + v.size());
    }
    SUBCASE("sbyte") {
        std::vector<std::int8_t> v{-128, -1, 0, 1, 127};
        write_idx(dir / "a", {5}, v);
        CHECK(read_idx<std::int8_t>(dir / "a").data == v);
    }
    SUBCASE("short rank 2") {
        std::vector<std::int16_t> v{-32768, -2, 0, 258, 32767, 7};
        write_idx(dir / "a", {3, 2}, v);
        const auto a = read_idx<std::int16_t>(dir / "a");
        CHECK(a.data == v);
        CHECK(a.stored_type == IdxType::Int16);
    }
    SUBCASE("int") {
        std::vector<std::int32_t> v{-2147483647 - 1, -1, 0, 65536, 2147483647};
        write_idx(dir / "a", {5}, v);
        CHECK(read_idx<std::int32_t>(dir / "a").data == v);
    }
    SUBCASE("float") {
        std::vector<float> v{-1.5f, 0.0f, 3.25e-7f, 1e30f};
        write_idx(dir / "a", {2, 1, 2}, v);
        CHECK(read_idx<float>(dir / "a").data == v);
    }
    SUBCASE("double") {
        std::vector<double> v{0.1, -2.0, 1e300};
        write_idx(dir / "a", {3}, v);
        CHECK(read_idx<double>(dir / "a").data == v);
    }
    SUBCASE("empty first dimension") {
        write_idx(dir / "a", {0, 28, 28}, std::vector<std::uint8_t>{});
        const auto a = read_idx<float>(dir / "a");
        CHECK(a.dims == std::vector<std::size_t>{0, 28, 28});
        CHECK(a.data.empty());
    }
    SUBCASE("a zero extent with huge others is a valid empty array") {
        // 0xFFFFFFFF^3 overflows 64 bits: the zero must be seen before the product is checked.
        for (std::size_t zero_at : {0u, 2u, 3u}) {
            std::vector<std::size_t> dims(4, 0xFFFFFFFFu);
            dims[zero_at] = 0;
            write_idx(dir / "a", dims, std::vector<double>{});
            const auto h = read_idx_header(dir / "a");
            CHECK(h.dims == dims);
            CHECK(h.element_count() == 0);
            const auto a = read_idx<double>(dir / "a");
            CHECK(a.dims == dims);
            CHECK(a.data.empty());
        }
        // The same header with one data byte too many is still refused.
        auto bytes = read_bytes(dir / "a");
        bytes.push_back(0);
        write_bytes(dir / "a", bytes);
        CHECK(has(error_of<strata::IoError>([&] { read_idx<double>(dir / "a"); }), "has trailing bytes"));
    }
}

TEST_CASE("idx: big-endian layout matches the spec byte for byte") {
    TempDir dir;
    write_idx(dir / "s", {2}, std::vector<std::int16_t>{0x0102, -2});
    CHECK(read_bytes(dir / "s") ==
          std::vector<unsigned char>{0, 0, 0x0B, 1, 0, 0, 0, 2, 0x01, 0x02, 0xFF, 0xFE});
    write_idx(dir / "f", {1}, std::vector<float>{1.0f});
    CHECK(read_bytes(dir / "f") == std::vector<unsigned char>{0, 0, 0x0D, 1, 0, 0, 0, 1, 0x3F, 0x80, 0, 0});

    // A file made by hand, not by write_idx: 2 x 2 ints, dims > 255 in the header's high bytes.
    write_bytes(dir / "h", {0, 0, 0x0C, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0x80, 0, 0, 0, 0, 0, 1, 0});
    const auto h = read_idx<std::int32_t>(dir / "h");
    CHECK(h.dims == std::vector<std::size_t>{1, 2});
    CHECK(h.data == std::vector<std::int32_t>{-2147483647 - 1, 256});
}

TEST_CASE("idx: conversions to other element types") {
    TempDir dir;
    write_idx(dir / "u8", {3}, std::vector<std::uint8_t>{0, 128, 255});
    CHECK(read_idx<double>(dir / "u8").data == std::vector<double>{0, 128, 255});
    CHECK(read_idx<std::int64_t>(dir / "u8").data == std::vector<std::int64_t>{0, 128, 255});

    write_idx(dir / "i16", {2}, std::vector<std::int16_t>{-1, 300});
    const auto msg = error_of<strata::ValueError>([&] { read_idx<std::uint8_t>(dir / "i16"); });
    CHECK(has(msg, "element 0 = -1"));
    CHECK(has(msg, "0 .. 255"));

    write_idx(dir / "f", {1}, std::vector<float>{2.0f});
    const auto m2 = error_of<strata::IoError>([&] { read_idx<std::int32_t>(dir / "f"); });
    CHECK(has(m2, "stores float elements"));
    CHECK(has(m2, "read it as float or double"));
}

TEST_CASE("idx: a missing file names the path and the OS's reason") {
    TempDir dir;
    const auto msg = error_of<strata::IoError>([&] { read_idx<float>(dir / "nope"); });
    CHECK(has(msg, (dir / "nope").string()));
    CHECK(has(msg, "No such file or directory"));

    write_bytes(dir / "x-idx1-ubyte.gz", {0x1f, 0x8b, 8, 0});
    const auto gz = error_of<strata::IoError>([&] { read_idx<float>(dir / "x-idx1-ubyte"); });
    CHECK(has(gz, "x-idx1-ubyte.gz' exists"));
    CHECK(has(gz, "gzip -dk"));

    CHECK(has(error_of<strata::IoError>([&] { read_idx<float>(dir.path); }), "is a directory"));
}

TEST_CASE("idx: wrong magic shows the bytes found") {
    TempDir dir;
    write_bytes(dir / "m", {0x01, 0x02, 0x08, 0x01, 0, 0, 0, 0});
    const auto msg = error_of<strata::IoError>([&] { read_idx<float>(dir / "m"); });
    CHECK(has(msg, "not an IDX file"));
    CHECK(has(msg, "expected magic bytes 00 00 <type> <rank>, found 01 02 08 01"));

    write_bytes(dir / "g", {0x1f, 0x8b, 0x08, 0x08, 1, 2, 3, 4});
    const auto g = error_of<strata::IoError>([&] { read_idx<float>(dir / "g"); });
    CHECK(has(g, "found 1f 8b 08 08"));
    CHECK(has(g, "gzip file"));
}

TEST_CASE("idx: unknown type code") {
    TempDir dir;
    write_bytes(dir / "t", {0, 0, 0x07, 1, 0, 0, 0, 1, 5});
    const auto msg = error_of<strata::IoError>([&] { read_idx<float>(dir / "t"); });
    CHECK(has(msg, "unknown IDX type code 0x07"));
    CHECK(has(msg, "0x08 (ubyte)"));
    CHECK(has(msg, "0x0e (double)"));
}

TEST_CASE("idx: truncated and oversized files give expected vs found sizes") {
    TempDir dir;
    SUBCASE("shorter than the magic number") {
        write_bytes(dir / "a", {0, 0});
        const auto msg = error_of<strata::IoError>([&] { read_idx<float>(dir / "a"); });
        CHECK(has(msg, "4-byte magic number"));
        CHECK(has(msg, "the file has 2 bytes"));
    }
    SUBCASE("header cut inside the dims") {
        write_bytes(dir / "a", {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0});
        const auto msg = error_of<strata::IoError>([&] { read_idx<float>(dir / "a"); });
        CHECK(has(msg, "truncated in its header"));
        CHECK(has(msg, "rank 3 needs a 16-byte header"));
        CHECK(has(msg, "file has 10 bytes"));
    }
    SUBCASE("data cut short") {
        std::vector<std::uint8_t> v(2 * 3 * 3, 7);
        write_idx(dir / "a", {2, 3, 3}, v);
        fs::resize_file(dir / "a", fs::file_size(dir / "a") - 5);
        const auto msg = error_of<strata::IoError>([&] { read_idx<float>(dir / "a"); });
        CHECK(has(msg, "is truncated"));
        CHECK(has(msg, "dims [2, 3, 3] of ubyte"));
        CHECK(has(msg, "need 18 data bytes"));
        CHECK(has(msg, "found 13 data bytes"));
        CHECK(has(msg, "file size 29"));
    }
    SUBCASE("shorts: size counts bytes per element") {
        write_idx(dir / "a", {4}, std::vector<std::int16_t>{1, 2, 3, 4});
        fs::resize_file(dir / "a", fs::file_size(dir / "a") - 1);
        const auto msg = error_of<strata::IoError>([&] { read_idx<std::int16_t>(dir / "a"); });
        CHECK(has(msg, "(2 bytes each) need 8 data bytes"));
        CHECK(has(msg, "found 7"));
    }
    SUBCASE("trailing bytes") {
        auto bytes = std::vector<unsigned char>{0, 0, 0x08, 1, 0, 0, 0, 2, 1, 2, 3};
        write_bytes(dir / "a", bytes);
        const auto msg = error_of<strata::IoError>([&] { read_idx_header(dir / "a"); });
        CHECK(has(msg, "has trailing bytes"));
        CHECK(has(msg, "need 2 data bytes"));
        CHECK(has(msg, "found 3"));
    }
    SUBCASE("dims describing an absurd size") {
        write_bytes(dir / "a", {0, 0, 0x0E, 3, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF});
        const auto msg = error_of<strata::IoError>([&] { read_idx<float>(dir / "a"); });
        CHECK(has(msg, "[4294967295, 4294967295, 4294967295]"));
    }
}

TEST_CASE("idx: write_idx checks its arguments") {
    TempDir dir;
    CHECK_THROWS_AS(write_idx(dir / "a", {2, 2}, std::vector<float>{1, 2, 3}), strata::ShapeError);
    CHECK(!fs::exists(dir / "a"));
    CHECK_THROWS_AS(write_idx(dir / "a", {std::size_t(1) << 32}, std::vector<float>{}), strata::ValueError);
    const auto msg = error_of<strata::IoError>([&] { write_idx(dir / "no/such/dir/a", {1}, std::vector<float>{1}); });
    CHECK(has(msg, "cannot create"));
    CHECK(has(msg, "No such file or directory"));
}

TEST_CASE("idx: MNIST loaders on small generated files") {
    TempDir dir;
    const MnistFormat small{.rows = 4, .cols = 5};
    std::vector<std::uint8_t> pixels(3 * 4 * 5);
    for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * 4 + 3);
    pixels[0] = 0;
    pixels[1] = 255;
    const std::vector<std::uint8_t> labels{7, 0, 9};
    write_idx(dir / "train-images-idx3-ubyte", {3, 4, 5}, pixels);
    write_idx(dir / "train-labels-idx1-ubyte", {3}, labels);
    write_idx(dir / "t10k-images-idx3-ubyte", {1, 4, 5}, std::vector<std::uint8_t>(20, 51));
    write_idx(dir / "t10k-labels-idx1-ubyte", {1}, std::vector<std::uint8_t>{4});

    const auto x = load_mnist_images(dir / "train-images-idx3-ubyte", small);
    CHECK(x.dims == std::vector<std::size_t>{3, 4, 5, 1});
    CHECK(x.data[0] == 0.0f);
    CHECK(x.data[1] == 1.0f);
    CHECK(x.data[2] == doctest::Approx(11.0 / 255));
    const auto y = load_mnist_labels(dir / "train-labels-idx1-ubyte", small);
    CHECK(y.data == std::vector<std::int32_t>{7, 0, 9});

    const auto m = load_mnist(dir.path, small);
    CHECK(m.train.size() == 3);
    CHECK(m.test.size() == 1);
    CHECK(m.test.images.data[5] == doctest::Approx(0.2));
    CHECK(m.test.labels.data == std::vector<std::int32_t>{4});

    SUBCASE("images and labels disagree") {
        write_idx(dir / "t10k-labels-idx1-ubyte", {2}, std::vector<std::uint8_t>{4, 5});
        const auto msg = error_of<strata::IoError>([&] { load_mnist(dir.path, small); });
        CHECK(has(msg, "has 1 images"));
        CHECK(has(msg, "has 2 labels"));
    }
    SUBCASE("a label file where images belong") {
        const auto msg = error_of<strata::IoError>([&] { load_mnist_images(dir / "train-labels-idx1-ubyte"); });
        CHECK(has(msg, "expected an image file of rank 3"));
        CHECK(has(msg, "found dims [3] (rank 1) of ubyte"));
        CHECK(has(error_of<strata::IoError>([&] { load_mnist_labels(dir / "train-images-idx3-ubyte"); }), "found dims [3, 4, 5] (rank 3)"));
    }
    SUBCASE("a missing file says how to fetch") {
        fs::remove(dir / "t10k-images-idx3-ubyte");
        const auto msg = error_of<strata::IoError>([&] { load_mnist(dir.path, small); });
        CHECK(has(msg, "t10k-images-idx3-ubyte' does not exist"));
        CHECK(has(msg, "scripts/fetch-mnist"));
        CHECK(has(msg, "from strata's source tree (the scripts are not installed)"));
        write_bytes(dir / "t10k-images-idx3-ubyte.gz", {0x1f, 0x8b});
        CHECK(has(error_of<strata::IoError>([&] { load_mnist(dir.path, small); }), "gzip -dk"));
    }
}

namespace {

// The four MNIST files in `dir`: `n` training and `n` test images of rows x cols, and labels.
void write_mnist(const fs::path& dir, std::size_t n, std::size_t rows, std::size_t cols,
                 const std::vector<std::uint8_t>& train_labels, const std::vector<std::uint8_t>& test_labels) {
    const std::vector<std::uint8_t> pixels(n * rows * cols, 128);
    write_idx(dir / "train-images-idx3-ubyte", {n, rows, cols}, pixels);
    write_idx(dir / "t10k-images-idx3-ubyte", {n, rows, cols}, pixels);
    write_idx(dir / "train-labels-idx1-ubyte", {train_labels.size()}, train_labels);
    write_idx(dir / "t10k-labels-idx1-ubyte", {test_labels.size()}, test_labels);
}

}  // namespace

TEST_CASE("idx: MNIST images of another size than the model's 28x28 are refused, naming both sizes") {
    TempDir dir;
    const std::vector<std::uint8_t> labels{1, 2};
    SUBCASE("28x28 loads") {
        write_mnist(dir.path, 2, 28, 28, labels, labels);
        const auto m = load_mnist(dir.path);
        CHECK(m.train.images.dims == std::vector<std::size_t>{2, 28, 28, 1});
        CHECK(m.test.size() == 2);
    }
    SUBCASE("32x32") {
        write_mnist(dir.path, 2, 32, 32, labels, labels);
        const auto msg = error_of<strata::IoError>([&] { load_mnist(dir.path); });
        CHECK(has(msg, "train-images-idx3-ubyte'"));
        CHECK(has(msg, "images are 32x32, the model expects 28x28"));
        CHECK(has(error_of<strata::IoError>([&] { load_mnist_images(dir / "t10k-images-idx3-ubyte"); }),
                  "t10k-images-idx3-ubyte': images are 32x32"));
    }
    SUBCASE("14x56 has 784 pixels but is not 28x28") {
        write_mnist(dir.path, 2, 14, 56, labels, labels);
        const auto msg = error_of<strata::IoError>([&] { load_mnist(dir.path); });
        CHECK(has(msg, "images are 14x56, the model expects 28x28"));
        CHECK(has(msg, "as many pixels, but another shape"));
    }
    SUBCASE("another size is read when the format says so") {
        write_mnist(dir.path, 2, 14, 56, labels, labels);
        CHECK(load_mnist(dir.path, {.rows = 14, .cols = 56}).train.images.dims == std::vector<std::size_t>{2, 14, 56, 1});
    }
}

TEST_CASE("idx: MNIST labels outside [0, 9] are refused at load time, naming the file and the first bad index") {
    TempDir dir;
    SUBCASE("a bad test label: found before any training") {
        write_mnist(dir.path, 5, 28, 28, {0, 1, 2, 3, 9}, {4, 5, 10, 6, 255});
        const auto msg = error_of<strata::IoError>([&] { load_mnist(dir.path); });
        CHECK(has(msg, "t10k-labels-idx1-ubyte'"));
        CHECK(has(msg, "the label at index 2 is 10, expected a class in [0, 9] (10 classes)"));
        CHECK(has(msg, "out of range: 2 of the 5 labels"));
    }
    SUBCASE("a bad training label") {
        write_mnist(dir.path, 2, 28, 28, {200, 1}, {0, 1});
        const auto msg = error_of<strata::IoError>([&] { load_mnist_labels(dir / "train-labels-idx1-ubyte"); });
        CHECK(has(msg, "train-labels-idx1-ubyte': the label at index 0 is 200"));
    }
    SUBCASE("more classes when the format says so; a format without classes is refused") {
        write_mnist(dir.path, 2, 28, 28, {0, 26}, {26, 1});
        CHECK(has(error_of<strata::IoError>([&] { load_mnist(dir.path); }), "the label at index 1 is 26"));
        CHECK(load_mnist(dir.path, {.num_classes = 27}).train.labels.data == std::vector<std::int32_t>{0, 26});
        CHECK(has(error_of<strata::ValueError>([&] { load_mnist(dir.path, {.num_classes = 0}); }), "num_classes >= 1"));
    }
}

TEST_CASE("idx: the real MNIST files, when fetched") {
    // STRATA_MNIST_DIR (set by the build) or data/mnist under the working directory.
    const char* env = std::getenv("STRATA_MNIST_DIR");
    const fs::path dir = env ? fs::path(env) : fs::path("data/mnist");
    if (!fs::exists(dir / "train-images-idx3-ubyte")) {
        MESSAGE("skipped: no MNIST files in " << dir << " (run scripts/fetch-mnist " << dir.string() << ")");
        return;
    }
    const auto m = load_mnist(dir);
    REQUIRE(m.train.size() == 60000);
    REQUIRE(m.test.size() == 10000);
    CHECK(m.train.images.dims == std::vector<std::size_t>{60000, 28, 28, 1});
    CHECK(m.train.labels.data[0] == 5);
    CHECK(m.train.labels.data[1] == 0);
    CHECK(m.train.labels.data[2] == 4);
    CHECK(m.test.labels.data[0] == 7);
    // The class counts published with the data set.
    std::array<int, 10> train{}, test{};
    for (auto l : m.train.labels.data) ++train[static_cast<std::size_t>(l)];
    for (auto l : m.test.labels.data) ++test[static_cast<std::size_t>(l)];
    CHECK(train == std::array<int, 10>{5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949});
    CHECK(test == std::array<int, 10>{980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009});
    float lo = 1, hi = 0;
    for (float v : m.test.images.data) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    CHECK(lo == 0.0f);
    CHECK(hi == 1.0f);
}

// ---- Fashion-MNIST ------------------------------------------------------------------------

TEST_CASE("idx: load_fashion_mnist on small generated files; a missing file names the Fashion-MNIST script") {
    TempDir dir;
    const MnistFormat small{.rows = 2, .cols = 3};
    write_idx(dir / "train-images-idx3-ubyte", {2, 2, 3}, std::vector<std::uint8_t>(12, 255));
    write_idx(dir / "train-labels-idx1-ubyte", {2}, std::vector<std::uint8_t>{9, 0});
    write_idx(dir / "t10k-images-idx3-ubyte", {1, 2, 3}, std::vector<std::uint8_t>(6, 0));
    write_idx(dir / "t10k-labels-idx1-ubyte", {1}, std::vector<std::uint8_t>{3});
    const auto m = load_fashion_mnist(dir.path, small);
    CHECK(m.train.images.dims == std::vector<std::size_t>{2, 2, 3, 1});
    CHECK(m.train.images.data[0] == 1.0f);
    CHECK(m.train.labels.data == std::vector<std::int32_t>{9, 0});
    CHECK(m.test.labels.data == std::vector<std::int32_t>{3});
    // 28x28 by default, as for MNIST: these 2x3 images are refused, naming the file.
    CHECK(has(error_of<strata::IoError>([&] { load_fashion_mnist(dir.path); }), "images are 2x3, the model expects 28x28"));

    fs::remove(dir / "train-labels-idx1-ubyte");
    const auto msg = error_of<strata::IoError>([&] { load_fashion_mnist(dir.path, small); });
    CHECK(has(msg, "load_fashion_mnist: "));
    CHECK(has(msg, "train-labels-idx1-ubyte' does not exist"));
    CHECK(has(msg, "expected the four Fashion-MNIST files"));
    CHECK(has(msg, "run `scripts/fetch-fashion-mnist " + dir.path.string() + "`"));
    write_bytes(dir / "train-labels-idx1-ubyte.gz", {0x1f, 0x8b});
    const auto gz = error_of<strata::IoError>([&] { load_fashion_mnist(dir.path, small); });
    CHECK(has(gz, "gzip -dk"));
    CHECK(has(gz, "scripts/fetch-fashion-mnist"));
    // load_mnist's messages are unchanged.
    CHECK(has(error_of<strata::IoError>([&] { load_mnist(dir.path, small); }), "load_mnist: "));
}

TEST_CASE("idx: Fashion-MNIST class names, indexed by label") {
    const auto& names = strata::data::fashion_mnist_class_names;
    REQUIRE(names.size() == 10);
    CHECK(names[0] == "T-shirt/top");
    CHECK(names[1] == "Trouser");
    CHECK(names[2] == "Pullover");
    CHECK(names[3] == "Dress");
    CHECK(names[4] == "Coat");
    CHECK(names[5] == "Sandal");
    CHECK(names[6] == "Shirt");
    CHECK(names[7] == "Sneaker");
    CHECK(names[8] == "Bag");
    CHECK(names[9] == "Ankle boot");
}

namespace {

const char* const fashion_names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                      "t10k-labels-idx1-ubyte"};

bool has_fashion_files(const fs::path& dir) {
    std::error_code ec;
    for (const char* n : fashion_names)
        if (!fs::exists(dir / n, ec)) return false;
    return true;
}

// The directory of the real, uncompressed Fashion-MNIST files: STRATA_FASHION_MNIST_DIR (the
// build sets it to data/fashion_mnist of the source tree) when scripts/fetch-fashion-mnist has
// filled it, otherwise `tmp`, into which the .gz files of Debian's dataset-fashion-mnist
// (FASHION_MNIST_SRC, default /usr/share/datasets/fashion-mnist) are decompressed. Empty when
// neither is there; `where` then says what was looked for.
fs::path fashion_mnist_dir(const TempDir& tmp, std::string& where) {
    const char* env = std::getenv("STRATA_FASHION_MNIST_DIR");
    const fs::path fetched = env ? fs::path(env) : fs::path("data/fashion_mnist");
    if (has_fashion_files(fetched)) return fetched;
    const char* src_env = std::getenv("FASHION_MNIST_SRC");
    const fs::path src = src_env ? fs::path(src_env) : fs::path("/usr/share/datasets/fashion-mnist");
    where = fetched.string() + " (scripts/fetch-fashion-mnist) nor " + src.string() +
            "/*.gz (Debian's dataset-fashion-mnist: scripts/install-deps)";
    std::error_code ec;
    for (const char* n : fashion_names)
        if (!fs::exists(src / (std::string(n) + ".gz"), ec)) return {};
    for (const char* n : fashion_names) {
        const std::string cmd = "gzip -dc '" + (src / (std::string(n) + ".gz")).string() + "' > '" + (tmp / n).string() + "'";
        REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, cmd);
    }
    return tmp.path;
}

}  // namespace

TEST_CASE("idx: the real Fashion-MNIST files (from Debian's dataset-fashion-mnist, or fetched)") {
    TempDir tmp("strata_fashion");
    std::string where;
    const fs::path dir = fashion_mnist_dir(tmp, where);
    if (dir.empty()) {
        MESSAGE("skipped: no Fashion-MNIST files: neither " << where);
        return;
    }
    MESSAGE("Fashion-MNIST from " << dir);
    const auto m = load_fashion_mnist(dir);
    REQUIRE(m.train.size() == 60000);
    REQUIRE(m.test.size() == 10000);
    CHECK(m.train.images.dims == std::vector<std::size_t>{60000, 28, 28, 1});
    CHECK(m.test.images.dims == std::vector<std::size_t>{10000, 28, 28, 1});
    CHECK(m.train.labels.dims == std::vector<std::size_t>{60000});
    // Zalando's data set is balanced: 6000 training and 1000 test images of each class.
    std::array<int, 10> train{}, test{};
    for (auto l : m.train.labels.data) ++train[static_cast<std::size_t>(l)];
    for (auto l : m.test.labels.data) ++test[static_cast<std::size_t>(l)];
    std::array<int, 10> train6000{}, test1000{};
    train6000.fill(6000);
    test1000.fill(1000);
    CHECK(train == train6000);
    CHECK(test == test1000);
    // The first labels, and the pixel sums (of the first image and of every image, in units of
    // 1/255) that Python computed from the same files: the bytes themselves, not only the counts.
    CHECK(m.train.labels.data[0] == 9);  // Ankle boot
    CHECK(m.train.labels.data[3] == 3);  // Dress
    CHECK(m.test.labels.data[0] == 9);
    CHECK(m.test.labels.data[1] == 2);   // Pullover
    const auto pixel_sum = [](const std::vector<float>& v, std::size_t n) {
        std::uint64_t s = 0;
        for (std::size_t i = 0; i < n; ++i) s += static_cast<std::uint64_t>(std::lround(v[i] * 255.0f));
        return s;
    };
    CHECK(pixel_sum(m.train.images.data, 784) == 76247);
    CHECK(pixel_sum(m.test.images.data, 784) == 33456);
    CHECK(pixel_sum(m.train.images.data, m.train.images.data.size()) == 3431114169ull);
    CHECK(pixel_sum(m.test.images.data, m.test.images.data.size()) == 573469082ull);
    float lo = 1, hi = 0;
    for (float v : m.test.images.data) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    CHECK(lo == 0.0f);
    CHECK(hi == 1.0f);

    SUBCASE("a corrupted copy is refused, naming the file (negative control)") {
        TempDir bad("strata_fashion_bad");
        // The image files are links to the good ones; the training labels are a copy, damaged.
        for (const char* n : {"train-images-idx3-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"})
            fs::create_symlink(fs::absolute(dir / n), bad / n);
        auto bytes = read_bytes(dir / "train-labels-idx1-ubyte");
        REQUIRE(bytes.size() == 60008);
        bytes[8 + 1234] = 10;  // label 1234: one past the last class
        write_bytes(bad / "train-labels-idx1-ubyte", bytes);
        const auto msg = error_of<strata::IoError>([&] { load_fashion_mnist(bad.path); });
        CHECK(has(msg, (bad / "train-labels-idx1-ubyte").string()));
        CHECK(has(msg, "the label at index 1234 is 10, expected a class in [0, 9]"));
        // A truncated file: named, with what it should have held.
        bytes.resize(bytes.size() - 100);
        write_bytes(bad / "train-labels-idx1-ubyte", bytes);
        const auto cut = error_of<strata::IoError>([&] { load_fashion_mnist(bad.path); });
        CHECK(has(cut, (bad / "train-labels-idx1-ubyte").string()));
        CHECK(has(cut, "truncated"));
    }
}
