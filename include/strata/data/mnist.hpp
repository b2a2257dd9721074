#pragma once
/// \file strata/data/mnist.hpp
/// MNIST loaders on top of strata/io/idx.hpp: the four standard files of a directory (load_mnist,
/// and load_fashion_mnist for Zalando's Fashion-MNIST, which has the same files and format) or
/// one image file and one label file (load_mnist_split), checked against what the model
/// takes before any training starts: images of the expected size (28x28 unless told otherwise;
/// a 32x32 or a 14x56 file is refused, not reinterpreted) and labels that are class ids
/// (0..9 unless told otherwise). Every error names the file.
///
/// \code
///   auto mnist = strata::data::load_mnist("data/mnist");
///   auto train = strata::data::Dataset<>::from_arrays(mnist.train.images.data, {28, 28, 1},
///                                                     mnist.train.labels.data);
/// \endcode

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "strata/config.hpp"
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
STRATA_DECL io::IdxArray<float> load_mnist_images(const std::filesystem::path& path, const MnistFormat& format = {});

/// Reads an MNIST-style label file (rank 1, ubyte: N) as int32 class ids, dims {N}.
///
/// Throws IoError for a malformed file, one that is not rank-1 ubyte, or a label outside
/// [0, format.num_classes - 1] (naming the index of the first such label and how many there are).
STRATA_DECL io::IdxArray<std::int32_t> load_mnist_labels(const std::filesystem::path& path, const MnistFormat& format = {});

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
STRATA_DECL MnistSplit load_mnist_split(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                                        const MnistFormat& format = {});

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
STRATA_DECL Mnist load_mnist(const std::filesystem::path& dir, const MnistFormat& format = {});

/// Loads Zalando's Fashion-MNIST (Xiao, Rasul, Vollgraf, 2017) from `dir`: the same four file
/// names, format and sizes as MNIST (60000 training and 10000 test images of 28x28, labels 0..9
/// naming fashion_mnist_class_names), as `scripts/fetch-fashion-mnist DIR` puts them there,
/// uncompressed and checksummed. Checked as load_mnist checks its files.
///
/// Throws IoError as load_mnist does; a missing file's message says to run
/// `scripts/fetch-fashion-mnist DIR` (or to decompress when only the `.gz` is there).
///
/// \code
///   auto fashion = strata::data::load_fashion_mnist("data/fashion_mnist");
///   // fashion.train.size() == 60000, 6000 examples of each class
///   std::string_view name = strata::data::fashion_mnist_class_names[fashion.test.labels.data[0]];  // "Ankle boot"
/// \endcode
STRATA_DECL Mnist load_fashion_mnist(const std::filesystem::path& dir, const MnistFormat& format = {});

/// Fashion-MNIST's class names, indexed by label (Zalando's README): 0 T-shirt/top, 1 Trouser,
/// 2 Pullover, 3 Dress, 4 Coat, 5 Sandal, 6 Shirt, 7 Sneaker, 8 Bag, 9 Ankle boot.
inline constexpr std::array<std::string_view, 10> fashion_mnist_class_names = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

namespace detail {
/// The four standard MNIST-style files of `dir`, for load_mnist and load_fashion_mnist: `who`
/// starts every message, `data_set` names the files a missing one belongs to ("MNIST"), and
/// `fetch_script` is the script that fetches them (named in the message for a missing file).
STRATA_DECL Mnist load_mnist_dir(const std::filesystem::path& dir, const MnistFormat& format, std::string_view who,
                                 std::string_view data_set, std::string_view fetch_script);
}  // namespace detail

}  // namespace strata::data

#if STRATA_DEFINITIONS
#include "strata/data/impl/mnist.ipp"
#endif
