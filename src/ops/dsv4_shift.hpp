// The DeepSeek-V4 context shift of one sequence (docs/specs/dsv4-context-shift.md), below
// Dsv4Cache::shift, which checks every argument first: nothing here rejects its input.
//
// Three parts, all ordered on one stream:
//   - attention rows of CSA and HCA layers: the dense shift kernels of ops/shift_params.hpp
//     (in place, overlap handled, bf16 tails of packed rows rotated), one call per ratio, with
//     rows as the unit of the move and -n_discard tokens as the angle;
//   - raw rings and indexer rows: "row jobs" (below): each job copies runs of rows from a
//     source to a destination, rotating the RoPE tail of each row on the way (and for FP4
//     indexer rows: dequantize, Hadamard, rotate, Hadamard, requantize);
//   - nothing for compressor states (the aligned cut leaves them valid as they are).
// Where a job's sources and destinations would overlap (a ring whose rows permute, indexer
// rows moving less than their own count), the sources are first snapshotted into scratch.
#pragma once
#include <cstdint>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/math/rope.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"

namespace kvcore::ops {

// How a job's rows are stored, i.e. what moving one does.
enum class Dsv4ShiftRowKind : int32_t {
  F32 = 0,        // plain f32 values: rotate the tail pairs
  F16 = 1,        // plain f16 values (quantized raw rings)
  Fp4Packed = 2,  // indexer rows, Hadamard domain, packed FP4 (dim/2 nibble bytes + dim/32 UE8M0)
  Fp4F32 = 3,     // indexer rows, Hadamard domain, FP4 values held as f32
};

// Row r in [0, n_rows) of a job reads source row (src_row0 + r) and writes destination row
// (dst_row0 + r), both taken modulo `modulus` when it is > 0 (a ring). Rows are row_bytes
// apart in both. rotate == 0: the row is copied byte for byte.
struct Dsv4ShiftJob {
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  int64_t row_bytes = 0;
  int32_t src_row0 = 0, dst_row0 = 0, n_rows = 0, modulus = 0;
  int32_t dim = 0;  // values per row
  Dsv4ShiftRowKind kind = Dsv4ShiftRowKind::F32;
  int32_t rotate = 0;
  int32_t pair_offset = 0;  // first entry of this job's pairs in cos_t / sin_t
  math::RopeLayout layout;  // which dims rotate (a tail slice of dim)
};

// What the backends run. Arrays are in the memory of the device that runs them (host for the
// CPU; the CUDA launcher receives device copies).
struct Dsv4ShiftJobsParams {
  const Dsv4ShiftJob* jobs = nullptr;
  const int64_t* row_start = nullptr;  // [n_jobs + 1]: prefix sums of n_rows
  int32_t n_jobs = 0;
  int64_t total_rows = 0;
  const float* cos_t = nullptr;        // cos / sin of -n_discard * w_i, all tables concatenated
  const float* sin_t = nullptr;
  int32_t device_index = 0;
};

// One layer of the sequence as the shift sees it (views of the cache's storage).
struct Dsv4ShiftLayerViews {
  TensorRef ring;                          // [window, head_dim] f16 or f32
  const math::RopeTable* raw_rope = nullptr;  // the RoPE of this layer's raw rows
  int32_t ratio = 0;                       // 0: window-only
  TensorRef rows;                          // CSA/HCA: [cap, 584] u8 or [cap, head_dim] f32
  TensorRef idx_rows;                      // CSA: [cap, packed] u8 or [cap, index_dim] f32; else empty
};

struct Dsv4ShiftCall {
  std::vector<Dsv4ShiftLayerViews> layers;
  const math::RopeTable* comp_rope = nullptr;  // compressed attention rows
  const math::RopeTable* idx_rope = nullptr;   // indexer rows
  bool quant = false, rows_packed = false, idx_packed = false;
  int32_t window = 0, head_dim = 0, index_dim = 0;
  int64_t length = 0, n_keep = 0, n_discard = 0;  // tokens; all checked, n_discard > 0
  Device device;
  Stream stream;
};

// Runs the shift. `scratch` is grown (reallocated) when too small, before anything is written:
// an allocation failure leaves the cache untouched.
void dsv4_shift_sequence(const Dsv4ShiftCall& call, Buffer& scratch);

}  // namespace kvcore::ops

namespace kvcore::cpu {
void dsv4_shift_jobs(const ops::Dsv4ShiftJobsParams& p);
}  // namespace kvcore::cpu

namespace kvcore::ops::cuda {
void dsv4_shift_jobs(const ops::Dsv4ShiftJobsParams& p, Stream stream);
}  // namespace kvcore::ops::cuda
