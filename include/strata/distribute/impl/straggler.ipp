#pragma once
/// \file strata/distribute/impl/straggler.ipp
/// The definitions behind strata/distribute/straggler.hpp: included by it in the header-only
/// mode, compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <charconv>
#include <sstream>
#include <system_error>

#include "strata/distribute/straggler.hpp"

namespace strata::distribute {

STRATA_DECL Stragglers Stragglers::parse(std::string_view spec) {
    if (spec.empty())
        throw_error<ValueError>("Stragglers::parse: empty value; expected none | slow:WORKER:FACTOR | exp:MEAN_MS | "
                                "sexp:SHIFT_MS:MEAN_MS (times in milliseconds)");
    std::vector<std::string_view> parts;
    for (std::size_t start = 0;;) {
        const auto colon = spec.find(':', start);
        parts.push_back(spec.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
        if (colon == std::string_view::npos) break;
        start = colon + 1;
    }
    auto fail = [&](const auto&... why) -> void {
        throw_error<ValueError>("Stragglers::parse: cannot read \"", spec, "\": ", why...,
                                "; accepted forms: none, slow:WORKER:FACTOR, exp:MEAN_MS, "
                                "sexp:SHIFT_MS:MEAN_MS (times in milliseconds)");
    };
    auto arity = [&](std::size_t n) {
        if (parts.size() != n)
            fail("\"", parts[0], "\" takes ", n - 1, n == 2 ? " number" : " numbers", ", found ", parts.size() - 1);
    };
    auto number = [&](std::string_view text, const char* name, double lo, bool lo_included, double hi) {
        double x = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
        const bool ok = !text.empty() && ec == std::errc() && end == text.data() + text.size() && std::isfinite(x) &&
                        (lo_included ? x >= lo : x > lo) && x <= hi;
        if (!ok)
            fail(name, " must be a finite number ", lo_included ? ">= " : "> ", lo, " and <= ", hi, ", found \"", text, "\"");
        return x;
    };
    const double max_ms = max_seconds * 1000.0;
    const auto head = parts[0];
    if (head == "none") {
        arity(1);
        return none();
    }
    if (head == "slow") {
        arity(3);
        int worker = 0;
        const auto w = parts[1];
        const auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), worker);
        if (w.empty() || ec != std::errc() || end != w.data() + w.size() || worker < 0)
            fail("WORKER must be an integer >= 0, found \"", w, "\"");
        return slow(worker, number(parts[2], "FACTOR", 1.0, true, max_factor));
    }
    if (head == "exp") {
        arity(2);
        return exponential(number(parts[1], "MEAN_MS", 0.0, false, max_ms) / 1000.0);
    }
    if (head == "sexp") {
        arity(3);
        const double shift = number(parts[1], "SHIFT_MS", 0.0, true, max_ms);
        return shifted_exponential(shift / 1000.0, number(parts[2], "MEAN_MS", 0.0, false, max_ms) / 1000.0);
    }
    fail("unknown model \"", head, "\"");
    return {};  // not reached: fail throws
}

STRATA_DECL void Stragglers::validate(int workers) const {
    STRATA_CHECK(workers >= 1, ValueError, "Stragglers: expected at least 1 worker, found ", workers);
    if (kind_ != Kind::Slow) return;
    if (slow_worker_ >= 0)
        STRATA_CHECK(slow_worker_ < workers, ValueError, "Stragglers ", describe(), ": worker ", slow_worker_,
                     " does not exist; expected a worker index in [0, ", workers, ")");
    else
        STRATA_CHECK(factors_.size() == std::size_t(workers), ValueError, "Stragglers ", describe(),
                     ": expected one slowdown factor per worker (", workers, "), found ", factors_.size());
}

STRATA_DECL std::string Stragglers::describe() const {
    std::ostringstream os;
    switch (kind_) {
    case Kind::None: os << "none"; break;
    case Kind::Slow:
        if (slow_worker_ >= 0) {
            os << "slow: worker " << slow_worker_ << " ×" << factors_[0];
        } else {
            os << "slow: ×{";
            for (std::size_t i = 0; i < factors_.size(); ++i) os << (i ? ", " : "") << factors_[i];
            os << "}";
        }
        break;
    case Kind::Exponential: os << "Exp(mean " << mean_ * 1000.0 << " ms)"; break;
    case Kind::ShiftedExponential: os << shift_ * 1000.0 << " ms + Exp(mean " << mean_ * 1000.0 << " ms)"; break;
    }
    return os.str();
}

}  // namespace strata::distribute
