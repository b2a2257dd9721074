#pragma once
/// \file strata/io/json.hpp
/// A small JSON reader and string writer, enough for file headers such as safetensors' (RFC 8259
/// syntax, UTF-8 text).
///
/// The reader works in two passes over the header text and builds no document tree, so a
/// hostile header costs time and memory linear in its length (a tree of small nodes would cost
/// ~50x the text, and the 100 MB header limit would allow gigabytes):
///   1. validate() checks the syntax, the nesting depth and that no object holds a key twice;
///   2. the cursor functions (kind, enter, next_member, next_item, read_string, read_number,
///      skip_value, seek) walk the validated text to extract what the caller wants.
/// Every error is a CheckpointError (a malformed file) whose message starts with the context the
/// reader was given, then the byte offset and what was found there.
///
/// \code
///   strata::io::json::Reader json(text, "safetensors: 'w.st': header");
///   json.validate();                      // throws on bad syntax, depth or a repeated key
///   json.enter();                         // the top-level object
///   for (std::string key; json.next_member(key);) json.skip_value();
/// \endcode

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/config.hpp"
#include "strata/core/error.hpp"

namespace strata::io::json {

/// What a JSON value is.
enum class Kind { Null, Bool, Number, String, Array, Object };

/// "null", "a boolean", "a number", "a string", "an array", "an object": for messages.
STRATA_DECL const char* kind_name(Kind k) noexcept;

/// The value of an integer literal 0 .. 2^64-1 (no sign, fraction or exponent), else nullopt.
STRATA_DECL std::optional<std::uint64_t> parse_u64(std::string_view literal) noexcept;

/// The two-pass reader described above, over a document it does not own (`doc` must outlive it).
class Reader {
public:
    /// `context` prefixes every message ("safetensors: 'w.st': header").
    Reader(std::string_view doc, std::string context) : s_(doc), context_(std::move(context)) {}

    /// Pass 1: the document is one value followed by nothing but whitespace, nested at most
    /// max_depth levels, with distinct keys in every object. Throws CheckpointError naming the
    /// byte offset and what was found there. Leaves the cursor at the start.
    void validate();

    // ---- Pass 2: valid only on a validated document; syntax is not checked again. ----

    std::size_t pos() const noexcept { return pos_; }
    void seek(std::size_t at) noexcept { pos_ = at; }

    /// What the value at the cursor is (after whitespace).
    Kind kind() noexcept;
    /// Steps into the object or array at the cursor.
    void enter() noexcept;
    /// Inside an object: reads the next key into `key` and leaves the cursor on its value (true),
    /// or steps past the closing brace (false). The previous member's value must have been consumed.
    bool next_member(std::string& key);
    /// Inside an array: leaves the cursor on the next item (true), or steps past ']' (false).
    bool next_item() noexcept;
    /// The decoded string at the cursor.
    std::string read_string();
    /// The literal of the number at the cursor, as written.
    std::string_view read_number();
    /// Steps over the value at the cursor (recursion bounded by max_depth, checked in pass 1).
    void skip_value();

private:
    static constexpr int max_depth = 64;  // a header is 3 levels deep; deep nesting is an attack

    // A decoded key of an object being validated: bytes [begin, begin + size) of keys_, found at
    // byte `at` of the document.
    struct KeyRef {
        std::size_t begin, size, at;
    };

    std::string_view s_;
    std::string context_;
    std::size_t pos_ = 0;
    std::string keys_;           // pass 1: the decoded keys of the objects now open, innermost last
    std::vector<KeyRef> refs_;   // pass 1: one per key in keys_

    template <class... Args>
    [[noreturn]] void fail(Args&&... args) const {
        throw_error<CheckpointError>(context_, ": invalid JSON at byte ", pos_, ": ", std::forward<Args>(args)...);
    }
    std::string describe() const;
    void skip_ws() noexcept;
    bool eat(char c) noexcept;
    void expect_word(std::string_view w);
    std::string_view key_of(const KeyRef& k) const noexcept;

    void validate_value(int depth);
    void validate_object(int depth);

    // Sorting makes the check O(k log k) for k keys, also for keys crafted to collide in a
    // hash table; comparing each key with every earlier one took 11 s for 80 000 keys.
    void check_unique_keys(std::size_t first_ref);

    void validate_array(int depth);
    void scan_number();
    unsigned parse_hex4();
    static void append_utf8(std::string& out, unsigned cp);

    // Scans the string at the cursor (on its opening quote), appending the decoded text to
    // `out` unless it is null (values nobody reads are only checked, not copied).
    void scan_string(std::string* out);
};

/// Appends `s` as a JSON string literal (quotes, backslashes and control characters escaped;
/// other UTF-8 passes through unchanged).
STRATA_DECL void append_string(std::string& out, std::string_view s);

}  // namespace strata::io::json

#if STRATA_DEFINITIONS
#include "strata/io/impl/json.ipp"
#endif
