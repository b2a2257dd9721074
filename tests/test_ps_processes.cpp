// ParameterServer across processes (parameter_server_mpi.hpp), run by `mpirun -np 4`
// (tests/meson.build): 1 coordinator, 1 server, 2 workers. Under the virtual clock every sync
// mode gives the weights of the same parameter server in one process, bit for bit, on every rank.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cstring>
#include <string>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>
#include <strata/distribute/parameter_server_mpi.hpp>

using namespace strata::nn;
namespace sd = strata::distribute;
namespace ss = strata::sync;
namespace coll = strata::distribute::collective;

namespace {

using Net = Sequential<Input<8>, Dense<16, ReLU>, Dense<3, Softmax>>;

strata::data::Dataset<> data(std::size_t n) {
    auto f64 = strata_test::lcg(n * 8, 17, 0, 1);
    std::vector<float> x(f64.begin(), f64.end());
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((x[i * 8] + x[i * 8 + 3] > 1.0f) + (x[i * 8 + 5] > 0.5f));
    return strata::data::Dataset<>::from_arrays(std::move(x), {8}, std::move(y)).batch(6);
}

struct SyncCase {
    ss::Rule rule;
    int k, bound;
    const char* name;
};

struct Trained {
    std::vector<float> weights;
    std::int64_t updates = 0, cancelled = 0, staleness_max = 0;
};

Trained train(const SyncCase& m, bool processes) {
    sd::ParameterServerOptions o;
    o.clock = sd::Clock::Virtual;
    o.stragglers = sd::Stragglers::exponential(0.01);
    o.straggler_seed = 3;
    o.rule = m.rule;
    o.k = m.k;
    o.staleness_bound = m.bound;
    o.timeout = std::chrono::seconds(20);
    if (processes) o.processes = sd::parameter_server_processes(2, 1, o.timeout);
    sd::ParameterServer<strata::place::Host, ss::Any> ps(2, 1, o);
    strata::Model<Net, decltype(ps)> model(ps, 7);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    model.fit(data(60), {.epochs = 2, .verbose = 0});
    if (processes) CHECK(model.is_chief() == (coll::mpi::world_rank() == 0));
    const auto& st = model.gradient_path().stats();
    return {model.get_weights(), st.updates, st.cancelled, st.staleness_max};
}

bool same_on_every_rank(std::vector<float> v) {
    auto root = v;
    MPI_Bcast(root.data(), int(root.size() * sizeof(float)), MPI_BYTE, 0, MPI_COMM_WORLD);
    int same = std::memcmp(root.data(), v.data(), v.size() * sizeof(float)) == 0;
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return same == 1;
}

}  // namespace

TEST_CASE("every sync mode across 4 processes (1 server, 2 workers) equals the same parameter server in one process") {
    REQUIRE(coll::mpi::world_size() == 4);
    std::vector<std::vector<float>> results;
    for (const SyncCase& m : {SyncCase{ss::Rule::Synchronous, 0, -1, "sync"}, SyncCase{ss::Rule::KSync, 1, -1, "ksync 1"},
                          SyncCase{ss::Rule::KBatchSync, 2, -1, "kbatch_sync 2"}, SyncCase{ss::Rule::KAsync, 1, -1, "kasync 1"},
                          SyncCase{ss::Rule::KBatchAsync, 2, -1, "kbatch_async 2"}, SyncCase{ss::Rule::Asynchronous, 0, -1, "async"},
                          SyncCase{ss::Rule::Asynchronous, 0, 1, "async bound 1"}}) {
        CAPTURE(m.name);
        const auto across = train(m, true);
        const auto local = train(m, false);
        CHECK(across.weights == local.weights);
        CHECK(same_on_every_rank(across.weights));
        if (coll::mpi::world_rank() == 0) {  // the coordinator's schedule is the in-process one
            CHECK(across.updates == local.updates);
            CHECK(across.cancelled == local.cancelled);
            CHECK(across.staleness_max == local.staleness_max);
            CHECK(across.updates > 0);
        }
        results.push_back(across.weights);
    }
    // The check can fail: the modes train differently.
    CHECK(results.front() != results.back());
    CHECK(results[0] != results[1]);
}

TEST_CASE("a job of the wrong size is refused on every rank, naming both counts") {
    const auto msg = strata_test::error_of<strata::ValueError>([] { (void)sd::parameter_server_processes(3, 1, std::chrono::seconds(5)); });
    CHECK(msg.find("1 coordinator, 1 server and 3 workers need 5 processes (mpirun -np 5), found 4") != std::string::npos);
}

TEST_CASE("a rank with other settings is refused on every rank, naming the setting and who has what") {
    REQUIRE(coll::mpi::world_size() == 4);
    const bool odd = coll::mpi::world_rank() == 3;  // the last worker
    const auto t = std::chrono::seconds(20);
    auto options = [&](int bound) {
        sd::ParameterServerOptions o;
        o.clock = sd::Clock::Virtual;
        o.rule = ss::Rule::Asynchronous;
        o.staleness_bound = bound;
        o.timeout = t;
        o.processes = sd::parameter_server_processes(2, 1, t);
        return o;
    };
    auto error = [](auto&& f) { return strata_test::error_of<strata::ValueError>(f); };
    auto says = [](const std::string& msg, const std::string& part) {
        CAPTURE(msg);
        CHECK(msg.find(part) != std::string::npos);
    };
    // When they join: workers and servers (before the job's size is checked against them).
    says(error([&] { (void)sd::parameter_server_processes(odd ? 1 : 2, odd ? 2 : 1, t); }),
         "workers: ranks 0, 1, 2 have 2, rank 3 has 1; servers: ranks 0, 1, 2 have 1, rank 3 has 2");
    // The strategy's settings (the mode with its bound) and the program's own.
    says(error([&] { sd::ParameterServer<strata::place::Host, ss::Any> ps(2, 1, options(odd ? 2 : -1)); }),
         "sync mode: ranks 0, 1, 2 have Asynchronous<-1>, rank 3 has Asynchronous<2>");
    says(error([&] {
             auto o = options(-1);
             o.settings = {{"--batch-size", odd ? "12" : "6"}};
             sd::ParameterServer<strata::place::Host, ss::Any> ps(2, 1, o);
         }),
         "--batch-size: ranks 0, 1, 2 have 6, rank 3 has 12");
    // The model's initial variables (another seed) and the optimizer.
    says(error([&] {
             sd::ParameterServer<strata::place::Host, ss::Any> ps(2, 1, options(-1));
             strata::Model<Net, decltype(ps)> model(ps, odd ? 8 : 7);
         }),
         "initial variables (the seed's): ranks 0, 1, 2 have ");
    says(error([&] {
             sd::ParameterServer<strata::place::Host, ss::Any> ps(2, 1, options(-1));
             strata::Model<Net, decltype(ps)> model(ps, 7);
             model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = odd ? 0.02 : 0.01});
         }),
         "optimizer: ranks 0, 1, 2 have Adam(learning_rate=0.01, ");
    // Agreed settings train as before.
    sd::ParameterServer<strata::place::Host, ss::Any> ps(2, 1, options(-1));
    strata::Model<Net, decltype(ps)> model(ps, 7);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    model.fit(data(24), {.epochs = 1, .verbose = 0});
    CHECK(same_on_every_rank(model.get_weights()));
}
