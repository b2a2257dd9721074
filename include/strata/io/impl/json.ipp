#pragma once
/// \file strata/io/impl/json.ipp
/// The definitions behind strata/io/json.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <algorithm>
#include <limits>

#include "strata/core/error.hpp"
#include "strata/io/json.hpp"
#include "strata/io/text.hpp"

namespace strata::io::json {

STRATA_DECL const char* kind_name(Kind k) noexcept {
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

STRATA_DECL std::optional<std::uint64_t> parse_u64(std::string_view literal) noexcept {
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

STRATA_DECL void Reader::validate() {
    pos_ = 0;
    skip_ws();
    validate_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected ", describe(), " after the end of the JSON value");
    pos_ = 0;
    keys_ = std::string();
    refs_ = std::vector<KeyRef>();
}

STRATA_DECL Kind Reader::kind() noexcept {
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

STRATA_DECL void Reader::enter() noexcept {
    skip_ws();
    ++pos_;
}

STRATA_DECL bool Reader::next_member(std::string& key) {
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

STRATA_DECL bool Reader::next_item() noexcept {
    skip_ws();
    if (eat(']')) return false;
    eat(',');
    skip_ws();
    return true;
}

STRATA_DECL std::string Reader::read_string() {
    skip_ws();
    std::string out;
    scan_string(&out);
    return out;
}

STRATA_DECL std::string_view Reader::read_number() {
    skip_ws();
    const std::size_t start = pos_;
    scan_number();
    return s_.substr(start, pos_ - start);
}

STRATA_DECL void Reader::skip_value() {
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

STRATA_DECL std::string Reader::describe() const {
    if (pos_ >= s_.size()) return "end of header";
    const auto c = static_cast<unsigned char>(s_[pos_]);
    if (c >= 0x20 && c < 0x7F) return std::string("'") + s_[pos_] + "'";
    static constexpr char digits[] = "0123456789abcdef";
    return std::string("byte 0x") + digits[c >> 4] + digits[c & 15];
}

STRATA_DECL void Reader::skip_ws() noexcept {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
}

STRATA_DECL bool Reader::eat(char c) noexcept {
    if (pos_ < s_.size() && s_[pos_] == c) { ++pos_; return true; }
    return false;
}

STRATA_DECL void Reader::expect_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) fail("expected '", w, "', found ", describe());
    pos_ += w.size();
}

STRATA_DECL std::string_view Reader::key_of(const KeyRef& k) const noexcept { return std::string_view(keys_).substr(k.begin, k.size); }

STRATA_DECL void Reader::validate_value(int depth) {
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

STRATA_DECL void Reader::validate_object(int depth) {
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

STRATA_DECL void Reader::check_unique_keys(std::size_t first_ref) {
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

STRATA_DECL void Reader::validate_array(int depth) {
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

STRATA_DECL void Reader::scan_number() {
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

STRATA_DECL unsigned Reader::parse_hex4() {
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

STRATA_DECL void Reader::append_utf8(std::string& out, unsigned cp) {
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

STRATA_DECL void Reader::scan_string(std::string* out) {
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

STRATA_DECL void append_string(std::string& out, std::string_view s) {
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
