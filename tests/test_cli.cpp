// The command-line and JSON helpers the examples and benchmarks share (tools/cli.hpp): strict
// integers and numbers, flags and --help, and JSON that stays valid whatever the figures are.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "../tools/cli.hpp"

#include <strata/io/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace {

template <class Int>
std::string why_integer(const std::string& text, Int lo, Int hi, Int* out = nullptr) {
    Int v{};
    std::string why = cli::parse_integer(text, lo, hi, v);
    if (out) *out = v;
    return why;
}

}  // namespace

TEST_CASE("cli::parse_integer takes decimal integers in range and nothing else") {
    int v = 0;
    CHECK(why_integer<int>("42", 0, 100, &v).empty());
    CHECK(v == 42);
    CHECK(why_integer<int>("+7", 0, 100, &v).empty());
    CHECK(v == 7);
    CHECK(why_integer<int>("-1", -1, 100, &v).empty());
    CHECK(v == -1);
    CHECK(why_integer<int>("010", 0, 100, &v).empty());
    CHECK(v == 10);  // decimal, not octal
    for (const char* junk : {"", " 5", "5 ", "12x", "0x10", "1e3", "1.0", "--5", "+", "-"}) {
        CAPTURE(junk);
        const auto why = why_integer<int>(junk, 0, 100);
        CHECK(why.find("expected an integer in [0, 100], found '") == 0);
    }
    CHECK(why_integer<int>("101", 0, 100) == "expected an integer in [0, 100], found '101'");
    CHECK(why_integer<int>("99999999999", 0, 100).find("(out of range)") != std::string::npos);
    std::uint64_t u = 0;
    const auto max = std::numeric_limits<std::uint64_t>::max();
    CHECK(why_integer<std::uint64_t>("18446744073709551615", 0, max, &u).empty());
    CHECK(u == max);
    CHECK(why_integer<std::uint64_t>("18446744073709551616", 0, max).find("(out of range)") != std::string::npos);
    CHECK_FALSE(why_integer<std::uint64_t>("-1", 0, max).empty());  // from_chars would wrap it
}

TEST_CASE("cli::parse_number takes finite numbers in range") {
    double v = 0;
    CHECK(cli::parse_number("0.25", 0, 1, v).empty());
    CHECK(v == 0.25);
    CHECK(cli::parse_number("1e-3", 0, 1, v).empty());
    CHECK(v == 1e-3);
    for (const char* junk : {"", "nan", "inf", "-inf", "0x1p3", "1,5", "2", "-0.5", "1 "}) {
        CAPTURE(junk);
        CHECK(cli::parse_number(junk, 0, 1, v).find("expected a number in [0, 1], found '") == 0);
    }
}

TEST_CASE("cli::run: flag mistakes exit 2 naming the flag, failures exit 1, --help exits 0") {
    auto outcome = [](std::vector<std::string> args, auto body) {
        CLI::App app{"test", "prog"};
        int n = 3;
        app.add_option("--n", n)->transform(cli::integer(1, 10));
        args.insert(args.begin(), "prog");
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        return cli::run(app, int(argv.size()), argv.data(), [&] { return body(n); });
    };
    int seen = 0;
    CHECK(outcome({"--n", "07"}, [&](int n) { seen = n; return 0; }) == 0);
    CHECK(seen == 7);
    CHECK(outcome({"--n", "0"}, [](int) { return 0; }) == 2);
    CHECK(outcome({"--n", "0x3"}, [](int) { return 0; }) == 2);
    CHECK(outcome({"--m", "1"}, [](int) { return 0; }) == 2);
    CHECK(outcome({"--help"}, [](int) { return 5; }) == 0);
    CHECK(outcome({}, [](int) -> int { throw cli::usage_error("--n: does not go with --m"); }) == 2);
    CHECK(outcome({}, [](int) -> int { throw std::runtime_error("disk full"); }) == 1);
    CHECK(outcome({}, [](int) -> int { throw 42; }) == 1);
}

TEST_CASE("cli::App: values, lists, flags, --help and the messages of refused flags") {
    auto parse = [](cli::App& app, std::vector<std::string> args) {
        args.insert(args.begin(), "prog");
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        return app.parse(int(argv.size()), argv.data());
    };
    cli::App app{"What the program does.", "prog"};
    std::string name = "x";
    std::int64_t steps = -1;
    double rate = 0.5;
    std::vector<int> sizes{1, 2};
    bool force = false, measure = true;
    app.add_option("--name", name, "a name")->capture_default_str();
    app.add_option("--steps", steps, "steps; -1: all")->transform(cli::integer<std::int64_t>(-1, 100))->capture_default_str();
    app.add_option("--rate", rate, "a rate")->check(cli::number(0, 1));
    app.add_option("--sizes", sizes, "sizes, comma-separated")->delimiter(',')->transform(cli::integer(1, 64))->capture_default_str();
    app.add_option("--mode", name, "a mode")->check(cli::one_of({"a", "b"}));
    app.add_flag("--force", force, "force it");
    app.add_flag("!--no-measure", measure, "do not measure");

    CHECK(parse(app, {"--steps", "+07", "--rate=0.25", "--sizes", "4,8", "--sizes", "16", "--force", "--no-measure"}));
    CHECK(steps == 7);
    CHECK(rate == 0.25);
    CHECK(sizes == std::vector<int>{4, 8, 16});  // the defaults are replaced, occurrences collected
    CHECK(force);
    CHECK_FALSE(measure);
    CHECK(app.count("--sizes") == 2);
    CHECK(app.count("--name") == 0);
    CHECK_FALSE(parse(app, {"--bogus", "--help"}));  // --help wins, nothing else is read

    const std::string help = app.help();
    CHECK(help.rfind("What the program does.\nUsage: prog [OPTIONS]\n", 0) == 0);
    CHECK(help.find("  -h,--help                   Print this help message and exit\n") != std::string::npos);
    CHECK(help.find("  --name TEXT=x               a name\n") != std::string::npos);
    CHECK(help.find("  --steps INT:[-1, 100]=-1    steps; -1: all\n") != std::string::npos);
    CHECK(help.find("  --sizes INT:[1, 64]=[1,2] ...\n                              sizes, comma-separated\n") !=
          std::string::npos);
    CHECK(help.find("  --mode TEXT:{a, b}") != std::string::npos);
    CHECK(help.find("  --no-measure{false}") != std::string::npos);

    auto refused = [&](std::vector<std::string> args) {
        cli::App fresh{"", "prog"};
        std::int64_t s = 0;
        bool f = false;
        fresh.add_option("--steps", s)->transform(cli::integer<std::int64_t>(-1, 100));
        fresh.add_flag("--force", f);
        try {
            parse(fresh, args);
        } catch (const cli::ParseError& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK(refused({"--steps", "0x3"}) == "--steps: expected an integer in [-1, 100], found '0x3'");
    CHECK(refused({"--steps"}) == "--steps: expects a value (INT:[-1, 100])");
    CHECK(refused({"--bogus", "1"}) == "--bogus: no such flag (see --help for the flags)");
    CHECK(refused({"extra"}).find("unexpected argument 'extra'") == 0);
    CHECK(refused({"--force=no"}) == "--force: takes no value, found 'no'");
    CHECK(refused({"--steps", "5"}).empty());
}

TEST_CASE("cli::Json: braced lists are objects when every element is a [key, value] pair") {
    cli::Json j = {{"cpu", "x"}, {"threads", 4}, {"list", {1, 2}}};
    CHECK(j.kind() == cli::Json::Kind::Object);
    CHECK(j.size() == 3);
    CHECK(j.dump() == R"({"cpu":"x","threads":4,"list":[1,2]})");
    cli::Json a = cli::Json::array();
    a.push_back({{"n", std::uint64_t(18446744073709551615ull)}, {"ok", true}, {"none", nullptr}});
    a.push_back(1.0);
    a.push_back(-2.5e-7);
    CHECK(a.dump() == R"([{"n":18446744073709551615,"ok":true,"none":null},1.0,-2.5e-07])");
    cli::Json o;
    o["a"] = 1;
    o["a"] = "again";  // an existing key keeps its place
    o["b"] = std::vector<std::string>{"p", "q"};
    CHECK(o.dump() == R"({"a":"again","b":["p","q"]})");
    CHECK(cli::Json::object().dump(2) == "{}");
    // parse reads back what dump writes (cost_model reads bench_pingpong's report).
    for (const cli::Json& doc : {j, a, o}) CHECK(cli::Json::parse(doc.dump(2)).dump() == doc.dump());
    const cli::Json p = cli::Json::parse(R"( {"s": "a\"\u00e9\ud83d\ude00", "n": -12, "x": 1.5e3, "e": []} )");
    CHECK(p["s"].get<std::string>() == "a\"\xC3\xA9\xF0\x9F\x98\x80");
    CHECK(p["n"].get<int>() == -12);
    CHECK(p["x"].get<double>() == 1500.0);
    CHECK(p["x"].is_number());
    CHECK(p["e"].size() == 0);
    CHECK_THROWS_AS(p["missing"], std::out_of_range);
    for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "01", "1 2", "\"\\x\"", "nul", "\"\\ud800\""}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(cli::Json::parse(bad), doctest::Contains("invalid JSON at byte"), std::runtime_error);
    }
}

TEST_CASE("cli::write_json writes valid JSON: non-finite numbers become null, the file is replaced whole") {
    strata_test::TempDir dir;
    const std::string path = (dir.path / "report.json").string();
    cli::Json j;
    j["finite"] = 0.5;
    j["nan"] = std::nan("");
    j["inf"] = std::numeric_limits<double>::infinity();
    j["list"] = std::vector<double>{1.0, -std::numeric_limits<double>::infinity(), 2.0};
    j["explicit"] = cli::finite_or_null(std::nan(""));
    j["text"] = std::string("quote \" backslash \\ newline \n bad utf-8 \xff");
    cli::write_json(path, j);
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (const char* literal : {": nan", ": -nan", ": inf", ": -inf", "NaN", "Infinity"}) {
        CAPTURE(literal);
        CHECK(text.find(literal) == std::string::npos);
    }
    strata::io::json::Reader back(text, "report.json");
    back.validate();  // throws on invalid JSON
    back.enter();
    std::vector<std::string> keys;
    for (std::string key; back.next_member(key);) {
        keys.push_back(key);
        if (key == "finite") CHECK(back.read_number() == "0.5");
        else if (key == "nan" || key == "inf" || key == "explicit") CHECK(back.kind() == strata::io::json::Kind::Null);
        else if (key == "text") CHECK(back.read_string() == "quote \" backslash \\ newline \n bad utf-8 \xEF\xBF\xBD");
        if (key != "finite" && key != "text") back.skip_value();
    }
    CHECK(keys == std::vector<std::string>{"finite", "nan", "inf", "list", "explicit", "text"});  // insertion order kept
    CHECK(text.find("[\n    1.0,\n    null,\n    2.0\n  ]") != std::string::npos);
    CHECK(dir.entries() == std::vector<std::string>{"report.json"});  // no temporary file left
    CHECK_THROWS_WITH_AS(cli::write_json((dir.path / "no" / "such" / "dir.json").string(), j),
                         doctest::Contains("cannot write the JSON report"), std::runtime_error);
}

// Issue 41: write_json renamed over anything but a directory; `--json /dev/null` as root would
// have replaced /dev/null. A FIFO stands in for it (and as root a character device of our own).
TEST_CASE("cli::write_json refuses a FIFO or device at the path and leaves it as it was") {
    strata_test::TempDir dir;
    cli::Json j;
    j["x"] = 1;
    std::vector<std::pair<std::string, std::string>> nodes;
    const std::string fifo = (dir.path / "fifo.json").string();
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    nodes.push_back({fifo, "found a FIFO"});
    const std::string dev = (dir.path / "null.json").string();
    if (::geteuid() == 0 && ::mknod(dev.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) == 0) nodes.push_back({dev, "found a character device"});
    for (const auto& [node, found] : nodes) {
        CAPTURE(node);
        struct stat before {};
        REQUIRE(::lstat(node.c_str(), &before) == 0);
        std::string msg;
        try {
            cli::write_json(node, j);
        } catch (const std::runtime_error& e) {
            msg = e.what();
        }
        CHECK(msg.find("expected a regular file or a new name, " + found) != std::string::npos);
        struct stat after {};
        REQUIRE(::lstat(node.c_str(), &after) == 0);
        CHECK(after.st_ino == before.st_ino);
        CHECK(after.st_mode == before.st_mode);
    }
    for (const auto& e : dir.entries()) CHECK(e.find(".tmp") == std::string::npos);
    // The negative control: a regular file is replaced.
    const std::string plain = (dir.path / "plain.json").string();
    std::ofstream(plain) << "old";
    cli::write_json(plain, j);
    std::ifstream in(plain);
    std::string first;
    in >> first;
    CHECK(first == "{");
}
