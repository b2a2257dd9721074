#pragma once
/// \file strata/core/error.hpp
/// The run-time error hierarchy. Every failure a user can cause at run time (a file, a shape
/// read from data, a device that is not there, a peer that did not arrive) throws a subclass of
/// strata::Error whose message says what was expected and what was found.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace strata {

/// Base of every exception strata throws. Catch this to catch them all.
class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A tensor or layer got a shape it cannot take: the message names the op and both shapes.
class ShapeError : public Error { public: using Error::Error; };
/// A value out of its allowed range (a learning rate < 0, a batch size of 0, an unknown flag).
class ValueError : public Error { public: using Error::Error; };
/// Reading or writing a file failed, or a file is not what it claims to be.
class IoError : public Error { public: using Error::Error; };
/// A device is missing, out of memory, or a driver call failed.
class DeviceError : public Error { public: using Error::Error; };
/// A collective or a peer failed: a timeout (naming who did not arrive) or a replica that threw.
class DistributedError : public Error { public: using Error::Error; };
/// A checkpoint cannot be used: wrong format version, missing tensor, shapes that differ, a
/// value that is NaN or infinite.
class CheckpointError : public IoError { public: using IoError::IoError; };
/// Training produced a value that is not finite (a NaN or infinite loss or weight): the message
/// says where (epoch, batch, the parameter and its index).
class NumericError : public Error { public: using Error::Error; };

namespace detail {
template <class... Args>
[[gnu::cold, gnu::noinline]] std::string concat(const Args&... args) {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
}
}  // namespace detail

/// Throws E with the pieces streamed into one message: `throw_error<ShapeError>("dense: ", a)`.
/// Kept out of line and marked cold: error paths must cost the hot paths nothing, in run time
/// or in compile time (they are not inlined into every caller).
template <class E = Error, class... Args>
[[noreturn, gnu::cold, gnu::noinline]] void throw_error(Args... args) {  // by value: literals decay, fewer instantiations
    throw E(detail::concat(args...));
}

}  // namespace strata

/// Always-on precondition on user input: throws `Type` with the streamed message when `cond` fails.
#define STRATA_CHECK(cond, Type, ...)                                  \
    do {                                                               \
        if (!(cond)) [[unlikely]] ::strata::throw_error<Type>(__VA_ARGS__); \
    } while (0)
