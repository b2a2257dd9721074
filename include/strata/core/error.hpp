#pragma once
/// \file strata/core/error.hpp
/// The run-time error hierarchy. Every failure a user can cause at run time (a file, a shape
/// read from data, a device that is not there, a peer that did not arrive) throws a subclass of
/// strata::Error whose message says what was expected and what was found.

#include <algorithm>
#include <charconv>
#include <concepts>
#include <cstdio>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "strata/config.hpp"

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

/// One piece of an error message, as text: a view of a string argument, or a number formatted
/// as an ostream would (integers in decimal, floating point like "%g", bool as 0/1, a char as
/// itself). Trivially destructible, so that building a message costs every throw site little
/// code; everything else goes through message_source first.
class MessagePiece {
public:
    MessagePiece(const char* s) noexcept : data_(s ? s : ""), size_(s ? std::char_traits<char>::length(s) : 0) {}
    MessagePiece(char* s) noexcept : MessagePiece(static_cast<const char*>(s)) {}
    MessagePiece(std::string_view s) noexcept : data_(s.data()), size_(s.size()) {}
    MessagePiece(const std::string& s) noexcept : data_(s.data()), size_(s.size()) {}
    MessagePiece(char c) noexcept : size_(1) { buf_[0] = c; }
    MessagePiece(signed char c) noexcept : MessagePiece(char(c)) {}
    MessagePiece(unsigned char c) noexcept : MessagePiece(char(c)) {}
    MessagePiece(bool b) noexcept : MessagePiece(b ? '1' : '0') {}
    MessagePiece(int v) noexcept : MessagePiece(static_cast<long long>(v)) {}
    MessagePiece(long v) noexcept : MessagePiece(static_cast<long long>(v)) {}
    STRATA_DECL MessagePiece(long long v) noexcept;
    MessagePiece(unsigned v) noexcept : MessagePiece(static_cast<unsigned long long>(v)) {}
    MessagePiece(unsigned long v) noexcept : MessagePiece(static_cast<unsigned long long>(v)) {}
    STRATA_DECL MessagePiece(unsigned long long v) noexcept;
    MessagePiece(short v) noexcept : MessagePiece(static_cast<long long>(v)) {}
    MessagePiece(unsigned short v) noexcept : MessagePiece(static_cast<unsigned long long>(v)) {}
    MessagePiece(float v) noexcept : MessagePiece(double(v)) {}
    STRATA_DECL MessagePiece(double v) noexcept;
    STRATA_DECL MessagePiece(long double v) noexcept;

    std::string_view view() const noexcept { return data_ ? std::string_view(data_, size_) : std::string_view(buf_, size_); }

private:
    void set(const char* end) noexcept { size_ = std::size_t(end - buf_); }
    void set_size(int n) noexcept { size_ = n < 0 ? 0 : std::min<std::size_t>(std::size_t(n), sizeof buf_ - 1); }

    const char* data_ = nullptr;  // null: the text is in buf_
    std::size_t size_ = 0;
    char buf_[40];
};

/// Whether MessagePiece takes a T directly.
template <class T>
concept MessageText = std::is_arithmetic_v<T> || std::is_convertible_v<const T&, std::string_view> ||
                      std::is_same_v<T, const char*> || std::is_same_v<T, char*>;

/// Streams anything else (a Shape, a path, an enum) into a string, as `os << v` writes it.
template <class T>
[[gnu::cold, gnu::noinline]] std::string stream_text(const T& v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

/// What a MessagePiece is made from: `v` itself, or its streamed text (a temporary that lives
/// until the end of the full expression that builds the message).
template <class T>
decltype(auto) message_source(const T& v) {
    if constexpr (MessageText<T>) return (v);
    else return stream_text(v);
}

/// The pieces, one after the other.
[[gnu::cold]] STRATA_DECL std::string join_message(std::initializer_list<MessagePiece> pieces);

/// The pieces streamed into one string: `concat("expected ", n, ", found ", shape)`.
template <class... Args>
std::string concat(const Args&... args) {
    return join_message({MessagePiece(message_source(args))...});
}

/// Throws E with the joined pieces: one instantiation per exception type, whatever the pieces.
template <class E>
[[noreturn, gnu::cold, gnu::noinline]] void throw_joined(std::initializer_list<MessagePiece> pieces) {
    throw E(join_message(pieces));
}

}  // namespace detail

/// Throws E with the pieces streamed into one message: `throw_error<ShapeError>("dense: ", a)`.
/// Kept out of line and marked cold: error paths must cost the hot paths nothing, in run time
/// or in compile time (they are not inlined into every caller, and each argument list costs
/// only the conversion of its pieces: the message is joined and thrown by one function per
/// exception type).
template <class E = Error, class... Args>
[[noreturn, gnu::cold, gnu::noinline]] void throw_error(Args... args) {  // by value: literals decay, fewer instantiations
    detail::throw_joined<E>({detail::MessagePiece(detail::message_source(args))...});
}

#if STRATA_INSTANCES
// Every exception type's throw, compiled once in the compiled part.
namespace detail {
STRATA_TEMPLATE void throw_joined<Error>(std::initializer_list<MessagePiece>);
STRATA_TEMPLATE void throw_joined<ShapeError>(std::initializer_list<MessagePiece>);
STRATA_TEMPLATE void throw_joined<ValueError>(std::initializer_list<MessagePiece>);
STRATA_TEMPLATE void throw_joined<IoError>(std::initializer_list<MessagePiece>);
STRATA_TEMPLATE void throw_joined<DeviceError>(std::initializer_list<MessagePiece>);
STRATA_TEMPLATE void throw_joined<DistributedError>(std::initializer_list<MessagePiece>);
STRATA_TEMPLATE void throw_joined<CheckpointError>(std::initializer_list<MessagePiece>);
STRATA_TEMPLATE void throw_joined<NumericError>(std::initializer_list<MessagePiece>);
}  // namespace detail
#endif

}  // namespace strata

#if STRATA_DEFINITIONS
#include "strata/core/impl/error.ipp"
#endif

/// Always-on precondition on user input: throws `Type` with the streamed message when `cond` fails.
#define STRATA_CHECK(cond, Type, ...)                                  \
    do {                                                               \
        if (!(cond)) [[unlikely]] ::strata::throw_error<Type>(__VA_ARGS__); \
    } while (0)
