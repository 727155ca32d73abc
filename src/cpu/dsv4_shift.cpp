// CPU row jobs of the DeepSeek-V4 context shift (ops/dsv4_shift.hpp): one row at a time,
// rows in parallel (each writes its own destination row; sources are snapshots, disjoint
// from every destination, or the row itself). The arithmetic is the shared one of
// math/shift_rotate.hpp, math/hadamard.hpp and math/fp4.hpp, which the CUDA kernel follows
// operation for operation: the same bits.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kvcore/math/dsv4.hpp"
#include "kvcore/math/shift_rotate.hpp"
#include "ops/dsv4_shift.hpp"

namespace kvcore::cpu {
namespace {

using ops::Dsv4ShiftJob;
using ops::Dsv4ShiftRowKind;

constexpr int64_t kParallelMin = 256;  // rows below which one thread does the work

int64_t wrap(int64_t row, int32_t modulus) { return modulus > 0 ? row % modulus : row; }

// Dequantize a row of FP4 indexer values (Hadamard domain) into x.
void load_fp4(const Dsv4ShiftJob& j, const uint8_t* src, float* x) {
  if (j.kind == Dsv4ShiftRowKind::Fp4Packed) {
    for (int32_t d = 0; d < j.dim; ++d) x[d] = math::dsv4_unpack_fp4_value(src, j.dim, d);
  } else {
    std::memcpy(x, src, static_cast<size_t>(j.dim) * sizeof(float));
  }
}

void store_fp4(const Dsv4ShiftJob& j, float* x, uint8_t* dst) {
  if (j.kind == Dsv4ShiftRowKind::Fp4Packed) {
    math::dsv4_pack_fp4_row(x, j.dim, dst);
  } else {
    math::dsv4_fp4_round_trip(x, j.dim);
    std::memcpy(dst, x, static_cast<size_t>(j.dim) * sizeof(float));
  }
}

void shift_row(const Dsv4ShiftJob& j, int64_t r, const float* cos_t, const float* sin_t, std::vector<uint8_t>& buf) {
  const uint8_t* src = j.src + wrap(j.src_row0 + r, j.modulus) * j.row_bytes;
  uint8_t* dst = j.dst + wrap(j.dst_row0 + r, j.modulus) * j.row_bytes;
  if (!j.rotate) {
    if (src != dst) std::memcpy(dst, src, static_cast<size_t>(j.row_bytes));
    return;
  }
  const float* c = cos_t + j.pair_offset;
  const float* s = sin_t + j.pair_offset;
  const math::ShiftSerialLanes lanes;
  buf.resize(std::max<size_t>(buf.size(), static_cast<size_t>(std::max<int64_t>(j.row_bytes, j.dim * 4))));
  switch (j.kind) {
    case Dsv4ShiftRowKind::F32:
    case Dsv4ShiftRowKind::F16:
      std::memcpy(buf.data(), src, static_cast<size_t>(j.row_bytes));
      if (j.kind == Dsv4ShiftRowKind::F32)
        math::shift_rotate_head_plain(reinterpret_cast<float*>(buf.data()), 0, j.layout, c, s, lanes);
      else
        math::shift_rotate_head_plain(reinterpret_cast<f16*>(buf.data()), 0, j.layout, c, s, lanes);
      std::memcpy(dst, buf.data(), static_cast<size_t>(j.row_bytes));
      return;
    case Dsv4ShiftRowKind::Fp4Packed:
    case Dsv4ShiftRowKind::Fp4F32: {
      // x = H y (back to the plain domain: H is its own inverse), rotate, H again, FP4.
      float* x = reinterpret_cast<float*>(buf.data());
      load_fp4(j, src, x);
      math::dsv4_hadamard(x, j.dim);
      math::shift_rotate_head_plain(x, 0, j.layout, c, s, lanes);
      math::dsv4_hadamard(x, j.dim);
      store_fp4(j, x, dst);
      return;
    }
  }
}

}  // namespace

void dsv4_shift_jobs(const ops::Dsv4ShiftJobsParams& p) {
  const bool big = p.total_rows >= kParallelMin;
#pragma omp parallel if (big)
  {
    std::vector<uint8_t> buf(4096);
#pragma omp for schedule(static)
    for (int64_t g = 0; g < p.total_rows; ++g) {
      const int32_t ji = static_cast<int32_t>(std::upper_bound(p.row_start, p.row_start + p.n_jobs + 1, g) - p.row_start) - 1;
      shift_row(p.jobs[ji], g - p.row_start[ji], p.cos_t, p.sin_t, buf);
    }
  }
}

}  // namespace kvcore::cpu
