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

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/io/text.hpp"

namespace strata::io::json {

/// What a JSON value is.
enum class Kind { Null, Bool, Number, String, Array, Object };

/// "null", "a boolean", "a number", "a string", "an array", "an object": for messages.
inline const char* kind_name(Kind k) noexcept {
    switch (k) {
        case Kind::Null: return "null";
        case Kind::Bool: return "a boolean";
        case Kind::Number: return "a number";
        case Kind::String: return "a string";
        case Kind::Array: return "an array";
        case Kind::Object: return "an object";
    }
    return "?";
}

/// The value of an integer literal 0 .. 2^64-1 (no sign, fraction or exponent), else nullopt.
inline std::optional<std::uint64_t> parse_u64(std::string_view literal) noexcept {
    if (literal.empty() || (literal.size() > 1 && literal[0] == '0')) return std::nullopt;
    std::uint64_t v = 0;
    for (char c : literal) {
        if (c < '0' || c > '9') return std::nullopt;
        const auto d = static_cast<std::uint64_t>(c - '0');
        if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return std::nullopt;
        v = v * 10 + d;
    }
    return v;
}

/// The two-pass reader described above, over a document it does not own (`doc` must outlive it).
class Reader {
public:
    /// `context` prefixes every message ("safetensors: 'w.st': header").
    Reader(std::string_view doc, std::string context) : s_(doc), context_(std::move(context)) {}

    /// Pass 1: the document is one value followed by nothing but whitespace, nested at most
    /// max_depth levels, with distinct keys in every object. Throws CheckpointError naming the
    /// byte offset and what was found there. Leaves the cursor at the start.
    void validate() {
        pos_ = 0;
        skip_ws();
        validate_value(0);
        skip_ws();
        if (pos_ != s_.size()) fail("unexpected ", describe(), " after the end of the JSON value");
        pos_ = 0;
        keys_ = std::string();
        refs_ = std::vector<KeyRef>();
    }

    // ---- Pass 2: valid only on a validated document; syntax is not checked again. ----

    std::size_t pos() const noexcept { return pos_; }
    void seek(std::size_t at) noexcept { pos_ = at; }

    /// What the value at the cursor is (after whitespace).
    Kind kind() noexcept {
        skip_ws();
        switch (s_[pos_]) {
            case '{': return Kind::Object;
            case '[': return Kind::Array;
            case '"': return Kind::String;
            case 't':
            case 'f': return Kind::Bool;
            case 'n': return Kind::Null;
            default: return Kind::Number;
        }
    }
    /// Steps into the object or array at the cursor.
    void enter() noexcept {
        skip_ws();
        ++pos_;
    }
    /// Inside an object: reads the next key into `key` and leaves the cursor on its value (true),
    /// or steps past the closing brace (false). The previous member's value must have been consumed.
    bool next_member(std::string& key) {
        skip_ws();
        if (eat('}')) return false;
        eat(',');
        skip_ws();
        key.clear();
        scan_string(&key);
        skip_ws();
        eat(':');
        skip_ws();
        return true;
    }
    /// Inside an array: leaves the cursor on the next item (true), or steps past ']' (false).
    bool next_item() noexcept {
        skip_ws();
        if (eat(']')) return false;
        eat(',');
        skip_ws();
        return true;
    }
    /// The decoded string at the cursor.
    std::string read_string() {
        skip_ws();
        std::string out;
        scan_string(&out);
        return out;
    }
    /// The literal of the number at the cursor, as written.
    std::string_view read_number() {
        skip_ws();
        const std::size_t start = pos_;
        scan_number();
        return s_.substr(start, pos_ - start);
    }
    /// Steps over the value at the cursor (recursion bounded by max_depth, checked in pass 1).
    void skip_value() {
        switch (kind()) {
            case Kind::Object: {
                enter();
                for (std::string key; next_member(key);) skip_value();
                break;
            }
            case Kind::Array:
                enter();
                while (next_item()) skip_value();
                break;
            case Kind::String: scan_string(nullptr); break;
            case Kind::Bool: pos_ += s_[pos_] == 't' ? 4 : 5; break;
            case Kind::Null: pos_ += 4; break;
            case Kind::Number: scan_number(); break;
        }
    }

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
    std::string describe() const {
        if (pos_ >= s_.size()) return "end of header";
        const auto c = static_cast<unsigned char>(s_[pos_]);
        if (c >= 0x20 && c < 0x7F) return std::string("'") + s_[pos_] + "'";
        static constexpr char digits[] = "0123456789abcdef";
        return std::string("byte 0x") + digits[c >> 4] + digits[c & 15];
    }
    void skip_ws() noexcept {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
    }
    bool eat(char c) noexcept {
        if (pos_ < s_.size() && s_[pos_] == c) { ++pos_; return true; }
        return false;
    }
    void expect_word(std::string_view w) {
        if (s_.substr(pos_, w.size()) != w) fail("expected '", w, "', found ", describe());
        pos_ += w.size();
    }
    std::string_view key_of(const KeyRef& k) const noexcept { return std::string_view(keys_).substr(k.begin, k.size); }

    void validate_value(int depth) {
        if (depth > max_depth) fail("nesting deeper than ", max_depth, " levels");
        if (pos_ >= s_.size()) fail("expected a value, found end of header");
        switch (s_[pos_]) {
            case '{': validate_object(depth); break;
            case '[': validate_array(depth); break;
            case '"': scan_string(nullptr); break;
            case 't': expect_word("true"); break;
            case 'f': expect_word("false"); break;
            case 'n': expect_word("null"); break;
            default:
                if (s_[pos_] == '-' || (s_[pos_] >= '0' && s_[pos_] <= '9')) scan_number();
                else fail("expected a value, found ", describe());
        }
    }

    void validate_object(int depth) {
        ++pos_;
        const std::size_t first_ref = refs_.size();
        const std::size_t first_byte = keys_.size();
        skip_ws();
        if (!eat('}')) {
            for (;;) {
                skip_ws();
                if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key, found ", describe());
                const std::size_t at = pos_;
                const std::size_t begin = keys_.size();
                scan_string(&keys_);
                refs_.push_back(KeyRef{begin, keys_.size() - begin, at});
                skip_ws();
                if (!eat(':')) fail("expected ':' after the key \"", clipped(key_of(refs_.back())), "\", found ", describe());
                skip_ws();
                validate_value(depth + 1);
                skip_ws();
                if (eat(',')) continue;
                if (eat('}')) break;
                fail("expected ',' or '}' after an object member, found ", describe());
            }
        }
        check_unique_keys(first_ref);
        // Nested objects have already truncated back to their own marks, which lie after ours.
        refs_.resize(first_ref);
        keys_.resize(first_byte);
    }

    // Sorting makes the check O(k log k) for k keys, also for keys crafted to collide in a
    // hash table; comparing each key with every earlier one took 11 s for 80 000 keys.
    void check_unique_keys(std::size_t first_ref) {
        const auto first = refs_.begin() + static_cast<std::ptrdiff_t>(first_ref);
        std::sort(first, refs_.end(), [&](const KeyRef& a, const KeyRef& b) {
            const auto ka = key_of(a), kb = key_of(b);
            return ka != kb ? ka < kb : a.at < b.at;
        });
        const KeyRef* dup = nullptr;  // the repeated key that comes first in the document
        for (auto it = first; it != refs_.end() && it + 1 != refs_.end(); ++it)
            if (key_of(*it) == key_of(*(it + 1)) && (!dup || (it + 1)->at < dup->at)) dup = &*(it + 1);
        if (dup) {
            pos_ = dup->at;
            fail("duplicate key \"", clipped(key_of(*dup)), "\"");
        }
    }

    void validate_array(int depth) {
        ++pos_;
        skip_ws();
        if (eat(']')) return;
        for (;;) {
            skip_ws();
            validate_value(depth + 1);
            skip_ws();
            if (eat(',')) continue;
            if (eat(']')) return;
            fail("expected ',' or ']' after an array element, found ", describe());
        }
    }

    void scan_number() {
        eat('-');
        if (eat('0')) {
        } else if (pos_ < s_.size() && s_[pos_] >= '1' && s_[pos_] <= '9') {
            while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
        } else {
            fail("expected a digit, found ", describe());
        }
        if (eat('.')) {
            if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') fail("expected a digit after '.', found ", describe());
            while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
        }
        if (eat('e') || eat('E')) {
            if (!eat('+')) eat('-');
            if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') fail("expected a digit in the exponent, found ", describe());
            while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
        }
    }

    unsigned parse_hex4() {
        unsigned v = 0;
        for (int i = 0; i < 4; ++i, ++pos_) {
            if (pos_ >= s_.size()) fail("unterminated \\u escape");
            const char c = s_[pos_];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= unsigned(c - '0');
            else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
            else fail("expected a hex digit in a \\u escape, found ", describe());
        }
        return v;
    }

    static void append_utf8(std::string& out, unsigned cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }

    // Scans the string at the cursor (on its opening quote), appending the decoded text to
    // `out` unless it is null (values nobody reads are only checked, not copied).
    void scan_string(std::string* out) {
        ++pos_;
        for (;;) {
            const std::size_t run = pos_;
            while (pos_ < s_.size() && s_[pos_] != '"' && s_[pos_] != '\\' && static_cast<unsigned char>(s_[pos_]) >= 0x20) ++pos_;
            if (out) out->append(s_.substr(run, pos_ - run));
            if (pos_ >= s_.size()) fail("unterminated string");
            const char c = s_[pos_];
            if (c == '"') { ++pos_; return; }
            if (c != '\\') fail("unescaped control character (", describe(), ") in a string");
            ++pos_;
            if (pos_ >= s_.size()) fail("unterminated escape");
            const char e = s_[pos_++];
            char plain = 0;
            switch (e) {
                case '"': plain = '"'; break;
                case '\\': plain = '\\'; break;
                case '/': plain = '/'; break;
                case 'b': plain = '\b'; break;
                case 'f': plain = '\f'; break;
                case 'n': plain = '\n'; break;
                case 'r': plain = '\r'; break;
                case 't': plain = '\t'; break;
                case 'u': {
                    unsigned cp = parse_hex4();
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (s_.substr(pos_, 2) != "\\u") fail("high surrogate \\u", cp, " not followed by a low surrogate");
                        pos_ += 2;
                        const unsigned lo = parse_hex4();
                        if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate not followed by a low surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        fail("lone low surrogate in a \\u escape");
                    }
                    if (out) append_utf8(*out, cp);
                    continue;
                }
                default: --pos_; fail("invalid escape '\\", e, "'");
            }
            if (out) *out += plain;
        }
    }
};

/// Appends `s` as a JSON string literal (quotes, backslashes and control characters escaped;
/// other UTF-8 passes through unchanged).
inline void append_string(std::string& out, std::string_view s) {
    static constexpr char digits[] = "0123456789abcdef";
    out += '"';
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (u < 0x20) {
                    out += "\\u00";
                    out += digits[u >> 4];
                    out += digits[u & 15];
                } else {
                    out += c;
                }
        }
    }
    out += '"';
}

}  // namespace strata::io::json
