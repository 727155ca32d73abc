// Device: where memory lives and where an op runs.
//
// Thread safety: plain values and pure functions; safe to use from several threads.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

namespace kvcore {

enum class DeviceKind : uint8_t { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static constexpr Device cpu() { return {DeviceKind::CPU, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceKind::CUDA, i}; }
  constexpr bool is_cpu() const { return kind == DeviceKind::CPU; }
  constexpr bool is_cuda() const { return kind == DeviceKind::CUDA; }
  constexpr bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace kvcore
