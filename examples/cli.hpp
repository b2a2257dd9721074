#pragma once
// Small helpers the examples share: "--flag value" parsing with clear errors, and a flat JSON
// writer for the --json FILE reports. Not part of the library.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace example {

// A JSON string literal for `s` (quotes, backslashes and control characters escaped).
inline std::string json_quote(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

class Args {
public:
    Args(int argc, char** argv, std::map<std::string, std::string> defaults, std::string usage)
        : values_(std::move(defaults)), usage_(std::move(usage)) {
        for (int i = 1; i < argc; ++i) {
            std::string a = argv[i];
            if (a == "-h" || a == "--help") {
                std::printf("%s", usage_.c_str());
                std::exit(0);
            }
            if (a.rfind("--", 0) != 0 || !values_.count(a.substr(2))) fail("unknown argument '" + a + "'");
            if (i + 1 >= argc) fail("'" + a + "' needs a value");
            values_[a.substr(2)] = argv[++i];
        }
    }
    std::string str(const std::string& k) const { return values_.at(k); }
    long long num(const std::string& k) const {
        const auto& v = values_.at(k);
        char* end = nullptr;
        const long long x = std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || *end) fail("--" + k + " takes an integer, got '" + v + "'");
        return x;
    }
    [[noreturn]] void fail(const std::string& why) const {
        std::fprintf(stderr, "error: %s\n\n%s", why.c_str(), usage_.c_str());
        std::exit(2);
    }

private:
    std::map<std::string, std::string> values_;
    std::string usage_;
};

// A JSON object of numbers, strings and number arrays, written in insertion order.
class Json {
public:
    void num(const std::string& k, double v) {
        char b[64];
        std::snprintf(b, sizeof b, "%.10g", v);
        items_.emplace_back(k, b);
    }
    void str(const std::string& k, const std::string& v) { items_.emplace_back(k, json_quote(v)); }
    void array(const std::string& k, const std::vector<double>& v) {
        std::string s = "[";
        char b[64];
        for (std::size_t i = 0; i < v.size(); ++i) {
            std::snprintf(b, sizeof b, "%s%.10g", i ? ", " : "", v[i]);
            s += b;
        }
        items_.emplace_back(k, s + "]");
    }
    void raw(const std::string& k, const std::string& json) { items_.emplace_back(k, json); }
    std::string text() const {
        std::string s = "{\n";
        for (std::size_t i = 0; i < items_.size(); ++i)
            s += "  \"" + items_[i].first + "\": " + items_[i].second + (i + 1 < items_.size() ? ",\n" : "\n");
        return s + "}\n";
    }
    bool write(const std::string& path) const {
        std::FILE* f = std::fopen(path.c_str(), "w");
        if (!f) return false;
        const auto t = text();
        const bool ok = std::fwrite(t.data(), 1, t.size(), f) == t.size();
        return std::fclose(f) == 0 && ok;
    }

private:
    std::vector<std::pair<std::string, std::string>> items_;
};

}  // namespace example
