// Element types of tensors kvcore reads and writes.
//
// Thread safety: plain values and pure functions; safe to use from several threads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvcore {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  E4M3,   // FP8 E4M3FN codes (scales travel separately: UE8M0 bytes or f32)
  UE8M0,  // power-of-two scale bytes, 2^(b - 127)
  E2M1,   // FP4 codes, one per byte (simulation format)
  U8,
  I32,
  I64,
};

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::E4M3: return 1;
    case DType::UE8M0: return 1;
    case DType::E2M1: return 1;
    case DType::U8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::E4M3: return "e4m3";
    case DType::UE8M0: return "ue8m0";
    case DType::E2M1: return "e2m1";
    case DType::U8: return "u8";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
  }
  return "?";
}

constexpr bool is_float16ish(DType t) { return t == DType::F16 || t == DType::BF16; }

}  // namespace kvcore
