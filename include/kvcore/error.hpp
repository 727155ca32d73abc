// kvcore::Error: every failure of a public entry point. The message names the
// argument and its value; the state the call was given is left unchanged.
//
// Thread safety: plain values and pure functions; safe to use from several threads.
#pragma once
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvcore {

enum class ErrorCode { InvalidArgument, OutOfMemory, NotSupported, Corrupt, DeviceError };

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(std::string(error_code_name(code)) + ": " + message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Lazy message parts: described(x) and shape_of(t) stream x.describe() / t.shape_str() only
// when a check fails, so validation on a hot path (one attention call per layer and token)
// builds no strings. Use them for message parts; they hold a reference, not a copy.
template <class T>
struct Described {
  const T& x;
};
template <class T>
Described<T> described(const T& x) {
  return {x};
}
template <class T>
std::ostream& operator<<(std::ostream& os, const Described<T>& d) {
  return os << d.x.describe();
}
template <class T>
struct ShapeOf {
  const T& x;
};
template <class T>
ShapeOf<T> shape_of(const T& x) {
  return {x};
}
template <class T>
std::ostream& operator<<(std::ostream& os, const ShapeOf<T>& d) {
  return os << d.x.shape_str();
}

// require(cond, code, "what", value, ...): throw Error(code, concatenated message) unless cond.
template <class... Args>
inline void require(bool cond, ErrorCode code, Args&&... message_parts) {
  if (!cond) throw Error(code, detail::concat(std::forward<Args>(message_parts)...));
}

template <class... Args>
inline void require_arg(bool cond, Args&&... message_parts) {
  require(cond, ErrorCode::InvalidArgument, std::forward<Args>(message_parts)...);
}

}  // namespace kvcore
