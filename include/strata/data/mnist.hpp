#pragma once
/// \file strata/data/mnist.hpp
/// MNIST loaders on top of strata/io/idx.hpp: the four standard files of a directory (load_mnist)
/// or one image file and one label file (load_mnist_split), checked against what the model
/// takes before any training starts: images of the expected size (28x28 unless told otherwise;
/// a 32x32 or a 14x56 file is refused, not reinterpreted) and labels that are class ids
/// (0..9 unless told otherwise). Every error names the file.
///
/// \code
///   auto mnist = strata::data::load_mnist("data/mnist");
///   auto train = strata::data::Dataset<>::from_arrays(mnist.train.images.data, {28, 28, 1},
///                                                     mnist.train.labels.data);
/// \endcode

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

#include "strata/core/error.hpp"
#include "strata/io/idx.hpp"
#include "strata/io/text.hpp"

namespace strata::data {

/// What the MNIST loaders expect of the files: the image size the model's input takes and the
/// number of classes its output has. The defaults are MNIST's (and `Input<28, 28, 1>` ...
/// `Dense<10, Softmax>`'s); set them for a look-alike data set (Fashion-MNIST needs none, EMNIST
/// letters `.num_classes = 27`).
struct MnistFormat {
    std::size_t rows = 28;  ///< image height in pixels
    std::size_t cols = 28;  ///< image width in pixels
    int num_classes = 10;   ///< labels must lie in [0, num_classes - 1]
};

/// Reads an MNIST-style image file (rank 3, ubyte: N x rows x cols) as floats scaled to [0, 1]
/// (pixel / 255), with dims {N, rows, cols, 1}: one channel, channels last, ready for a
/// `Input<28, 28, 1>` model.
///
/// Throws IoError for a malformed file, one that is not rank-3 ubyte, or images whose size is not
/// `format.rows` x `format.cols` (the message gives both sizes).
///
/// \code
///   auto x = strata::data::load_mnist_images("data/mnist/train-images-idx3-ubyte");
///   // x.dims == {60000, 28, 28, 1}, x.data.size() == 47040000
/// \endcode
inline io::IdxArray<float> load_mnist_images(const std::filesystem::path& path, const MnistFormat& format = {}) {
    const io::IdxHeader h = io::read_idx_header(path);
    if (h.type != io::IdxType::UInt8 || h.dims.size() != 3)
        throw_error<IoError>("load_mnist_images: ", io::in_quotes(path.string()),
                             ": expected an image file of rank 3 (N x rows x cols) with ubyte pixels, found dims ",
                             io::shape_text(h.dims), " (rank ", h.dims.size(), ") of ", io::idx_type_name(h.type));
    const std::size_t rows = h.dims[1], cols = h.dims[2];
    if (rows != format.rows || cols != format.cols)
        throw_error<IoError>("load_mnist_images: ", io::in_quotes(path.string()), ": images are ", rows, "x", cols,
                             ", the model expects ", format.rows, "x", format.cols,
                             rows * cols == format.rows * format.cols
                                 ? " (as many pixels, but another shape: the images would be read scrambled)"
                                 : "",
                             "; set MnistFormat's rows and cols for another image size");
    io::IdxArray<float> a = io::read_idx<float>(path);
    for (float& v : a.data) v /= 255.0f;
    a.dims.push_back(1);
    return a;
}

/// Reads an MNIST-style label file (rank 1, ubyte: N) as int32 class ids, dims {N}.
///
/// Throws IoError for a malformed file, one that is not rank-1 ubyte, or a label outside
/// [0, format.num_classes - 1] (naming the index of the first such label and how many there are).
inline io::IdxArray<std::int32_t> load_mnist_labels(const std::filesystem::path& path, const MnistFormat& format = {}) {
    STRATA_CHECK(format.num_classes >= 1, ValueError, "load_mnist_labels: expected MnistFormat::num_classes >= 1, found ",
                 format.num_classes);
    const io::IdxHeader h = io::read_idx_header(path);
    if (h.type != io::IdxType::UInt8 || h.dims.size() != 1)
        throw_error<IoError>("load_mnist_labels: ", io::in_quotes(path.string()),
                             ": expected a label file of rank 1 (N) with ubyte labels, found dims ", io::shape_text(h.dims),
                             " (rank ", h.dims.size(), ") of ", io::idx_type_name(h.type));
    io::IdxArray<std::int32_t> a = io::read_idx<std::int32_t>(path);
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < a.data.size(); ++i) {
        if (a.data[i] >= 0 && a.data[i] < format.num_classes) continue;
        if (bad++ == 0) first = i;
    }
    if (bad > 0)
        throw_error<IoError>("load_mnist_labels: ", io::in_quotes(path.string()), ": the label at index ", first, " is ",
                             a.data[first], ", expected a class in [0, ", format.num_classes - 1, "] (",
                             format.num_classes, " classes); out of range: ", bad, " of the ", a.data.size(), " labels");
    return a;
}

/// Images and labels of one MNIST split. Invariant: `images.count() == labels.count()`.
struct MnistSplit {
    io::IdxArray<float> images;         ///< dims {N, 28, 28, 1}, values in [0, 1]
    io::IdxArray<std::int32_t> labels;  ///< dims {N}, values 0..9 for MNIST

    /// Number of examples.
    std::size_t size() const noexcept { return labels.count(); }
};

/// Loads an image file and its label file, checks each against `format` (see load_mnist_images
/// and load_mnist_labels) and that they hold the same number of examples (IoError naming both
/// files and both counts otherwise).
inline MnistSplit load_mnist_split(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                                   const MnistFormat& format = {}) {
    MnistSplit s{load_mnist_images(images_path, format), load_mnist_labels(labels_path, format)};
    if (s.images.count() != s.labels.count())
        throw_error<IoError>("load_mnist_split: ", io::in_quotes(images_path.string()), " has ", s.images.count(),
                             " images but ", io::in_quotes(labels_path.string()), " has ", s.labels.count(),
                             " labels; expected the same count");
    return s;
}

/// Both MNIST splits: 60000 training and 10000 test examples for the original files.
struct Mnist {
    MnistSplit train;  ///< from train-images-idx3-ubyte and train-labels-idx1-ubyte
    MnistSplit test;   ///< from t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte
};

/// Loads the four standard, uncompressed MNIST files from `dir`:
/// `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`,
/// `t10k-labels-idx1-ubyte` (what `scripts/fetch-mnist DIR` puts there), each checked against
/// `format` (28x28 images, labels 0..9 by default) before anything is trained on them.
///
/// Throws IoError when a file is missing (the message says to run `scripts/fetch-mnist DIR`, or
/// to decompress when only the `.gz` is there), malformed, of another image size or with a label
/// out of range, or when images and labels disagree.
///
/// \code
///   auto mnist = strata::data::load_mnist("data/mnist");
///   // mnist.train.size() == 60000, mnist.test.size() == 10000
/// \endcode
inline Mnist load_mnist(const std::filesystem::path& dir, const MnistFormat& format = {}) {
    static constexpr const char* names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    std::error_code ec;
    for (const char* name : names) {
        const auto p = dir / name;
        if (std::filesystem::exists(p, ec)) continue;
        auto gz = p;
        gz += ".gz";
        if (std::filesystem::exists(gz, ec))
            throw_error<IoError>("load_mnist: ", io::in_quotes(p.string()), " is missing but ", io::in_quotes(gz.string()),
                                 " exists; gzip-compressed files are not supported: run `gzip -dk ", gz.string(),
                                 "` (or, from strata's source tree, `scripts/fetch-mnist ", dir.string(), "`)");
        throw_error<IoError>("load_mnist: ", io::in_quotes(p.string()), " does not exist; expected the four MNIST files "
                             "(train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                             "t10k-labels-idx1-ubyte) in ", io::in_quotes(dir.string()), ": run `scripts/fetch-mnist ",
                             dir.string(), "` from strata's source tree (the scripts are not installed)");
    }
    return Mnist{load_mnist_split(dir / names[0], dir / names[1], format),
                 load_mnist_split(dir / names[2], dir / names[3], format)};
}

}  // namespace strata::data
