#pragma once
// What the examples and the benchmarks share for their command lines and their --json reports:
// a small flag parser and a small JSON writer, on the standard library alone. They replaced
// CLI11 and nlohmann-json, which cost 6 s and 2.6 s of compile time in every program that
// included this header (docs/benchmarks.md, "Compile time"); the headers under include/strata
// never included either.
//
// The pieces, and why each exists:
//   cli::App                 flags declared once with their help text, type, range and default;
//                            `--help` lists them. The subset of CLI11's interface these programs
//                            use (add_option, add_flag, transform, check, capture_default_str,
//                            delimiter, count), so they read as before; `CLI::App` still names it.
//   cli::integer<T>(lo, hi)  decimal digits only (no octal "010", no hex "0x10"), overflow and
//                            the range checked; the option receives the canonical text.
//   cli::number(lo, hi)      the same for real numbers: finite, in range, no trailing junk.
//   cli::one_of({...})       the text must be one of a list.
//   cli::usage_error(msg)    a mistake between flags found after parsing (--replicas 2 with
//                            one_device): reported exactly like a parse error.
//   cli::run(app, ...)       parses, runs the program, and turns every exception into a
//                            readable message: bad flags exit 2 (with a hint to --help), any
//                            other failure exits 1. Nothing escapes main unexplained.
//   cli::Json, write_json    insertion-ordered JSON; NaN and infinities are written as null (JSON
//                            has no literal for them), invalid UTF-8 is replaced, and the file is
//                            replaced atomically; a failure names the step (create, write, close,
//                            rename) and the system's reason (strerror).
// Standard library only: bench_mpi_allreduce uses it without strata.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <istream>
#include <iterator>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cli {

namespace detail {
inline std::string quoted(std::string_view s) {
    std::string out(1, '\'');
    out += s;
    return out += '\'';
}

/// The shortest text that reads back as `v` ("0.001", "65536", "1e-06").
inline std::string number_text(double v) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}
}  // namespace detail

/// Parses `text` as a decimal integer of type Int in [lo, hi]. Returns an empty string and sets
/// `out` on success, otherwise the reason ("expected an integer in [1, 100], found 'abc'").
/// Accepted: an optional '-' (signed types only) or '+', then decimal digits; nothing else, no
/// spaces, no hex or octal prefixes.
template <class Int>
std::string parse_integer(std::string_view text, Int lo, Int hi, Int& out) {
    static_assert(std::is_integral_v<Int> && !std::is_same_v<Int, bool>, "parse_integer: Int must be an integer type");
    const auto expected = [&] {
        return "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], found " +
               detail::quoted(text);
    };
    std::string_view digits = text;
    if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
    // from_chars accepts a leading '-' for unsigned types too (and wraps); refuse it here.
    if (digits.empty() || (std::is_unsigned_v<Int> && digits.front() == '-')) return expected();
    Int value{};
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value, 10);
    if (ec == std::errc::result_out_of_range) return expected() + " (out of range)";
    if (ec != std::errc() || end != digits.data() + digits.size()) return expected();
    if (value < lo || value > hi) return expected();
    out = value;
    return {};
}

/// Parses `text` as a finite real number in [lo, hi]; same contract as parse_integer.
inline std::string parse_number(std::string_view text, double lo, double hi, double& out) {
    const auto expected = [&] {
        return "expected a number in [" + detail::number_text(lo) + ", " + detail::number_text(hi) + "], found " +
               detail::quoted(text);
    };
    std::string_view digits = text;
    if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
    double value = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || !std::isfinite(value) ||
        value < lo || value > hi)
        return expected();
    out = value;
    return {};
}

/// A check on an option's text: `fn` returns the reason the text is refused, or an empty string
/// (and may rewrite the text: a transform). `text` is what --help shows after the type
/// ("[0, 100]", "{a, b}").
struct Validator {
    std::function<std::string(std::string&)> fn;
    std::string text;
};

/// "[lo, hi]", appended piece by piece: g++ 12 warns (-Wrestrict, a false positive) on
/// `"[" + std::to_string(lo) + ...`, whose first + inserts at the front of a temporary.
inline std::string range_text(const std::string& lo, const std::string& hi) {
    std::string t = "[";
    t += lo;
    t += ", ";
    t += hi;
    t += ']';
    return t;
}

/// The option's text must be a decimal integer in [lo, hi] (see parse_integer); it is rewritten
/// to its canonical form.
///   app.add_option("--epochs", epochs)->transform(cli::integer(1, 1'000'000));
template <class Int>
Validator integer(Int lo, Int hi) {
    return {[lo, hi](std::string& text) {
                Int v{};
                std::string why = parse_integer(text, lo, hi, v);
                if (why.empty()) text = std::to_string(v);
                return why;
            },
            range_text(std::to_string(lo), std::to_string(hi))};
}

/// The text must be a finite number in [lo, hi] (see parse_number).
inline Validator number(double lo, double hi) {
    return {[lo, hi](std::string& text) {
                double v = 0;
                return parse_number(text, lo, hi, v);
            },
            range_text(detail::number_text(lo), detail::number_text(hi))};
}

/// The text must be one of `choices` (spelled exactly).
///   app.add_option("--strategy", s)->check(cli::one_of({"one_device", "mirrored"}));
inline Validator one_of(std::vector<std::string> choices) {
    std::string list;
    for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
    return {[choices, list](std::string& text) {
                for (const auto& c : choices)
                    if (text == c) return std::string();
                return "expected one of " + list + "; found " + detail::quoted(text);
            },
            "{" + list + "}"};
}

/// A mistake on the command line: an unknown flag, a missing or refused value, or two flags that
/// do not go together. cli::run reports it and returns 2.
class ParseError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// A mistake in the flags found after parsing (two flags that do not go together): thrown from
/// the body of cli::run, it is reported like a parse error and the program exits 2.
inline ParseError usage_error(const std::string& what) { return ParseError(what); }

/// One declared flag. The setters return `this`, so that a declaration reads as one statement.
class Option {
public:
    /// Runs `v` on the text before it is converted; `v` may rewrite it.
    Option* transform(Validator v) {
        validators_.push_back(std::move(v));
        return this;
    }
    /// Runs `v` on the text before it is converted (the same as transform here).
    Option* check(Validator v) { return transform(std::move(v)); }
    /// Shows the variable's value at declaration as the default in --help.
    Option* capture_default_str() {
        default_text_ = current_();
        return this;
    }
    /// For a list option: one occurrence may hold several values separated by `c`.
    Option* delimiter(char c) {
        delimiter_ = c;
        return this;
    }

private:
    friend class App;
    std::string name_, description_, type_;
    std::string default_text_;
    std::vector<Validator> validators_;
    char delimiter_ = 0;
    bool flag_ = false, list_ = false;
    std::size_t count_ = 0;
    std::function<std::string(const std::string&)> assign_;  // returns the reason a value is refused
    std::function<std::string()> current_;
    std::function<void()> clear_;                             // a list: forget the defaults at its first occurrence
};

namespace detail {
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};

template <class T>
const char* type_name() {
    if constexpr (std::is_same_v<T, std::string>) return "TEXT";
    else if constexpr (std::is_floating_point_v<T>) return "FLOAT";
    else if constexpr (std::is_unsigned_v<T>) return "UINT";
    else return "INT";
}

template <class T>
std::string value_text(const T& v) {
    if constexpr (std::is_same_v<T, std::string>) return v;
    else if constexpr (std::is_floating_point_v<T>) return number_text(double(v));
    else return std::to_string(v);
}

// Converts a validated text into `out`; returns the reason when it cannot.
template <class T>
std::string convert(const std::string& text, T& out) {
    if constexpr (std::is_same_v<T, std::string>) {
        out = text;
        return {};
    } else if constexpr (std::is_floating_point_v<T>) {
        double v = 0;
        const double most = double(std::numeric_limits<T>::max());
        std::string why = parse_number(text, -most, most, v);
        if (why.empty()) out = T(v);
        return why;
    } else {
        return parse_integer<T>(text, std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), out);
    }
}
}  // namespace detail

/// A program's flags: declared with add_option / add_flag, read by parse, listed by help.
/// `-h` and `--help` are always there. Values are given as `--flag VALUE` or `--flag=VALUE`;
/// a flag given twice keeps the last value, except a list option, which collects them all.
class App {
public:
    explicit App(std::string description = {}, std::string name = {}) : description_(std::move(description)), name_(std::move(name)) {}
    App(const App&) = delete;
    App& operator=(const App&) = delete;

    /// An option that takes a value, stored into `var` (a string, an integer, a real number, or a
    /// std::vector of one of those).
    template <class T>
    Option* add_option(std::string name, T& var, std::string description = {}) {
        Option& o = add(std::move(name), std::move(description));
        if constexpr (detail::is_vector<T>::value) {
            using E = typename T::value_type;
            o.type_ = detail::type_name<E>();
            o.list_ = true;
            o.assign_ = [&var](const std::string& text) {
                E e{};
                std::string why = detail::convert(text, e);
                if (why.empty()) var.push_back(std::move(e));
                return why;
            };
            o.current_ = [&var] {
                std::string s = "[";
                for (std::size_t i = 0; i < var.size(); ++i) {
                    if (i) s += ',';
                    s += detail::value_text(var[i]);
                }
                return s + "]";
            };
            o.clear_ = [&var] { var.clear(); };
        } else {
            o.type_ = detail::type_name<T>();
            o.assign_ = [&var](const std::string& text) { return detail::convert(text, var); };
            o.current_ = [&var] { return detail::value_text(var); };
        }
        return &o;
    }

    /// A flag without a value: sets `var` to true when given ("!--no-thing": sets it to false).
    Option* add_flag(std::string name, bool& var, std::string description = {}) {
        const bool negated = !name.empty() && name.front() == '!';
        if (negated) name.erase(0, 1);
        Option& o = add(std::move(name), std::move(description));
        o.flag_ = true;
        o.assign_ = [&var, negated](const std::string&) {
            var = !negated;
            return std::string();
        };
        o.current_ = [&var] { return std::string(var ? "true" : "false"); };
        if (negated) o.default_text_ = "{false}";
        return &o;
    }

    /// How many times `name` was given on the command line.
    std::size_t count(const std::string& name) const {
        const Option* o = find(name);
        return o ? o->count_ : 0;
    }

    const std::string& get_name() const { return name_; }

    /// Reads the command line. Returns false when --help was asked for (nothing else is read);
    /// throws ParseError naming the flag for anything it cannot take.
    bool parse(int argc, char** argv) {
        if (name_.empty() && argc > 0 && argv[0]) name_ = std::filesystem::path(argv[0]).filename().string();
        for (int i = 1; i < argc; ++i) {
            const std::string_view a = argv[i];
            if (a == "-h" || a == "--help") return false;
        }
        for (int i = 1; i < argc; ++i) {
            std::string arg = argv[i];
            if (arg.size() < 3 || arg.compare(0, 2, "--") != 0)
                throw ParseError("unexpected argument " + detail::quoted(arg) + " (every argument is a --flag; see --help)");
            std::string value;
            const std::size_t eq = arg.find('=');
            const bool inline_value = eq != std::string::npos;
            if (inline_value) {
                value = arg.substr(eq + 1);
                arg.resize(eq);
            }
            Option* o = find(arg);
            if (!o) throw ParseError(arg + ": no such flag (see --help for the flags)");
            if (o->flag_) {
                if (inline_value && value != "true" && value != "1")
                    throw ParseError(arg + ": takes no value, found " + detail::quoted(value));
            } else if (!inline_value) {
                if (i + 1 >= argc) throw ParseError(arg + ": expects a value (" + o->type_ + type_suffix(*o) + ")");
                value = argv[++i];
            }
            if (o->list_ && o->count_ == 0) o->clear_();
            ++o->count_;
            if (o->flag_) {
                o->assign_(value);
                continue;
            }
            std::vector<std::string> items;
            if (o->list_ && o->delimiter_) {
                std::size_t from = 0;
                for (std::size_t at; (at = value.find(o->delimiter_, from)) != std::string::npos; from = at + 1)
                    items.push_back(value.substr(from, at - from));
                items.push_back(value.substr(from));
            } else {
                items.push_back(value);
            }
            for (std::string& item : items) {
                for (const Validator& v : o->validators_) {
                    const std::string why = v.fn(item);
                    if (!why.empty()) throw ParseError(arg + ": " + why);
                }
                const std::string why = o->assign_(item);
                if (!why.empty()) throw ParseError(arg + ": " + why);
            }
        }
        return true;
    }

    /// The --help text: the description, the usage line, then one line per flag with its type,
    /// range and default, and its description (on a line of its own when the flag is long).
    std::string help() const {
        constexpr std::size_t column = 30;
        std::string out;
        if (!description_.empty()) out += description_ + "\n";
        out += "Usage: " + name_ + " [OPTIONS]\n\nOptions:\n";
        auto line = [&](std::string left, const std::string& text) {
            left = "  " + left;
            if (left.size() < column) left.append(column - left.size(), ' ');
            else left += "\n" + std::string(column, ' ');
            if (text.empty()) left.erase(left.find_last_not_of(' ') + 1);
            out += left + text + "\n";
        };
        line("-h,--help", "Print this help message and exit");
        for (const auto& o : options_) {
            std::string left = o->name_;
            if (o->flag_) {
                left += o->default_text_;
            } else {
                left += " " + o->type_ + type_suffix(*o);
                if (!o->default_text_.empty()) left += "=" + o->default_text_;
                if (o->list_) left += " ...";
            }
            line(left, o->description_);
        }
        return out + "\n";
    }

private:
    Option& add(std::string name, std::string description) {
        options_.push_back(std::make_unique<Option>());
        Option& o = *options_.back();
        o.name_ = std::move(name);
        o.description_ = std::move(description);
        return o;
    }
    Option* find(const std::string& name) const {
        for (const auto& o : options_)
            if (o->name_ == name) return o.get();
        return nullptr;
    }
    static std::string type_suffix(const Option& o) {
        std::string s;
        for (const auto& v : o.validators_)
            if (!v.text.empty()) s += ":" + v.text;
        return s;
    }

    std::string description_, name_;
    std::vector<std::unique_ptr<Option>> options_;
};

#ifdef STRATA_CHECK_BUILD
/// Built with `meson setup -Dcheck_build=true` (scripts/test): the program was built to be run as
/// one of the suite's checks, with the examples, the benchmarks and strata_train's models other
/// than the seed CNN at -O1. `run` says so on stderr before the program starts, and
/// `write_json` adds `"check_build": true` to a report, so that no figure from such a build is
/// taken for strata's speed (Google Benchmark warns the same way about a debug build).
inline constexpr const char* check_build_note =
    "note: this build is the test suite's (meson -Dcheck_build=true, as scripts/test sets it up): the examples, the "
    "benchmarks and strata_train's models other than the seed CNN are compiled at -O1, so its timings are not strata's "
    "speed; build with `meson setup DIR -Dexamples=true -Dbenchmarks=true` to measure";
#endif

/// Parses the command line with `app` and runs `body` (returning the exit status). Bad flags,
/// from the parser or a usage_error thrown by `body`, print "PROG: error: WHY" and a hint to
/// --help on stderr and return 2; --help prints the usage and returns 0; any other exception
/// prints "PROG: error: WHAT" and returns 1. With `report_usage` false (MPI ranks other than 0,
/// which parse the same flags) the usage and flag mistakes are not printed, only the status
/// returned; failures while running are printed by every process, since they may differ
/// between them.
template <class Body>
int run(App& app, int argc, char** argv, Body&& body, bool report_usage = true) noexcept {
    auto say = [&](const std::string& what) { std::fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), what.c_str()); };
    try {
        try {
            if (!app.parse(argc, argv)) {
                if (report_usage) std::printf("%s", app.help().c_str());
                return 0;
            }
#ifdef STRATA_CHECK_BUILD
            if (report_usage) std::fprintf(stderr, "%s: %s\n", app.get_name().c_str(), check_build_note);
#endif
            return std::forward<Body>(body)();
        } catch (const ParseError& e) {
            if (report_usage) {
                say(e.what());
                std::fprintf(stderr, "Run with --help for the flags and their ranges.\n");
            }
            return 2;
        }
    } catch (const std::bad_alloc&) {
        say("out of memory (std::bad_alloc)");
    } catch (const std::exception& e) {
        say(e.what());
    } catch (...) {
        say("an exception that is not a std::exception");
    }
    return 1;
}

/// A JSON value whose objects keep their keys in insertion order (reports read top to bottom
/// like the tables the programs print); `parse` reads one back (cost_model reads ping-pong's). Built like nlohmann-json's: from numbers, strings,
/// booleans, nullptr, std::vector (an array), or a braced list, which is an object when every
/// element is a [key, value] pair with a string key and an array otherwise:
///   cli::Json j = {{"cpu", cpu}, {"threads", 4}};   // {"cpu": ..., "threads": 4}
///   j["sizes"] = std::vector<double>{1, 16};        // operator[] adds a key (null becomes {})
class Json {
public:
    enum class Kind { Null, Bool, Integer, Unsigned, Real, String, Array, Object };

    Json() = default;
    Json(std::nullptr_t) {}
    Json(bool b) : kind_(Kind::Bool), int_(b) {}
    template <class I>
        requires(std::is_integral_v<I> && !std::is_same_v<I, bool> && !std::is_same_v<I, char>)
    Json(I v) {
        if constexpr (std::is_unsigned_v<I>) kind_ = Kind::Unsigned, uint_ = v;
        else kind_ = Kind::Integer, int_ = v;
    }
    Json(double v) : kind_(Kind::Real), real_(v) {}
    Json(float v) : Json(double(v)) {}
    Json(const char* s) : kind_(Kind::String), text_(s) {}
    Json(std::string s) : kind_(Kind::String), text_(std::move(s)) {}
    Json(std::string_view s) : kind_(Kind::String), text_(s) {}
    template <class T, class A>
    Json(const std::vector<T, A>& v) : kind_(Kind::Array) {
        items_.reserve(v.size());
        for (const auto& e : v) items_.emplace_back(e);
    }
    Json(std::initializer_list<Json> list) {
        const bool object = std::all_of(list.begin(), list.end(), [](const Json& e) {
            return e.kind_ == Kind::Array && e.items_.size() == 2 && e.items_[0].kind_ == Kind::String;
        });
        if (object) {
            kind_ = Kind::Object;
            for (const Json& e : list) (*this)[e.items_[0].text_] = e.items_[1];
        } else {
            kind_ = Kind::Array;
            items_.assign(list.begin(), list.end());
        }
    }

    static Json array() { Json j; j.kind_ = Kind::Array; return j; }
    static Json object() { Json j; j.kind_ = Kind::Object; return j; }

    Kind kind() const { return kind_; }
    bool is_null() const { return kind_ == Kind::Null; }
    bool is_number() const { return kind_ == Kind::Integer || kind_ == Kind::Unsigned || kind_ == Kind::Real; }
    /// Elements of an array, members of an object.
    std::size_t size() const { return kind_ == Kind::Object ? keys_.size() : items_.size(); }

    /// The member `key` of an object, added (null) when missing; a null value becomes an object.
    Json& operator[](const std::string& key) {
        if (kind_ == Kind::Null) kind_ = Kind::Object;
        if (kind_ != Kind::Object) throw std::logic_error("cli::Json: operator[] with a key on a value that is not an object");
        for (std::size_t i = 0; i < keys_.size(); ++i)
            if (keys_[i] == key) return items_[i];
        keys_.push_back(key);
        return items_.emplace_back();
    }
    Json& operator[](const char* key) { return (*this)[std::string(key)]; }

    /// Appends to an array; a null value becomes an array.
    void push_back(Json v) {
        if (kind_ == Kind::Null) kind_ = Kind::Array;
        if (kind_ != Kind::Array) throw std::logic_error("cli::Json: push_back on a value that is not an array");
        items_.push_back(std::move(v));
    }

    /// The elements of an array, or the member values of an object, in order (for range-for).
    std::vector<Json>::const_iterator begin() const { return items_.begin(); }
    std::vector<Json>::const_iterator end() const { return items_.end(); }

    /// The member `key` of an object; throws std::out_of_range when there is none.
    const Json& operator[](const std::string& key) const {
        if (kind_ == Kind::Object)
            for (std::size_t i = 0; i < keys_.size(); ++i)
                if (keys_[i] == key) return items_[i];
        throw std::out_of_range("cli::Json: no member '" + key + "'");
    }
    const Json& operator[](const char* key) const { return (*this)[std::string(key)]; }

    /// The value as a number or a string (get<double>(), get<std::int64_t>(), get<std::string>());
    /// throws std::runtime_error when it is of another kind.
    template <class T>
    T get() const {
        if constexpr (std::is_same_v<T, std::string>) {
            if (kind_ != Kind::String) throw std::runtime_error("cli::Json: expected a string");
            return text_;
        } else {
            static_assert(std::is_arithmetic_v<T>, "cli::Json::get<T>: T must be a number type or std::string");
            switch (kind_) {
            case Kind::Integer: return T(int_);
            case Kind::Unsigned: return T(uint_);
            case Kind::Real: return T(real_);
            default: throw std::runtime_error("cli::Json: expected a number");
            }
        }
    }

    /// Reads a JSON document (RFC 8259) from `in`; throws std::runtime_error naming the byte
    /// where it is not valid JSON. Objects keep their members' order.
    static Json parse(std::istream& in) {
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return parse(text);
    }
    static Json parse(std::string_view text) {
        std::size_t pos = 0;
        Json j = parse_value(text, pos, 0);
        skip_space(text, pos);
        if (pos != text.size()) parse_fail(pos, "trailing characters");
        return j;
    }

    /// The document as text, indented by `indent` spaces per level (-1: on one line). NaN and
    /// infinities are written as null; invalid UTF-8 in strings becomes U+FFFD.
    std::string dump(int indent = -1) const {
        std::string out;
        write(out, indent, 0);
        return out;
    }

private:
    void write(std::string& out, int indent, int depth) const {
        switch (kind_) {
        case Kind::Null: out += "null"; return;
        case Kind::Bool: out += int_ ? "true" : "false"; return;
        case Kind::Integer: out += std::to_string(int_); return;
        case Kind::Unsigned: out += std::to_string(uint_); return;
        case Kind::Real: {
            if (!std::isfinite(real_)) {
                out += "null";
                return;
            }
            std::string t = detail::number_text(real_);
            if (t.find_first_of(".e") == std::string::npos) t += ".0";  // stays a real number for the reader
            out += t;
            return;
        }
        case Kind::String: write_string(out, text_); return;
        case Kind::Array:
        case Kind::Object: {
            const bool object = kind_ == Kind::Object;
            out += object ? '{' : '[';
            if (items_.empty()) {
                out += object ? '}' : ']';
                return;
            }
            for (std::size_t i = 0; i < items_.size(); ++i) {
                if (i) out += ',';
                newline(out, indent, depth + 1);
                if (object) {
                    write_string(out, keys_[i]);
                    out += indent >= 0 ? ": " : ":";
                }
                items_[i].write(out, indent, depth + 1);
            }
            newline(out, indent, depth);
            out += object ? '}' : ']';
            return;
        }
        }
    }
    static void newline(std::string& out, int indent, int depth) {
        if (indent < 0) return;
        out += '\n';
        out.append(std::size_t(indent) * std::size_t(depth), ' ');
    }
    static void write_string(std::string& out, const std::string& s) {
        out += '"';
        for (std::size_t i = 0; i < s.size();) {
            const unsigned char c = static_cast<unsigned char>(s[i]);
            if (c < 0x80) {
                switch (c) {
                case '"': out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\n': out += "\\n"; break;
                case '\r': out += "\\r"; break;
                case '\t': out += "\\t"; break;
                case '\b': out += "\\b"; break;
                case '\f': out += "\\f"; break;
                default:
                    if (c < 0x20) {
                        char buf[8];
                        std::snprintf(buf, sizeof buf, "\\u%04x", c);
                        out += buf;
                    } else {
                        out += char(c);
                    }
                }
                ++i;
                continue;
            }
            const std::size_t n = utf8_length(s, i);
            if (n == 0) {
                out += "\xEF\xBF\xBD";  // U+FFFD, the replacement character
                ++i;
            } else {
                out.append(s, i, n);
                i += n;
            }
        }
        out += '"';
    }
    // The length of the well-formed UTF-8 sequence at s[i] (a lead byte >= 0x80), or 0.
    static std::size_t utf8_length(const std::string& s, std::size_t i) {
        const auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
        const unsigned char c = at(i);
        std::size_t n = 0;
        unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
        if (c >= 0xC2 && c <= 0xDF) n = 2;
        else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else return 0;
        if (i + n > s.size() || at(i + 1) < lo || at(i + 1) > hi) return 0;
        for (std::size_t k = 2; k < n; ++k)
            if (at(i + k) < 0x80 || at(i + k) > 0xBF) return 0;
        return n;
    }

    [[noreturn]] static void parse_fail(std::size_t pos, const char* what) {
        throw std::runtime_error("cli::Json::parse: invalid JSON at byte " + std::to_string(pos) + ": " + what);
    }
    static void skip_space(std::string_view t, std::size_t& pos) {
        while (pos < t.size() && (t[pos] == ' ' || t[pos] == '\n' || t[pos] == '\r' || t[pos] == '\t')) ++pos;
    }
    static Json parse_value(std::string_view t, std::size_t& pos, int depth) {
        if (depth > 256) parse_fail(pos, "nested too deeply");
        skip_space(t, pos);
        if (pos >= t.size()) parse_fail(pos, "expected a value");
        const char c = t[pos];
        if (c == '{' || c == '[') {
            const bool object = c == '{';
            Json j = object ? Json::object() : Json::array();
            ++pos;
            skip_space(t, pos);
            if (pos < t.size() && t[pos] == (object ? '}' : ']')) return ++pos, j;
            for (;;) {
                if (object) {
                    skip_space(t, pos);
                    if (pos >= t.size() || t[pos] != '"') parse_fail(pos, "expected a key");
                    std::string key = parse_string(t, pos);
                    skip_space(t, pos);
                    if (pos >= t.size() || t[pos] != ':') parse_fail(pos, "expected ':'");
                    ++pos;
                    j.keys_.push_back(std::move(key));
                }
                j.items_.push_back(parse_value(t, pos, depth + 1));
                skip_space(t, pos);
                if (pos < t.size() && t[pos] == ',') {
                    ++pos;
                    continue;
                }
                if (pos < t.size() && t[pos] == (object ? '}' : ']')) return ++pos, j;
                parse_fail(pos, object ? "expected ',' or '}'" : "expected ',' or ']'");
            }
        }
        if (c == '"') return Json(parse_string(t, pos));
        for (const auto& [word, value] : {std::pair<std::string_view, Json>{"true", true}, {"false", false}, {"null", nullptr}})
            if (t.substr(pos, word.size()) == word) return pos += word.size(), value;
        const std::size_t start = pos;
        if (pos < t.size() && t[pos] == '-') ++pos;
        const std::size_t int_start = pos;
        while (pos < t.size() && t[pos] >= '0' && t[pos] <= '9') ++pos;
        if (pos == int_start || (t[int_start] == '0' && pos - int_start > 1)) parse_fail(start, "expected a value");
        bool real = false;
        auto digits = [&] {
            const std::size_t from = pos;
            while (pos < t.size() && t[pos] >= '0' && t[pos] <= '9') ++pos;
            if (pos == from) parse_fail(pos, "expected a digit");
        };
        if (pos < t.size() && t[pos] == '.') ++pos, digits(), real = true;
        if (pos < t.size() && (t[pos] == 'e' || t[pos] == 'E')) {
            ++pos;
            if (pos < t.size() && (t[pos] == '+' || t[pos] == '-')) ++pos;
            digits();
            real = true;
        }
        const char *first = t.data() + start, *last = t.data() + pos;
        if (!real) {
            std::int64_t i = 0;
            std::uint64_t u = 0;
            if (std::from_chars(first, last, i).ec == std::errc()) return Json(i);
            if (std::from_chars(first, last, u).ec == std::errc()) return Json(u);
        }
        double d = 0;
        std::from_chars(first, last, d);  // out of range: the closest value
        return Json(d);
    }
    static std::string parse_string(std::string_view t, std::size_t& pos) {
        std::string out;
        ++pos;  // the opening quote
        auto hex4 = [&] {
            if (pos + 4 > t.size()) parse_fail(pos, "a short \\u escape");
            unsigned v = 0;
            if (std::from_chars(t.data() + pos, t.data() + pos + 4, v, 16).ptr != t.data() + pos + 4) parse_fail(pos, "a bad \\u escape");
            pos += 4;
            return v;
        };
        for (;;) {
            if (pos >= t.size()) parse_fail(pos, "an unterminated string");
            const char c = t[pos++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) parse_fail(pos - 1, "a control character in a string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (pos >= t.size()) parse_fail(pos, "an unterminated string");
            switch (const char e = t[pos++]) {
            case '"': case '\\': case '/': out += e; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'u': {
                unsigned cp = hex4();
                if (cp >= 0xD800 && cp <= 0xDBFF && t.substr(pos, 2) == "\\u") {
                    pos += 2;
                    const unsigned lo = hex4();
                    if (lo < 0xDC00 || lo > 0xDFFF) parse_fail(pos, "an unpaired surrogate");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                    parse_fail(pos, "an unpaired surrogate");
                }
                if (cp < 0x80) out += char(cp);
                else if (cp < 0x800) out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
                else if (cp < 0x10000)
                    out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
                else
                    out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F)), out += char(0x80 | ((cp >> 6) & 0x3F)),
                        out += char(0x80 | (cp & 0x3F));
                break;
            }
            default: parse_fail(pos - 1, "an unknown escape");
            }
        }
    }

    Kind kind_ = Kind::Null;
    std::int64_t int_ = 0;
    std::uint64_t uint_ = 0;
    double real_ = 0;
    std::string text_;
    std::vector<Json> items_;        // an array's elements, an object's values
    std::vector<std::string> keys_;  // an object's keys, in insertion order
};

/// Writes `doc` to `path`, indented, replacing any previous file atomically (a temporary
/// file beside it, then a rename), so a reader never sees half a report. NaN and infinities
/// become null; invalid UTF-8 in strings is replaced. Only a regular file, a symbolic link
/// (replaced, not followed) or a new name is replaced: a directory, device, FIFO or socket at
/// `path` is refused before anything is written and again just before the rename (as root,
/// `--json /dev/null` would otherwise replace the machine's /dev/null). Throws
/// std::runtime_error naming the file when it cannot be written.
inline void write_json(const std::string& path, const Json& doc) {
#ifdef STRATA_CHECK_BUILD
    // A report's object records that it came from a build for the checks (check_build_note).
    Json marked = doc;
    if (marked.kind() == Json::Kind::Object) marked["check_build"] = true;
    const std::string text = marked.dump(2) + "\n";
#else
    const std::string text = doc.dump(2) + "\n";
#endif
    // Its own name (pid) and created exclusively: a name left by a killed writer, or put there
    // by anyone, is never opened (a FIFO there would block the open, a link would be followed).
    // At most 200 bytes of the name: a name of NAME_MAX bytes must still get a temporary file.
    const std::filesystem::path target(path);
    const std::string tmp = (target.parent_path() / ("." + target.filename().string().substr(0, 200) + ".tmp." +
                                                      std::to_string(::getpid()))).string();
    const auto refuse_non_regular = [&](const char* when) {
        struct stat st {};
        if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return;
        const char* found = S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) ? "a character device"
                            : S_ISBLK(st.st_mode) ? "a block device" : S_ISFIFO(st.st_mode) ? "a FIFO"
                            : S_ISSOCK(st.st_mode) ? "a socket" : "a file that is not a regular file";
        throw std::runtime_error("cannot write the JSON report " + detail::quoted(path) +
                                 ": expected a regular file or a new name, found " + found + "; it is left as it is" + when);
    };
    refuse_non_regular("");
    // POSIX calls, so that every failure says the system's reason (a full disk is ENOSPC from a
    // write or from close; a path under a regular file is ENOTDIR).
    const auto fail = [&](const std::string& what, int err) {
        ::unlink(tmp.c_str());
        throw std::runtime_error("cannot write the JSON report " + detail::quoted(path) + ": " + what + ": " +
                                 std::generic_category().message(err));
    };
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        const int err = errno;
        throw std::runtime_error("cannot write the JSON report " + detail::quoted(path) + ": cannot create " + detail::quoted(tmp) +
                                 ": " + std::generic_category().message(err));
    }
    for (std::size_t done = 0; done < text.size();) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int err = n < 0 ? errno : EIO;
            ::close(fd);
            fail("writing " + detail::quoted(tmp) + " failed", err);
        }
        done += std::size_t(n);
    }
    if (::close(fd) != 0) {
        const int err = errno;
        fail("closing " + detail::quoted(tmp) + " failed", err);
    }
    try {
        refuse_non_regular(" (found just before the rename)");
    } catch (...) {
        ::unlink(tmp.c_str());
        throw;
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        fail("renaming " + detail::quoted(tmp) + " to it failed", err);
    }
}

/// A JSON number for `v`, or null when it is NaN or infinite (JSON has no literal for them).
/// dump writes null for those already; this makes the choice visible in the document itself
/// (e.g. for tests that inspect it before it is dumped).
inline Json finite_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

}  // namespace cli

/// The name these programs used when they were written against CLI11.
namespace CLI {
using App = cli::App;
}  // namespace CLI
