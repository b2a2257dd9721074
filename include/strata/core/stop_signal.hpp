#pragma once
/// \file strata/core/stop_signal.hpp
/// The process-wide stop request: the number of the signal (SIGINT, SIGTERM) that asked this
/// process to stop, 0 if none. `strata::train::StopOnSignal`'s handler sets it; waits that could
/// outlast a Ctrl-C (a parameter-server worker's injected straggler delay) read it in short
/// slices, since a signal handler cannot notify a condition variable. A lock-free atomic, so it
/// may be written from a signal handler.

#include <atomic>

namespace strata {

inline std::atomic<int>& stop_signal() {
    static std::atomic<int> signal{0};
    static_assert(std::atomic<int>::is_always_lock_free, "strata::stop_signal is written from a signal handler");
    return signal;
}

}  // namespace strata
