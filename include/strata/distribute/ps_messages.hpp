#pragma once
/// \file strata/distribute/ps_messages.hpp
/// The parameter server's messages across processes: their kinds, the bytes of a mini-batch
/// (a job) and of a worker's report, and the stop requests they carry. Both ends use these:
/// the coordinator (ps_transport.hpp) and the server and worker ranks (ps_ranks.hpp).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/stop_signal.hpp"
#include "strata/distribute/distributed_dataset.hpp"
#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/parameter_server_processes.hpp"

namespace strata::distribute::detail::ps_msg {

// Message kinds.
inline constexpr std::uint32_t kSendParams = 1, kParams = 2, kJob = 3, kDone = 4, kCancel = 5, kCancelled = 6, kFailed = 7,
                               kPushNow = 8, kDiscard = 9, kAdmit = 10, kPush = 11, kApply = 12, kAck = 13, kEnd = 14,
                               kState = 15, kAbort = 16, kSquares = 17, kWhole = 18;

template <class V>
void put(std::vector<std::byte>& out, const V* p, std::size_t n) {
    if (n == 0) return;  // an empty vector's data() may be null
    const auto* b = reinterpret_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n * sizeof(V));
}
template <class V>
const std::byte* get(const std::byte* in, V* p, std::size_t n) {
    if (n == 0) return in;
    std::memcpy(static_cast<void*>(p), in, n * sizeof(V));
    return in + n * sizeof(V);
}
/// A dynamic loss scale's state (optim::LossScaleState) as bytes: a server's acknowledgement and
/// its state after an epoch carry it, so that every rank's copy of the servers has it.
inline constexpr std::size_t kLossScaleBytes = sizeof(double) + 3 * sizeof(std::int64_t);
inline void put_loss_scale(std::vector<std::byte>& out, const optim::LossScaleState& st) {
    const std::int64_t counts[3] = {st.good_steps, st.skipped_steps, st.last_skipped ? 1 : 0};
    put(out, &st.scale, 1);
    put(out, counts, 3);
}
inline optim::LossScaleState get_loss_scale(const std::byte* in) {
    optim::LossScaleState st;
    std::int64_t counts[3] = {};
    in = get(in, &st.scale, 1);
    get(in, counts, 3);
    st.good_steps = counts[0];
    st.skipped_steps = counts[1];
    st.last_skipped = counts[2] != 0;
    return st;
}
inline std::span<const std::byte> text(const std::string& s) { return std::as_bytes(std::span<const char>(s.data(), s.size())); }
inline std::string text_of(const ParameterServerProcesses::Received& m) {
    return std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
}

/// A stop asked for on another rank (a signal that reached one worker, server or the
/// coordinator alone): the highest signal wins, as in the lockstep strategies' agreement.
inline void take_stop(int signal) {
    int mine = stop_signal().load();
    while (signal > mine && !stop_signal().compare_exchange_weak(mine, signal)) {
    }
}
/// The stop this rank asks for, sent with its next report (a worker's result, a server's
/// acknowledgement): the parameter server's ranks never meet in lockstep, so the coordinator
/// collects the requests and its epoch's end carries the decision to every rank.
inline std::int64_t stop_request() { return std::int64_t(stop_signal().load()); }

/// A mini-batch owned (the coordinator's copy of what `next()` gave, or a worker rank's of the
/// job it received).
template <class Y>
struct OwnedBatch {
    std::vector<float> x;
    std::vector<Y> y;
    std::vector<float> w;  // sample weights; empty when the data has none
    std::int64_t size = 0, example_size = 0, y_per_example = 1;

    void assign(const ReplicaBatch<Y>& b) {
        x.assign(b.x.begin(), b.x.end());
        y.assign(b.y.begin(), b.y.end());
        w.assign(b.w.begin(), b.w.end());
        size = b.size;
        example_size = b.example_size;
        y_per_example = b.y_per_example;
    }
    ReplicaBatch<Y> view() const {
        ReplicaBatch<Y> b;
        b.x = x;
        b.y = y;
        b.w = w;
        b.size = size;
        b.global_size = size;
        b.example_size = example_size;
        b.y_per_example = y_per_example;
        return b;
    }
    /// A job's payload.
    std::vector<std::byte> encode() const {
        std::vector<std::byte> bytes;
        const std::int64_t head[6] = {size, example_size, y_per_example, std::int64_t(x.size()), std::int64_t(y.size()),
                                      std::int64_t(w.size())};
        put(bytes, head, 6);
        put(bytes, x.data(), x.size());
        put(bytes, y.data(), y.size());
        put(bytes, w.data(), w.size());
        return bytes;
    }
    void decode(std::span<const std::byte> payload) {
        std::int64_t head[6];
        const std::byte* in = get(payload.data(), head, 6);
        size = head[0];
        example_size = head[1];
        y_per_example = head[2];
        x.resize(std::size_t(head[3]));
        y.resize(std::size_t(head[4]));
        w.resize(std::size_t(head[5]));
        in = get(in, x.data(), x.size());
        in = get(in, y.data(), y.size());
        get(in, w.data(), w.size());
    }
};

/// A worker rank's report of a finished mini-batch: its totals and its rank's stop request.
inline std::vector<std::byte> encode_done(const UnitWork& u) {
    std::vector<std::byte> done;
    put(done, &u.loss_sum, 1);
    put(done, &u.correct, 1);
    put(done, &u.examples, 1);
    const std::int64_t stop = stop_request();  // a signal here: the coordinator stops the job
    put(done, &stop, 1);
    put(done, &u.counted, 1);
    return done;
}
/// The totals of a report; its stop request taken.
inline UnitWork decode_done(const std::vector<std::byte>& payload) {
    UnitWork u;
    const std::byte* in = payload.data();
    in = get(in, &u.loss_sum, 1);
    in = get(in, &u.correct, 1);
    in = get(in, &u.examples, 1);
    std::int64_t stop = 0;
    if (payload.size() >= 4 * sizeof(std::int64_t)) in = get(in, &stop, 1);
    if (payload.size() >= 5 * sizeof(std::int64_t)) get(in, &u.counted, 1);
    take_stop(int(stop));  // the worker's rank caught a signal: stop after this update
    return u;
}

}  // namespace strata::distribute::detail::ps_msg
