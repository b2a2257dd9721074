#pragma once
/// \file strata/io/impl/idx.ipp
/// The definitions behind strata/io/idx.hpp: included by it in the header-only mode, compiled
/// once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>

#include "strata/io/idx.hpp"

namespace strata::io {

namespace detail::idx {

STRATA_DECL std::string hex_bytes(const unsigned char* b, std::size_t n) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s;
    for (std::size_t i = 0; i < n; ++i) {
        if (i) s += ' ';
        s += digits[b[i] >> 4];
        s += digits[b[i] & 15];
    }
    return s;
}

STRATA_DECL bool known_type(std::uint8_t code) {
    return code == 0x08 || code == 0x09 || code == 0x0B || code == 0x0C || code == 0x0D || code == 0x0E;
}

STRATA_DECL File open_for_reading(const std::filesystem::path& path, const char* who) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw_error<IoError>(who, ": ", in_quotes(path.string()), " is a directory, not an IDX file");
    File f(std::fopen(path.c_str(), "rb"));
    if (!f) {
        const int err = errno;
        std::string hint;
        std::filesystem::path gz = path;
        gz += ".gz";
        if (err == ENOENT && std::filesystem::exists(gz, ec))
            hint = "; " + in_quotes(gz.string()) +
                   " exists, but gzip-compressed IDX files are not supported: decompress it with "
                   "`gzip -dk " + gz.string() + "`";
        throw_error<IoError>(who, ": cannot open ", in_quotes(path.string()), ": ", std::strerror(err), hint);
    }
    return f;
}

STRATA_DECL std::uint64_t file_size_of(std::FILE* f, const std::filesystem::path& path, const char* who) {
    if (std::fseek(f, 0, SEEK_END) != 0)
        throw_error<IoError>(who, ": cannot seek in ", in_quotes(path.string()), ": ", std::strerror(errno));
    const long end = std::ftell(f);
    if (end < 0)
        throw_error<IoError>(who, ": cannot tell the size of ", in_quotes(path.string()), ": ", std::strerror(errno));
    if (std::fseek(f, 0, SEEK_SET) != 0)
        throw_error<IoError>(who, ": cannot seek in ", in_quotes(path.string()), ": ", std::strerror(errno));
    return static_cast<std::uint64_t>(end);
}

STRATA_DECL void read_exact(std::FILE* f, void* dst, std::size_t n, const std::filesystem::path& path,
                            std::uint64_t at, const char* who) {
    if (n == 0) return;
    if (std::fread(dst, 1, n, f) != n) {
        if (std::ferror(f))
            throw_error<IoError>(who, ": read error in ", in_quotes(path.string()), " at byte ", at, ": ",
                                 std::strerror(errno));
        throw_error<IoError>(who, ": ", in_quotes(path.string()), " ended early: expected ", n, " more bytes at byte ", at,
                             " (was the file truncated while being read?)");
    }
}

STRATA_DECL IdxHeader parse_header(std::FILE* f, const std::filesystem::path& path, const char* who) {
    const std::uint64_t size = file_size_of(f, path, who);
    if (size < 4)
        throw_error<IoError>(who, ": ", in_quotes(path.string()),
                             " is truncated: an IDX file starts with a 4-byte magic number (00 00 type rank), but the file has ",
                             size, " bytes");
    unsigned char magic[4];
    read_exact(f, magic, 4, path, 0, who);
    if (magic[0] != 0 || magic[1] != 0 || !known_type(magic[2])) {
        std::string why;
        if (magic[0] == 0x1f && magic[1] == 0x8b)
            why = " (this is a gzip file: gzip-compressed IDX files are not supported; decompress it with `gzip -dk`)";
        if (magic[0] != 0 || magic[1] != 0)
            throw_error<IoError>(who, ": ", in_quotes(path.string()),
                                 " is not an IDX file: expected magic bytes 00 00 <type> <rank>, found ",
                                 hex_bytes(magic, 4), why);
        throw_error<IoError>(who, ": ", in_quotes(path.string()), ": unknown IDX type code 0x", hex_bytes(magic + 2, 1),
                             " in byte 2 (magic ", hex_bytes(magic, 4), "); expected one of 0x08 (ubyte), 0x09 (sbyte), "
                             "0x0b (short), 0x0c (int), 0x0d (float), 0x0e (double)");
    }
    IdxHeader h;
    h.type = static_cast<IdxType>(magic[2]);
    const std::size_t rank = magic[3];
    h.data_offset = 4 + 4 * rank;
    if (size < h.data_offset)
        throw_error<IoError>(who, ": ", in_quotes(path.string()), " is truncated in its header: rank ", rank, " needs a ",
                             h.data_offset, "-byte header, but the file has ", size, " bytes");
    unsigned char raw[4 * 255];
    read_exact(f, raw, 4 * rank, path, 4, who);
    h.dims.resize(rank);
    for (std::size_t i = 0; i < rank; ++i) {
        const unsigned char* b = raw + 4 * i;
        h.dims[i] = (std::size_t(b[0]) << 24) | (std::size_t(b[1]) << 16) | (std::size_t(b[2]) << 8) | std::size_t(b[3]);
    }
    // A zero extent makes an empty array however large the others are (a valid file of just a
    // header), so the product is only checked for overflow when no extent is zero.
    std::uint64_t count = 1;
    bool overflow = false;
    if (std::find(h.dims.begin(), h.dims.end(), std::size_t(0)) != h.dims.end()) {
        count = 0;
    } else {
        for (auto d : h.dims) {
            if (count > std::numeric_limits<std::uint64_t>::max() / d) overflow = true;
            else count *= d;
        }
    }
    const std::uint64_t esize = idx_type_size(h.type);
    if (overflow || count > (std::numeric_limits<std::uint64_t>::max() - h.data_offset) / esize)
        throw_error<IoError>(who, ": ", in_quotes(path.string()), ": dims ", shape_text(h.dims), " of ", idx_type_name(h.type),
                             " describe more bytes than any file can hold (corrupt header?); the file has ", size, " bytes");
    const std::uint64_t expected = count * esize;
    const std::uint64_t found = size - h.data_offset;
    if (found != expected)
        throw_error<IoError>(who, ": ", in_quotes(path.string()), found < expected ? " is truncated" : " has trailing bytes",
                             ": dims ", shape_text(h.dims), " of ", idx_type_name(h.type), " (", esize,
                             " bytes each) need ", expected, " data bytes after the ", h.data_offset,
                             "-byte header (file size ", h.data_offset + expected, "), found ", found,
                             " data bytes (file size ", size, ")");
    return h;
}

}  // namespace detail::idx

STRATA_DECL IdxHeader read_idx_header(const std::filesystem::path& path) {
    auto f = detail::idx::open_for_reading(path, "read_idx_header");
    return detail::idx::parse_header(f.get(), path, "read_idx_header");
}

}  // namespace strata::io
