#pragma once
/// \file strata/io/impl/safetensors.ipp
/// The definitions behind strata/io/safetensors.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <cerrno>
#include <cstdio>
#include <limits>
#include <memory>
#include <system_error>

#include "strata/io/atomic_file.hpp"
#include "strata/io/json.hpp"
#include "strata/io/safetensors.hpp"

namespace strata::io {

namespace detail::st {

STRATA_DECL std::optional<std::uint64_t> checked_numel(std::span<const std::size_t> shape) {
    std::uint64_t n = 1;
    for (auto d : shape) {
        if (d != 0 && n > std::numeric_limits<std::uint64_t>::max() / d) return std::nullopt;
        n *= d;
    }
    return n;
}

}  // namespace detail::st

STRATA_DECL void SafetensorsWriter::add_bytes(std::string name, Dtype dtype, std::vector<std::size_t> shape, std::span<const std::byte> bytes) {
    const std::size_t es = dtype_size(dtype);
    STRATA_CHECK(bytes.size() % es == 0, ShapeError, "SafetensorsWriter: tensor ", in_quotes(name), ": ",
                 bytes.size(), " bytes is not a whole number of ", dtype_name(dtype), " elements (", es, " bytes each)");
    check_new(name, shape, bytes.size() / es);
    entries_.push_back(Entry{std::move(name), dtype, std::move(shape), std::vector<std::byte>(bytes.begin(), bytes.end())});
}

STRATA_DECL void SafetensorsWriter::set_metadata(std::string key, std::string value) {
    STRATA_CHECK(valid_utf8(key) && valid_utf8(value), ValueError,
                 "SafetensorsWriter: metadata key and value must be valid UTF-8 (key ", in_quotes(key), ")");
    metadata_[std::move(key)] = std::move(value);
}

STRATA_DECL std::string SafetensorsWriter::header() const {
    std::string h = "{";
    bool first = true;
    if (!metadata_.empty()) {
        h += "\"__metadata__\":{";
        bool first_member = true;
        for (const auto& [k, v] : metadata_) {
            if (!first_member) h += ',';
            first_member = false;
            json::append_string(h, k);
            h += ':';
            json::append_string(h, v);
        }
        h += '}';
        first = false;
    }
    std::uint64_t offset = 0;
    for (const Entry* e : ordered()) {
        if (!first) h += ',';
        first = false;
        json::append_string(h, e->name);
        h += ":{\"dtype\":\"";
        h += dtype_name(e->dtype);
        h += "\",\"shape\":[";
        for (std::size_t i = 0; i < e->shape.size(); ++i) {
            if (i) h += ',';
            h += std::to_string(e->shape[i]);
        }
        h += "],\"data_offsets\":[" + std::to_string(offset) + ',';
        offset += e->bytes.size();
        h += std::to_string(offset) + "]}";
    }
    h += '}';
    h.append((8 - h.size() % 8) % 8, ' ');
    return h;
}

STRATA_DECL std::vector<std::byte> SafetensorsWriter::serialize() const {
    const std::string h = header();
    std::vector<std::byte> out(8 + h.size());
    write_u64_le(out.data(), h.size());
    std::memcpy(out.data() + 8, h.data(), h.size());
    for (const Entry* e : ordered()) out.insert(out.end(), e->bytes.begin(), e->bytes.end());
    return out;
}

STRATA_DECL void SafetensorsWriter::save(const std::filesystem::path& path) const {
    const std::string h = header();
    std::byte prefix[8];
    write_u64_le(prefix, h.size());
    AtomicFileWriter out(path);
    out.write(prefix, 8);
    out.write(h.data(), h.size());
    for (const Entry* e : ordered()) out.write(e->bytes.data(), e->bytes.size());
    out.commit();
}

STRATA_DECL void SafetensorsWriter::write_u64_le(std::byte* dst, std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) dst[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}

STRATA_DECL std::size_t SafetensorsWriter::check_new(const std::string& name, const std::vector<std::size_t>& shape, std::size_t count) const {
    STRATA_CHECK(!name.empty(), ValueError, "SafetensorsWriter: a tensor name must not be empty");
    STRATA_CHECK(name != "__metadata__", ValueError, "SafetensorsWriter: '__metadata__' is reserved and cannot name a tensor");
    STRATA_CHECK(valid_utf8(name), ValueError, "SafetensorsWriter: tensor name ", in_quotes(name),
                 " is not valid UTF-8");
    for (const auto& e : entries_)
        STRATA_CHECK(e.name != name, ValueError, "SafetensorsWriter: tensor ", in_quotes(name), " was already added");
    const auto n = detail::st::checked_numel(shape);
    STRATA_CHECK(n && *n == count, ShapeError, "SafetensorsWriter: tensor ", in_quotes(name), ": shape ",
                 shape_text(shape), " holds ", n ? std::to_string(*n) : std::string("too many"),
                 " elements, but the data has ", count);
    return count;
}

STRATA_DECL std::vector<const SafetensorsWriter::Entry*> SafetensorsWriter::ordered() const {
    std::vector<const Entry*> v;
    v.reserve(entries_.size());
    for (const auto& e : entries_) v.push_back(&e);
    std::sort(v.begin(), v.end(), [](const Entry* a, const Entry* b) {
        const auto sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
        return sa != sb ? sa > sb : a->name < b->name;
    });
    return v;
}

STRATA_DECL SafetensorsFile SafetensorsFile::load(const std::filesystem::path& path) {
    const std::string where = in_quotes(path.string());
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw_error<IoError>("safetensors: cannot read ", where, ": it is a directory");
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) throw_error<IoError>("safetensors: cannot open ", where, ": ", std::strerror(errno));
    if (std::fseek(f.get(), 0, SEEK_END) != 0) throw_error<IoError>("safetensors: cannot seek in ", where, ": ", std::strerror(errno));
    const long size = std::ftell(f.get());
    if (size < 0 || std::fseek(f.get(), 0, SEEK_SET) != 0)
        throw_error<IoError>("safetensors: cannot tell the size of ", where, ": ", std::strerror(errno));
    std::vector<std::byte> bytes(static_cast<std::size_t>(size));
    if (!bytes.empty() && std::fread(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
        throw_error<IoError>("safetensors: cannot read ", where, ": ",
                             std::ferror(f.get()) ? std::strerror(errno) : "the file shrank while being read");
    return parse(std::move(bytes), path.string());
}

STRATA_DECL SafetensorsFile SafetensorsFile::parse(std::vector<std::byte> file, std::string source) {
    SafetensorsFile r;
    r.source_ = std::move(source);
    r.parse_all(std::move(file));
    return r;
}

STRATA_DECL std::vector<std::string> SafetensorsFile::names() const {
    std::vector<std::string> v;
    v.reserve(tensors_.size());
    for (const auto& t : tensors_) v.push_back(t.name);
    return v;
}

STRATA_DECL bool SafetensorsFile::contains(std::string_view name) const { return index_.find(name) != index_.end(); }

STRATA_DECL const TensorInfo& SafetensorsFile::info(std::string_view name) const {
    const auto it = index_.find(name);
    if (it == index_.end()) {
        std::string known;
        for (std::size_t i = 0; i < tensors_.size() && i < 20; ++i) known += (i ? ", " : "") + tensors_[i].name;
        if (tensors_.size() > 20) known += ", ... (" + std::to_string(tensors_.size()) + " in all)";
        if (tensors_.empty()) known = "none";
        throw_error<CheckpointError>("safetensors: ", in_quotes(source_), " has no tensor ",
                                     in_quotes(name), "; its tensors are: ", known);
    }
    return tensors_[it->second];
}

STRATA_DECL Dtype SafetensorsFile::dtype(std::string_view name) const { return info(name).dtype; }

STRATA_DECL const std::vector<std::size_t>& SafetensorsFile::shape(std::string_view name) const { return info(name).shape; }

STRATA_DECL std::span<const std::byte> SafetensorsFile::bytes(std::string_view name) const {
    const auto& t = info(name);
    return std::span<const std::byte>(data_).subspan(static_cast<std::size_t>(t.begin), t.byte_size());
}

STRATA_DECL bool SafetensorsFile::has_metadata(std::string_view key) const { return metadata_.find(key) != metadata_.end(); }

STRATA_DECL const std::string& SafetensorsFile::metadata(std::string_view key) const {
    const auto it = metadata_.find(key);
    if (it == metadata_.end())
        throw_error<CheckpointError>("safetensors: ", in_quotes(source_), " has no metadata key ",
                                     in_quotes(key));
    return it->second;
}

STRATA_DECL const TensorInfo& SafetensorsFile::checked(std::string_view name, Dtype want) const {
    const auto& t = info(name);
    if (t.dtype != want)
        fail("tensor ", in_quotes(name), ": expected dtype ", dtype_name(want), ", found ", dtype_name(t.dtype));
    return t;
}

STRATA_DECL void SafetensorsFile::parse_all(std::vector<std::byte> file) {
    const std::uint64_t size = file.size();
    if (size < 8)
        fail("file is ", size, " bytes long; a safetensors file starts with an 8-byte header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(file[static_cast<std::size_t>(i)]);
    if (n > size - 8)
        fail("header length ", n, " exceeds the file: only ", size - 8, " bytes follow the 8-byte length (truncated file?)");
    if (n > max_header_size) fail("header length ", n, " exceeds the limit of ", max_header_size, " bytes (corrupt file?)");
    if (n < 2) fail("header length ", n, " is too small for a JSON object");
    const std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, static_cast<std::size_t>(n));
    if (!valid_utf8(text)) fail("header is not valid UTF-8");
    if (text.front() != '{') fail("header must start with '{', found '", text.front(), "'");

    json::Reader reader(text, "safetensors: " + in_quotes(source_) + ": header");
    reader.validate();
    reader.enter();
    for (std::string key; reader.next_member(key);) {
        if (key == "__metadata__") parse_metadata(reader);
        else tensors_.push_back(parse_tensor(key, reader));
    }

    const std::uint64_t buffer = size - 8 - n;
    std::vector<std::size_t> order(tensors_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        const auto& ta = tensors_[a];
        const auto& tb = tensors_[b];
        return ta.begin != tb.begin ? ta.begin < tb.begin : ta.end < tb.end;
    });
    std::uint64_t at = 0;
    const TensorInfo* prev = nullptr;
    for (std::size_t i : order) {
        const auto& t = tensors_[i];
        if (t.begin != at) {
            if (!prev)
                fail("tensor ", in_quotes(t.name), " begins at byte ", t.begin,
                     " of the data buffer; expected the first tensor to begin at byte 0");
            fail("tensor ", in_quotes(t.name), " begins at byte ", t.begin, " but tensor ", in_quotes(prev->name),
                 " ends at byte ", at, ": tensors must be packed without ", t.begin > at ? "gaps" : "overlaps");
        }
        if (t.end > buffer)
            fail("tensor ", in_quotes(t.name), " ends at byte ", t.end, " of the data buffer, but the buffer has only ",
                 buffer, " bytes (truncated file?)");
        at = t.end;
        prev = &t;
    }
    if (at != buffer)
        fail("the tensors cover ", at, " bytes, but the data buffer has ", buffer,
             " bytes: expected no bytes after the last tensor");

    std::vector<TensorInfo> sorted;
    sorted.reserve(tensors_.size());
    for (std::size_t i : order) sorted.push_back(std::move(tensors_[i]));
    tensors_ = std::move(sorted);
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);

    file.erase(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(8 + n));
    data_ = std::move(file);
}

STRATA_DECL void SafetensorsFile::parse_metadata(json::Reader& reader) {
    using json::Kind;
    const Kind k = reader.kind();
    if (k != Kind::Object) fail("__metadata__ is ", json::kind_name(k), ", expected an object of strings");
    reader.enter();
    for (std::string key; reader.next_member(key);) {
        const Kind vk = reader.kind();
        if (vk != Kind::String)
            fail("__metadata__ value of ", in_quotes(key, 200), " is ",
                 json::kind_name(vk), ", expected a string");
        metadata_.emplace(std::move(key), reader.read_string());
    }
}

STRATA_DECL TensorInfo SafetensorsFile::parse_tensor(const std::string& name, json::Reader& reader) const {
    using json::Kind;
    using json::kind_name;
    const std::string who = "tensor " + in_quotes(name, 200);
    // SafetensorsWriter refuses an empty name, so a file with one was not written by strata.
    if (name.empty()) fail("a tensor has an empty name; expected a non-empty name like \"dense/kernel\"");
    if (reader.kind() != Kind::Object)
        fail(who, " is ", kind_name(reader.kind()), ", expected an object with dtype, shape and data_offsets");
    // The fields are located first and read afterwards, so that an unknown or missing field is
    // reported before a bad value whatever the order of the fields.
    constexpr std::size_t absent = std::numeric_limits<std::size_t>::max();
    std::size_t dtype_at = absent, shape_at = absent, offsets_at = absent;
    reader.enter();
    for (std::string k; reader.next_member(k);) {
        if (k == "dtype") dtype_at = reader.pos();
        else if (k == "shape") shape_at = reader.pos();
        else if (k == "data_offsets") offsets_at = reader.pos();
        else fail(who, " has an unknown field ", in_quotes(k, 64), "; expected only dtype, shape and data_offsets");
        reader.skip_value();
    }
    const std::size_t after = reader.pos();
    if (dtype_at == absent || shape_at == absent || offsets_at == absent)
        fail(who, " lacks the field ", dtype_at == absent ? "dtype" : shape_at == absent ? "shape" : "data_offsets");

    TensorInfo t;
    t.name = name;
    reader.seek(dtype_at);
    if (reader.kind() != Kind::String) fail(who, ": dtype is ", kind_name(reader.kind()), ", expected a string");
    const std::string dtype = reader.read_string();
    const auto d = parse_dtype(dtype);
    if (!d)
        fail(who, ": unknown dtype ", in_quotes(dtype, 64),
             "; expected one of BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2");
    t.dtype = *d;

    reader.seek(shape_at);
    if (reader.kind() != Kind::Array) fail(who, ": shape is ", kind_name(reader.kind()), ", expected an array of integers");
    reader.enter();
    while (reader.next_item()) {
        const Kind k = reader.kind();
        if (k != Kind::Number) fail(who, ": shape entry ", kind_name(k), " is not a non-negative integer");
        const std::string_view literal = reader.read_number();
        const auto x = json::parse_u64(literal);
        if (!x || *x > std::numeric_limits<std::size_t>::max())
            fail(who, ": shape entry ", clipped(literal), " is not a non-negative integer");
        t.shape.push_back(static_cast<std::size_t>(*x));
    }

    reader.seek(offsets_at);
    std::optional<std::uint64_t> bounds[2];
    std::size_t count = 0;
    if (reader.kind() == Kind::Array) {
        reader.enter();
        for (; reader.next_item(); ++count) {
            if (count < 2 && reader.kind() == Kind::Number) bounds[count] = json::parse_u64(reader.read_number());
            else reader.skip_value();
        }
    }
    if (count != 2) fail(who, ": data_offsets must be an array of two integers [begin, end]");
    if (!bounds[0] || !bounds[1]) fail(who, ": data_offsets must hold two non-negative integers");
    const std::uint64_t b = *bounds[0], e = *bounds[1];
    if (b > e) fail(who, ": data_offsets [", b, ", ", e, "] end before they begin");
    t.begin = b;
    t.end = e;
    reader.seek(after);

    const auto numel = detail::st::checked_numel(t.shape);
    const std::uint64_t es = dtype_size(t.dtype);
    if (!numel || *numel > std::numeric_limits<std::uint64_t>::max() / es)
        fail(who, ": shape ", shape_text(t.shape), " describes more bytes than any file can hold");
    if (*numel * es != t.end - t.begin)
        fail(who, ": dtype ", dtype_name(t.dtype), " and shape ", shape_text(t.shape), " need ", *numel * es,
             " bytes, but data_offsets [", t.begin, ", ", t.end, "] cover ", t.end - t.begin);
    return t;
}

}  // namespace strata::io
