// DeepSeek-V4's packed KV row: 448 FP8 E4M3 nope values, the 64-dim rope tail
// in 16 bits (bf16 as DeepSeek stores it), 7 UE8M0 scales (one per 64 nope
// values) and 1 pad byte: 584 bytes, against 2048 as f32 and 1024 as f16.
#pragma once
#include <cstdint>

#include "kvcore/math/hd.hpp"

namespace kvcore::math {

struct Dsv4RowLayout {
  static constexpr int32_t kHeadDim = 512;
  static constexpr int32_t kNope = 448;
  static constexpr int32_t kRope = 64;
  static constexpr int32_t kBlocks = kNope / 64;                   // 7 scales
  static constexpr int32_t kNopeOffset = 0;                        // 448 e4m3 bytes
  static constexpr int32_t kRopeOffset = kNope;                    // 64 x 16-bit
  static constexpr int32_t kScaleOffset = kRopeOffset + 2 * kRope;  // 7 ue8m0 bytes
  static constexpr int32_t kPadOffset = kScaleOffset + kBlocks;     // 1 byte
  static constexpr int32_t kBytes = kPadOffset + 1;                 // 584
};
static_assert(Dsv4RowLayout::kBytes == 584, "DeepSeek-V4 packed row must be 584 bytes");

}  // namespace kvcore::math
