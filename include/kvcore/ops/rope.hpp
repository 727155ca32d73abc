// rope_apply: rotate rows x[tokens, heads, head_dim] at per-token positions.
//
//   x          f32, f16 or bf16 [tokens, heads, head_dim]; tokens and heads may have any
//              non-negative strides, the last dim must be contiguous (stride 1).
//   positions  i32 or i64 [tokens] (any non-negative stride), on x's device. Negative
//              positions are allowed and mean rotation by a negative angle: R(-p) undoes
//              R(p), and rotating by a delta is rope_apply at "position" delta. A position
//              becomes f32 before the angle is formed (as HF does), exact for |p| <= 2^24.
//   spec       which dims rotate, how they pair, the frequencies (rope_spec.hpp); it must
//              fit head_dim. The table overloads take a prebuilt math::RopeTable instead.
//   factor     Apply: cos and sin are multiplied by the spec's attention_factor (YaRN
//              mscale: what a model does when it writes keys and queries). Skip: a pure
//              rotation (what a shift or an inverse rotation needs; never re-apply it).
//   out        same shape and dtype as x, on x's device, any non-negative strides with a
//              contiguous last dim. It receives the whole row: rotated dims rotated, the
//              others copied bit for bit. Omit it (or pass x itself) to rotate in place,
//              which touches only the rotated dims. A partially overlapping out is rejected.
//
// Each pair is computed in f32 (angle = f32(position) * f32 freq, sin/cos rounded from
// double, rotation in f32) and rounded once to the storage type; the CPU and CUDA backends
// run the same math (math/rope.hpp) and produce identical bits for finite inputs (a NaN
// input gives NaN; its payload may differ between backends).
//
// Every argument is checked first: a bad one throws kvcore::Error(InvalidArgument) naming
// it and its value (NotSupported for a CUDA tensor in a CPU-only build) and nothing is
// written. CUDA work is ordered on `stream` and not synchronized.
//
// Thread safety: calls may come from several threads at once (what they cache per device is
// guarded) as long as no call writes memory that another one reads or writes.
#pragma once
#include <cstdint>

#include "kvcore/math/rope.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore {

enum class RopeAttentionFactor : uint8_t { Skip, Apply };

// In place.
void rope_apply(const TensorRef& x, const TensorRef& positions, const RopeSpec& spec, RopeAttentionFactor factor,
                Stream stream = {});
// Into out (out may be x itself).
void rope_apply(const TensorRef& x, const TensorRef& positions, const RopeSpec& spec, RopeAttentionFactor factor,
                const TensorRef& out, Stream stream = {});

// The same with a prebuilt table (make_rope_table(spec, head_dim)); its layout must fit
// head_dim, its frequencies be finite and its attention_factor finite and > 0.
void rope_apply(const TensorRef& x, const TensorRef& positions, const math::RopeTable& table,
                RopeAttentionFactor factor, Stream stream = {});
void rope_apply(const TensorRef& x, const TensorRef& positions, const math::RopeTable& table,
                RopeAttentionFactor factor, const TensorRef& out, Stream stream = {});

}  // namespace kvcore
