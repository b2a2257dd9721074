#pragma once
/// \file strata/data/impl/mnist.ipp
/// The definitions behind strata/data/mnist.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <system_error>

#include "strata/data/mnist.hpp"

namespace strata::data {

STRATA_DECL io::IdxArray<float> load_mnist_images(const std::filesystem::path& path, const MnistFormat& format) {
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

STRATA_DECL io::IdxArray<std::int32_t> load_mnist_labels(const std::filesystem::path& path, const MnistFormat& format) {
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

STRATA_DECL MnistSplit load_mnist_split(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                                        const MnistFormat& format) {
    MnistSplit s{load_mnist_images(images_path, format), load_mnist_labels(labels_path, format)};
    if (s.images.count() != s.labels.count())
        throw_error<IoError>("load_mnist_split: ", io::in_quotes(images_path.string()), " has ", s.images.count(),
                             " images but ", io::in_quotes(labels_path.string()), " has ", s.labels.count(),
                             " labels; expected the same count");
    return s;
}

STRATA_DECL Mnist detail::load_mnist_dir(const std::filesystem::path& dir, const MnistFormat& format,
                                         std::string_view who, std::string_view data_set,
                                         std::string_view fetch_script) {
    static constexpr const char* names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    std::error_code ec;
    for (const char* name : names) {
        const auto p = dir / name;
        if (std::filesystem::exists(p, ec)) continue;
        auto gz = p;
        gz += ".gz";
        if (std::filesystem::exists(gz, ec))
            throw_error<IoError>(who, ": ", io::in_quotes(p.string()), " is missing but ", io::in_quotes(gz.string()),
                                 " exists; gzip-compressed files are not supported: run `gzip -dk ", gz.string(),
                                 "` (or, from strata's source tree, `", fetch_script, " ", dir.string(), "`)");
        throw_error<IoError>(who, ": ", io::in_quotes(p.string()), " does not exist; expected the four ", data_set,
                             " files (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                             "t10k-labels-idx1-ubyte) in ", io::in_quotes(dir.string()), ": run `", fetch_script, " ",
                             dir.string(), "` from strata's source tree (the scripts are not installed)");
    }
    return Mnist{load_mnist_split(dir / names[0], dir / names[1], format),
                 load_mnist_split(dir / names[2], dir / names[3], format)};
}

STRATA_DECL Mnist load_mnist(const std::filesystem::path& dir, const MnistFormat& format) {
    return detail::load_mnist_dir(dir, format, "load_mnist", "MNIST", "scripts/fetch-mnist");
}

STRATA_DECL Mnist load_fashion_mnist(const std::filesystem::path& dir, const MnistFormat& format) {
    return detail::load_mnist_dir(dir, format, "load_fashion_mnist", "Fashion-MNIST", "scripts/fetch-fashion-mnist");
}

}  // namespace strata::data
