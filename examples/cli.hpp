#pragma once
// What the examples and the benchmarks share for their command lines and their --json reports.
// Flags are read by CLI11 and JSON is written by nlohmann-json: both are well-kept libraries
// (Debian's libcli11-dev and nlohmann-json3-dev), and neither is strata's business, so only
// these programs depend on them; the headers under include/strata never include them.
//
// The pieces, and why each exists:
//   cli::integer<T>(lo, hi)  CLI11 reads integers with strtoll(base 0): "010" is octal, "0x10"
//                            is hex, and "99999999999999999999" saturates without an error.
//                            This validator takes decimal digits only, checks overflow and the
//                            range, and hands CLI11 the canonical text.
//   cli::number(lo, hi)      the same for real numbers: finite, in range, no trailing junk.
//   cli::usage_error(msg)    a mistake between flags found after parsing (--replicas 2 with
//                            one_device): reported exactly like a parse error.
//   cli::run(app, ...)       parses, runs the program, and turns every exception into a
//                            readable message: bad flags exit 2 (with a hint to --help), any
//                            other failure exits 1. Nothing escapes main unexplained.
//   cli::Json, write_json    insertion-ordered JSON; NaN and infinities are written as null (JSON
//                            has no literal for them) and the file is replaced atomically;
//                            a failure names the step (create, write, close, rename) and the
//                            system's reason (strerror).
// Standard library, CLI11 and nlohmann-json only: bench_mpi_allreduce uses it without strata.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace cli {

/// A JSON document whose object keys keep the order they were inserted in (reports read top
/// to bottom like the tables the programs print).
using Json = nlohmann::ordered_json;

namespace detail {
inline std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }
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
        return "expected a number in [" + CLI::detail::to_string(lo) + ", " + CLI::detail::to_string(hi) +
               "], found " + detail::quoted(text);
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

/// A CLI11 validator: the option's text must be a decimal integer in [lo, hi] (see
/// parse_integer). It rewrites the text to its canonical form, so that CLI11's own conversion
/// (strtoll with base 0, which would read "010" as octal) sees plain decimal.
///   app.add_option("--epochs", epochs)->transform(cli::integer(1, 1'000'000));
template <class Int>
CLI::Validator integer(Int lo, Int hi) {
    return CLI::Validator(
        [lo, hi](std::string& text) {
            Int v{};
            std::string why = parse_integer(text, lo, hi, v);
            if (why.empty()) text = std::to_string(v);
            return why;
        },
        "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]", "integer");
}

/// A CLI11 validator: the text must be a finite number in [lo, hi] (see parse_number).
inline CLI::Validator number(double lo, double hi) {
    return CLI::Validator(
        [lo, hi](std::string& text) {
            double v = 0;
            return parse_number(text, lo, hi, v);
        },
        "[" + CLI::detail::to_string(lo) + ", " + CLI::detail::to_string(hi) + "]", "number");
}

/// A CLI11 validator: the text must be one of `choices` (spelled exactly).
///   app.add_option("--strategy", s)->check(cli::one_of({"one_device", "mirrored"}));
inline CLI::Validator one_of(std::vector<std::string> choices) {
    std::string list;
    for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
    return CLI::Validator(
        [choices, list](std::string& text) {
            for (const auto& c : choices)
                if (text == c) return std::string();
            return "expected one of " + list + "; found " + detail::quoted(text);
        },
        "{" + list + "}", "one_of");
}

/// A mistake in the flags found after parsing (two flags that do not go together): thrown from
/// the body of cli::run, it is reported like a parse error and the program exits 2.
inline CLI::ValidationError usage_error(const std::string& what) { return CLI::ValidationError(what); }

/// Parses the command line with `app` and runs `body` (returning the exit status). Bad flags,
/// from CLI11 or a usage_error thrown by `body`, print "PROG: error: WHY" and a hint to --help on
/// stderr and return 2; --help prints the usage and returns 0; any other exception prints
/// "PROG: error: WHAT" and returns 1. With `report_usage` false (MPI ranks other than 0, which
/// parse the same flags) the usage and flag mistakes are not printed, only the status returned;
/// failures while running are printed by every process, since they may differ between them.
template <class Body>
int run(CLI::App& app, int argc, char** argv, Body&& body, bool report_usage = true) noexcept {
    const std::string prog = app.get_name();
    auto say = [&](const std::string& what) { std::fprintf(stderr, "%s: error: %s\n", prog.c_str(), what.c_str()); };
    try {
        try {
            app.parse(argc, argv);
            return std::forward<Body>(body)();
        } catch (const CLI::CallForHelp&) {
            if (report_usage) std::printf("%s", app.help().c_str());
            return 0;
        } catch (const CLI::ParseError& e) {
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

/// Writes `doc` to `path`, indented, replacing any previous file atomically (a temporary
/// file beside it, then a rename), so a reader never sees half a report. NaN and infinities
/// become null; invalid UTF-8 in strings is replaced rather than thrown on. Throws
/// std::runtime_error naming the file when it cannot be written.
inline void write_json(const std::string& path, const Json& doc) {
    const std::string text = doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    const std::string tmp = path + ".tmp";
    // POSIX calls, so that every failure says the system's reason (a full disk is ENOSPC from a
    // write or from close; a path under a regular file is ENOTDIR).
    const auto fail = [&](const std::string& what, int err) {
        std::error_code ignore;
        std::filesystem::remove(tmp, ignore);
        throw std::runtime_error("cannot write the JSON report " + detail::quoted(path) + ": " + what + ": " +
                                 std::generic_category().message(err));
    };
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        fail("renaming " + detail::quoted(tmp) + " to it failed", err);
    }
}

/// A JSON number for `v`, or null when it is NaN or infinite (JSON has no literal for them).
/// nlohmann-json's dump writes null for those already; this makes the choice visible in the
/// document itself (e.g. for tests that inspect it before it is dumped).
inline Json finite_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

}  // namespace cli
