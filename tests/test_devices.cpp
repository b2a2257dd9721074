// Devices (tf.config in C++): listing, visible devices, logical host devices, name resolution
// with and without soft placement, the placement log, DeviceScope, and the memory policies.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <strata/distribute/strategy.hpp>
#include <strata/place/devices.hpp>
#include <strata/tensor/tensor_all.hpp>

namespace pd = strata::place;
using strata::Tensor;

namespace {

constexpr std::size_t MiB = 1024 * 1024;

// Every case starts from, and leaves, the default configuration, with log and sink reset.
struct Fresh {
    std::vector<std::string> lines;
    std::mutex mu;
    Fresh() {
        pd::reset_devices();
        pd::set_soft_device_placement(true);
        pd::set_log_device_placement(false);
        pd::set_placement_log_sink([this](std::string_view l) {
            std::lock_guard lock(mu);
            lines.emplace_back(l);
        });
    }
    ~Fresh() {
        pd::set_placement_log_sink({});
        pd::set_log_device_placement(false);
        pd::set_soft_device_placement(true);
        pd::reset_devices();
    }
    Fresh(const Fresh&) = delete;
    Fresh& operator=(const Fresh&) = delete;
};

pd::PhysicalDevice host() { return pd::list_physical_devices(pd::DeviceKind::Cpu).front(); }

std::string message_of(auto&& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no exception)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// This thread's OpenMP team size (1, and unchangeable, in a build without OpenMP).
int team() { return strata::num_threads(); }
void set_team([[maybe_unused]] int n) {
#if STRATA_HAS_OPENMP
    omp_set_num_threads(n);
#endif
}
// What a DeviceScope with `cores` makes of the team size in this build.
int expected_team(int cores) { return STRATA_HAS_OPENMP ? cores : 1; }

}  // namespace

TEST_CASE("the host is the one CPU device; a g++ build lists no GPU") {
    Fresh fresh;
    const auto all = pd::list_physical_devices();
    REQUIRE(all.size() == 1);
    const auto& cpu = all.front();
    CHECK(cpu.name == "/physical_device:CPU:0");
    CHECK(cpu.kind == pd::DeviceKind::Cpu);
    CHECK(cpu.index == 0);
    CHECK(cpu.cores == strata::hardware_threads());
    CHECK(cpu.memory_bytes > 64 * MiB);
    CHECK_FALSE(cpu.description.empty());
    CHECK(pd::list_physical_devices(pd::DeviceKind::Gpu).empty());
    CHECK(pd::list_physical_devices(pd::DeviceKind::Cpu).size() == 1);

    const auto logical = pd::list_logical_devices();
    REQUIRE(logical.size() == 1);
    CHECK(logical[0].name == "/device:CPU:0");
    CHECK(logical[0].cores == cpu.cores);
    CHECK(logical[0].physical_index == 0);
    CHECK(logical[0].memory_limit == 0);
    CHECK_FALSE(pd::devices_initialized());  // listing does not initialise
}

TEST_CASE("visible devices: the CPU always stays; an unknown device is named in the error") {
    Fresh fresh;
    CHECK(pd::get_visible_devices() == pd::list_physical_devices());
    pd::set_visible_devices({});
    REQUIRE(pd::get_visible_devices().size() == 1);
    CHECK(pd::get_visible_devices().front().name == "/physical_device:CPU:0");
    pd::set_visible_devices({host()});
    CHECK(pd::get_visible_devices(pd::DeviceKind::Gpu).empty());

    pd::PhysicalDevice ghost{"/physical_device:GPU:7", pd::DeviceKind::Gpu, 7, 0, 0, {}};
    const auto msg = message_of([&] { pd::set_visible_devices({host(), ghost}); });
    CHECK(contains(msg, "/physical_device:GPU:7"));
    CHECK(contains(msg, "available: /physical_device:CPU:0"));
    CHECK_THROWS_AS(pd::set_visible_devices({ghost}), strata::DeviceError);
}

TEST_CASE("logical host devices: two halves, named in order, cores split") {
    Fresh fresh;
    const int hw = strata::hardware_threads();
    pd::set_logical_device_configuration(host(), {{}, {}}, hw < 2 ? pd::Oversubscribe::Yes : pd::Oversubscribe::No);
    const auto devs = pd::list_logical_devices(pd::DeviceKind::Cpu);
    REQUIRE(devs.size() == 2);
    CHECK(devs[0].name == "/device:CPU:0");
    CHECK(devs[1].name == "/device:CPU:1");
    CHECK(devs[1].index == 1);
    CHECK(devs[1].physical_index == 0);
    CHECK(devs[0].cores == std::max(1, (hw + 1) / 2));
    CHECK(devs[1].cores == std::max(1, hw / 2));
    const auto resolved = pd::get_logical_device_configuration(host());
    REQUIRE(resolved.size() == 2);
    CHECK(resolved[0].cores == devs[0].cores);

    // Explicit counts are kept; an empty list goes back to one device.
    pd::set_logical_device_configuration(host(), {{.cores = 1}, {.cores = 1}}, pd::Oversubscribe::Yes);
    CHECK(pd::list_logical_devices()[1].cores == 1);
    pd::set_logical_device_configuration(host(), {});
    CHECK(pd::list_logical_devices().size() == 1);
}

TEST_CASE("Mirrored and CentralStorage on_all_devices take one replica per logical host device") {
    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1}, {.cores = 1}, {.cores = 1}}, pd::Oversubscribe::Yes);
    auto mirrored = strata::distribute::Mirrored<>::on_all_devices();
    auto central = strata::distribute::CentralStorage<>::on_all_devices();
    static_assert(std::is_same_v<decltype(mirrored), strata::distribute::Mirrored<>>);
    static_assert(std::is_same_v<decltype(central), strata::distribute::CentralStorage<>>);
    CHECK(mirrored.num_replicas_in_sync() == 3);
    CHECK(central.num_replicas_in_sync() == 3);
    CHECK(std::string(decltype(central)::name) == "CentralStorage");
}

TEST_CASE("logical host devices: four, with and without oversubscription") {
    Fresh fresh;
    const int hw = strata::hardware_threads();
    if (hw >= 4) {
        pd::set_logical_device_configuration(host(), {{}, {}, {}, {}});
    } else {
        const auto msg = message_of([&] { pd::set_logical_device_configuration(host(), {{}, {}, {}, {}}); });
        CHECK(contains(msg, "need 4 cores"));
        CHECK(contains(msg, "has " + std::to_string(hw) + " hardware threads"));
        CHECK(contains(msg, "Oversubscribe::Yes"));
        CHECK(pd::list_logical_devices().size() == 1);  // nothing changed
        pd::set_logical_device_configuration(host(), {{}, {}, {}, {}}, pd::Oversubscribe::Yes);
    }
    const auto devs = pd::list_logical_devices();
    REQUIRE(devs.size() == 4);
    int total = 0;
    for (int i = 0; i < 4; ++i) {
        CHECK(devs[i].name == "/device:CPU:" + std::to_string(i));
        CHECK(devs[i].cores >= 1);
        total += devs[i].cores;
    }
    CHECK(total == std::max(4, hw));

    // Explicit counts over the budget: both numbers in the message.
    const auto msg = message_of([&] { pd::set_logical_device_configuration(host(), {{.cores = hw}, {.cores = 1}}); });
    CHECK(contains(msg, "need " + std::to_string(hw + 1) + " cores"));
    CHECK(contains(msg, std::to_string(hw) + " hardware threads"));
    CHECK_THROWS_AS(pd::set_logical_device_configuration(host(), {{.cores = -1}}), strata::ValueError);
    CHECK_THROWS_AS(pd::set_logical_device_configuration(host(), {{.cores = 1, .memory_limit = pd::Bytes{100}}}),
                    strata::ValueError);
    const auto too_much = message_of([&] {
        pd::set_logical_device_configuration(host(), {{.cores = 1, .memory_limit = pd::Bytes{host().memory_bytes + 1}}});
    });
    CHECK(contains(too_much, "memory limits of /physical_device:CPU:0 add up to"));
}

TEST_CASE("configuration is frozen by the first DeviceScope, and reset_devices thaws it") {
    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1}, {.cores = 1}}, pd::Oversubscribe::Yes);
    CHECK_FALSE(pd::devices_initialized());
    { pd::DeviceScope scope("/device:CPU:1"); }
    CHECK(pd::devices_initialized());
    const auto msg = message_of([&] { pd::set_logical_device_configuration(host(), {{}}); });
    CHECK(contains(msg, "already initialised"));
    CHECK(contains(msg, "the first DeviceScope, on /device:CPU:1"));
    CHECK_THROWS_AS(pd::set_memory_growth(host(), true), strata::DeviceError);
    CHECK_THROWS_AS(pd::set_visible_devices({host()}), strata::DeviceError);
    CHECK(pd::list_logical_devices().size() == 2);  // listing still works

    {
        pd::DeviceScope scope("cpu:0");
        const auto busy = message_of([] { pd::reset_devices(); });
        CHECK(contains(busy, "expected no active DeviceScope, found 1"));
    }
    pd::reset_devices();
    CHECK_FALSE(pd::devices_initialized());
    CHECK(pd::list_logical_devices().size() == 1);
    pd::set_memory_growth(host(), true);
    CHECK(pd::get_memory_growth(host()));

    pd::initialize_devices("a test strategy");
    CHECK(contains(message_of([&] { pd::set_memory_growth(host(), false); }), "a test strategy"));
}

TEST_CASE("find_device: the spellings of a name") {
    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1}, {.cores = 1}}, pd::Oversubscribe::Yes);
    for (const char* name : {"/device:CPU:1", "device:CPU:1", "CPU:1", "/cpu:1", "cpu:1", " /Device:cpu:1 "})
        CHECK(pd::find_device(name).name == "/device:CPU:1");
    for (const char* name : {"cpu", "CPU", "/cpu:0", "/device:CPU:0"}) CHECK(pd::find_device(name).name == "/device:CPU:0");
    for (const char* name : {"tpu:0", "gpu:x", "cpu:", "/device:", "", "cpu:1:2", "gpux"})
        CHECK_THROWS_AS(pd::find_device(name), strata::ValueError);
    CHECK(contains(message_of([] { pd::find_device("tpu:0"); }), "\"tpu:0\""));
    CHECK(fresh.lines.empty());
}

TEST_CASE("find_device: soft placement falls back to CPU:0 with a warning; without, an error") {
    Fresh fresh;
    const auto d = pd::find_device("/device:GPU:3");
    CHECK(d.name == "/device:CPU:0");
    REQUIRE(fresh.lines.size() == 1);
    CHECK(fresh.lines[0] == "strata: soft placement: /device:GPU:3 is not available; using /device:CPU:0");
    CHECK(pd::find_device("cpu:5").name == "/device:CPU:0");
    CHECK(fresh.lines.size() == 2);

    pd::set_soft_device_placement(false);
    CHECK_FALSE(pd::get_soft_device_placement());
    const auto msg = message_of([] { pd::find_device("gpu:3"); });
    CHECK(contains(msg, "/device:GPU:3 is not available"));
    CHECK(contains(msg, "available: /device:CPU:0"));
    CHECK_THROWS_AS(pd::find_device("/gpu:0"), strata::DeviceError);
    CHECK(pd::find_device("cpu").name == "/device:CPU:0");
    CHECK_THROWS_AS(pd::DeviceScope("/device:GPU:0"), strata::DeviceError);
}

TEST_CASE("placement log: whole lines, only when on, from many threads") {
    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1}, {.cores = 1}}, pd::Oversubscribe::Yes);
    const auto devs = pd::list_logical_devices();
    pd::log_placement("dense/kernel", devs[1]);
    CHECK(fresh.lines.empty());

    pd::set_log_device_placement(true);
    CHECK(pd::get_log_device_placement());
    strata::Tensor<float> a({64}), b({64});
    pd::log_placement("tensor a", devs[0]);
    pd::log_placement("tensor b", devs[1]);
    REQUIRE(fresh.lines.size() == 2);
    CHECK(fresh.lines[0] == "tensor a placed on /device:CPU:0");
    CHECK(fresh.lines[1] == "tensor b placed on /device:CPU:1");

    fresh.lines.clear();
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < 100; ++i) pd::log_placement("replica " + std::to_string(t) + " step", devs[t % 2]);
        });
    for (auto& t : threads) t.join();
    REQUIRE(fresh.lines.size() == 400);
    for (const auto& l : fresh.lines) {
        CHECK(l.starts_with("replica "));
        CHECK((l.ends_with(" step placed on /device:CPU:0") || l.ends_with(" step placed on /device:CPU:1")));
    }
}

TEST_CASE("DeviceScope sets and restores this thread's OpenMP team size and current device") {
    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1}, {.cores = 3}}, pd::Oversubscribe::Yes);
    int fresh_thread = -1;
    std::thread([&] { fresh_thread = team(); }).join();
    set_team(2);
    const int outside = team();
    CHECK(pd::current_device().name == "/device:CPU:0");
    {
        pd::DeviceScope outer("/device:CPU:1");
        CHECK(team() == expected_team(3));
        CHECK(pd::current_device().name == "/device:CPU:1");
        CHECK(outer.device().cores == 3);
        {
            pd::DeviceScope inner(pd::find_device("cpu:0"));
            CHECK(team() == expected_team(1));
            CHECK(pd::current_device().name == "/device:CPU:0");
        }
        CHECK(team() == expected_team(3));
        CHECK(pd::current_device().name == "/device:CPU:1");
        int other = -1;
        std::string other_device;
        std::thread([&] {
            other = team();
            other_device = pd::current_device().name;
        }).join();
        CHECK(other == fresh_thread);  // another thread is not in this scope
        CHECK(other_device == "/device:CPU:0");
    }
    CHECK(team() == outside);
    CHECK(pd::current_device().name == "/device:CPU:0");
    set_team(strata::hardware_threads());

    // A device from an earlier configuration is refused.
    const auto stale = pd::list_logical_devices()[1];
    pd::reset_devices();
    CHECK(contains(message_of([&] { pd::DeviceScope s(stale); }), "/device:CPU:1 is not a logical device"));
}

TEST_CASE("memory: the default (direct) policy counts what tensors take in a scope") {
    Fresh fresh;
    const auto cpu0 = pd::find_device("cpu:0");
    CHECK(pd::memory_policy(cpu0) == pd::MemoryPolicy::Direct);
    CHECK(pd::memory_info(cpu0).current == 0);
    Tensor<float> outside({1000});  // outside any scope: not counted
    {
        pd::DeviceScope scope(cpu0);
        Tensor<float> t({1000});  // 4000 bytes -> 4032
        CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
        CHECK(pd::memory_info(cpu0).current == 4032);
        outside = Tensor<float>();  // a plain block freed inside a scope: still fine
    }
    const auto info = pd::memory_info("/device:CPU:0");
    CHECK(info.current == 0);
    CHECK(info.peak == 4032);
    CHECK(info.reserved == 0);
    pd::reset_memory_stats(cpu0);
    CHECK(pd::memory_info(cpu0).peak == 0);
    CHECK_THROWS_AS(pd::memory_info("/device:CPU:9"), strata::DeviceError);
}

TEST_CASE("memory growth: a caching pool reuses freed blocks, so the peak stays put") {
    Fresh fresh;
    pd::set_memory_growth(host(), true);
    const auto cpu0 = pd::find_device("cpu:0");
    CHECK(pd::memory_policy(cpu0) == pd::MemoryPolicy::Growth);
    pd::DeviceScope scope(cpu0);
    const void* first = nullptr;
    for (int i = 0; i < 100; ++i) {
        Tensor<float> t({256 * 1024});  // 1 MiB
        if (!first) first = t.data();
        CHECK(t.data() == first);
        CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
    }
    auto info = pd::memory_info(cpu0);
    CHECK(info.current == 0);
    CHECK(info.peak == 1 * MiB);
    CHECK(info.reserved == 1 * MiB);

    // Two live at once grow the pool; sizes of one class share blocks.
    {
        Tensor<float> a({256 * 1024}), b({250 * 1024});
        CHECK(pd::memory_info(cpu0).current == 2 * MiB);
    }
    info = pd::memory_info(cpu0);
    CHECK(info.peak == 2 * MiB);
    CHECK(info.reserved == 2 * MiB);
    CHECK(pd::CachingPool::size_class(1) == 256);
    CHECK(pd::CachingPool::size_class(257) == 320);
    CHECK(pd::CachingPool::size_class(1000) == 1024);
    CHECK(pd::CachingPool::size_class(1025) == 1280);
    CHECK(pd::CachingPool::size_class(3 * MiB) == 3 * MiB);
}

TEST_CASE("memory growth with a limit: cached blocks are given back before it throws") {
    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1, .memory_limit = pd::Megabytes{4}}}, pd::Oversubscribe::Yes);
    pd::set_memory_growth(host(), true);
    pd::DeviceScope scope("cpu");
    { Tensor<std::uint8_t> a({3 * MiB}); }  // cached
    Tensor<std::uint8_t> b({2 * MiB});       // needs the cached 3 MiB back first
    CHECK(pd::memory_info("cpu:0").reserved == 2 * MiB);
    const auto msg = message_of([] { Tensor<std::uint8_t> c({3 * MiB}); });
    CHECK(msg == "/device:CPU:0: out of its 4 MiB memory limit: requested 3 MiB with 2 MiB in use");
}

TEST_CASE("memory limits carry their unit: Megabytes as tf.config counts them, or Bytes") {
    static_assert(pd::MemoryLimit(pd::Megabytes{1024}).bytes() == std::size_t(1) << 30);  // tf's memory_limit=1024
    static_assert(pd::MemoryLimit(pd::Bytes{4096}).bytes() == 4096);
    static_assert(pd::MemoryLimit{}.bytes() == 0 && !pd::MemoryLimit{});
    static_assert(pd::MemoryLimit(pd::Megabytes{1}) == pd::MemoryLimit(pd::Bytes{MiB}));
    // A bare number does not convert (tests/compile_fail/memory_limit_without_unit.cpp checks the message).
    static_assert(!std::is_convertible_v<pd::Bytes, pd::Megabytes>);
    CHECK_THROWS_WITH_AS(pd::MemoryLimit(pd::Megabytes{std::numeric_limits<std::size_t>::max()}),
                         doctest::Contains("does not fit in a size_t of bytes"), strata::ValueError);

    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1, .memory_limit = pd::Megabytes{3}},
                                                  {.cores = 1, .memory_limit = pd::Bytes{5 * MiB + 64}},
                                                  {.cores = 1}},
                                         pd::Oversubscribe::Yes);
    const auto configs = pd::get_logical_device_configuration(host());
    REQUIRE(configs.size() == 3);
    CHECK(configs[0].memory_limit.bytes() == 3 * MiB);
    CHECK(configs[1].memory_limit == pd::MemoryLimit(pd::Bytes{5 * MiB + 64}));
    CHECK(!configs[2].memory_limit);
    CHECK(pd::find_device("/device:CPU:0").memory_limit == 3 * MiB);
    CHECK(pd::find_device("/device:CPU:1").memory_limit == 5 * MiB + 64);
    CHECK(pd::find_device("/device:CPU:2").memory_limit == 0);
    CHECK(pd::memory_info(pd::find_device("/device:CPU:0")).limit == 3 * MiB);
    pd::reset_devices();
    const auto small = message_of([&] {
        pd::set_logical_device_configuration(host(), {{.cores = 1, .memory_limit = pd::Bytes{100}}}, pd::Oversubscribe::Yes);
    });
    CHECK(contains(small, "has a memory limit of 100 bytes; expected none or at least Bytes{"));
}

TEST_CASE("fixed memory limit: reserved up front, blocks carved, the overflow named with numbers") {
    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1, .memory_limit = pd::Megabytes{256}}, {.cores = 1}},
                                         pd::Oversubscribe::Yes);
    const auto gpu_like = pd::find_device("/device:CPU:0");
    CHECK(gpu_like.memory_limit == 256 * MiB);
    CHECK(pd::memory_policy(gpu_like) == pd::MemoryPolicy::Fixed);
    CHECK(pd::memory_info(gpu_like).reserved == 0);
    pd::DeviceScope scope(gpu_like);
    CHECK(pd::memory_info(gpu_like).reserved == 256 * MiB);
    CHECK(pd::memory_info(gpu_like).limit == 256 * MiB);

    Tensor<std::uint8_t> big({200 * MiB}), more({30 * MiB});
    CHECK(reinterpret_cast<std::uintptr_t>(more.data()) % 64 == 0);
    CHECK(pd::memory_info(gpu_like).current == 230 * MiB);
    bool threw = false;
    try {
        Tensor<std::uint8_t> over({64 * MiB});
    } catch (const strata::DeviceError& e) {
        threw = true;
        CHECK(std::string(e.what()) == "/device:CPU:0: out of its 256 MiB memory limit: requested 64 MiB with 230 MiB in use");
    }
    CHECK(threw);
    CHECK(pd::memory_info(gpu_like).current == 230 * MiB);  // the failed request took nothing

    // Freed neighbours merge: after freeing all, one block of the whole arena fits.
    big = Tensor<std::uint8_t>();
    more = Tensor<std::uint8_t>();
    {
        std::vector<Tensor<float>> pieces;
        for (int i = 0; i < 64; ++i) pieces.emplace_back(strata::Shape{1024 * 1024});  // 64 x 4 MiB
        CHECK(pd::memory_info(gpu_like).current == 256 * MiB);
        CHECK_THROWS_AS(Tensor<float>({64}), strata::DeviceError);
        for (int i = 0; i < 64; i += 2) pieces[i] = Tensor<float>();  // every other one: fragmented
        const auto frag = message_of([] { Tensor<std::uint8_t> t({8 * MiB}); });
        CHECK(contains(frag, "the largest free block is 4 MiB"));
    }
    Tensor<std::uint8_t> whole({256 * MiB});
    CHECK(pd::memory_info(gpu_like).peak == 256 * MiB);
}

TEST_CASE("a block freed in another scope or on another thread goes back to its owner") {
    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1, .memory_limit = pd::Megabytes{8}}, {.cores = 1}},
                                         pd::Oversubscribe::Yes);
    pd::set_memory_growth(host(), false);
    const auto devs = pd::list_logical_devices();
    Tensor<float> from_cpu0, from_cpu1;
    std::thread([&] {
        pd::DeviceScope a(devs[0]);
        from_cpu0 = Tensor<float>({1024});
        pd::DeviceScope b(devs[1]);
        from_cpu1 = Tensor<float>({2048});
    }).join();
    CHECK(pd::memory_info(devs[0]).current == 4096);
    CHECK(pd::memory_info(devs[1]).current == 8192);
    {
        pd::DeviceScope other(devs[1]);
        from_cpu0 = Tensor<float>();  // freed in CPU:1's scope, back to CPU:0's arena
    }
    CHECK(pd::memory_info(devs[0]).current == 0);
    std::thread([t = std::move(from_cpu1)]() mutable { t = Tensor<float>(); }).join();  // freed outside any scope
    CHECK(pd::memory_info(devs[1]).current == 0);
    CHECK(pd::memory_info(devs[1]).peak == 8192);
}

TEST_CASE("replicas allocate concurrently in their own scopes; the totals are exact") {
    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1}, {.cores = 1}, {.cores = 1}, {.memory_limit = pd::Megabytes{64}}},
                                         pd::Oversubscribe::Yes);
    pd::set_memory_growth(host(), true);
    const auto devs = pd::list_logical_devices();
    std::vector<std::vector<Tensor<float>>> kept(devs.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < devs.size(); ++r)
        threads.emplace_back([&, r] {
            pd::DeviceScope scope(devs[r]);
            for (int i = 0; i < 200; ++i) {
                Tensor<float> scratch({std::int64_t(100 + 37 * (i % 11))});
                if (i % 20 == 0) kept[r].emplace_back(strata::Shape{1000});
            }
        });
    for (auto& t : threads) t.join();
    for (std::size_t r = 0; r < devs.size(); ++r) CHECK(pd::memory_info(devs[r]).current == 10 * 4096);
    // Free everything on the main thread, crosswise.
    for (auto& v : kept) v.clear();
    for (const auto& d : devs) CHECK(pd::memory_info(d).current == 0);
}

TEST_CASE("reset_devices while tensors still hold device memory: they stay valid and are freed later") {
    Fresh fresh;
    pd::set_logical_device_configuration(host(), {{.cores = 1, .memory_limit = pd::Megabytes{1}}}, pd::Oversubscribe::Yes);
    Tensor<float> survivor;
    {
        pd::DeviceScope scope("cpu:0");
        survivor = Tensor<float>({1000});
        strata::fill(survivor.view(), 3.0f);
    }
    pd::reset_devices();
    CHECK(pd::memory_info("cpu:0").current == 0);  // the new configuration starts clean
    CHECK(survivor[999] == 3.0f);
    survivor = Tensor<float>();  // back to the retired arena, which then frees itself
}
