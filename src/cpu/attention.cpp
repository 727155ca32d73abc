// CPU (OpenMP) paged attention: tasks over (query rows, kv heads, split), run by
// the SIMD kernel where it serves the shape (a block of up to kSimdPrefillRows rows
// of one sequence and a range of kv heads a task) and by the scalar path otherwise
// (one row and kv head a task; attention_tasks.hpp); a second pass merges the
// splits as the CUDA split-K merge does, adds the sink and stores the output.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "cpu/attention_merge.hpp"
#include "cpu/attention_tasks.hpp"
#include "cpu/simd_targets.hpp"
#include "ops/attention_params.hpp"

namespace kvcore::ops::cpu {

void attention_paged(const PagedAttentionParams& p) {
  const int64_t n_kv = p.layout.n_kv_heads;
  const int64_t tasks = int64_t{p.n_rows} * n_kv * p.num_splits;
  const bool simd = simd_on() && attention_simd_serves(p);
  // Threads only where the work pays for waking them: from 2^18 multiply-adds (a decode
  // over ~450 tokens of 9 heads x 64) two threads beat one; below that they tie, and one
  // core is the safer choice on a loaded machine.
  int64_t macs = 0;
  for (int32_t r = 0; r < p.n_rows; ++r)
    macs += int64_t{PagedLayout::seq_cells(p.indptr, p.last_page_len, attention_row_seq(p, r), p.layout.block_size)} *
            p.n_q_heads * p.layout.head_dim;
  const bool parallel = macs > (int64_t{1} << 18);
  if (simd) {
    // Row blocks: one row each for decode; up to kSimdPrefillRows consecutive rows of one
    // sequence for prefill, which then share every K/V tile read.
    std::vector<int32_t> blocks;  // first row of each block, then n_rows
    if (p.maybe_qo_indptr) {
      for (int32_t b = 0; b < p.batch; ++b)
        for (int32_t r = p.maybe_qo_indptr[b]; r < p.maybe_qo_indptr[b + 1]; r += kSimdPrefillRows) blocks.push_back(r);
    } else {
      for (int32_t r = 0; r < p.n_rows; ++r) blocks.push_back(r);
    }
    const int64_t n_blocks = static_cast<int64_t>(blocks.size());
    blocks.push_back(p.n_rows);
    // Tasks of several kv heads read a cell's heads as one contiguous run: as many heads per
    // task as still leaves every thread a task (one task per thread when blocks x splits are few).
    const int64_t threads = parallel ? omp_get_max_threads() : 1;
    const int64_t base = n_blocks * p.num_splits;
    const int64_t groups = std::clamp<int64_t>((threads + base - 1) / base, 1, n_kv);
    const int64_t per = (n_kv + groups - 1) / groups;
    const int64_t n_groups = (n_kv + per - 1) / per;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int64_t t = 0; t < base * n_groups; ++t) {
      const int32_t split = static_cast<int32_t>(t % p.num_splits);
      const int64_t grp = (t / p.num_splits) % n_groups;
      const int64_t blk = t / (p.num_splits * n_groups);
      const int32_t r0 = blocks[blk], r1 = std::min(blocks[blk + 1], r0 + kSimdPrefillRows);
      const int32_t h0 = static_cast<int32_t>(grp * per), h1 = static_cast<int32_t>(std::min(n_kv, (grp + 1) * per));
      attention_task_simd(p, r0, r1, h0, h1, split);
    }
  } else {
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int64_t t = 0; t < tasks; ++t) {
      const int32_t split = static_cast<int32_t>(t % p.num_splits);
      const int32_t kvh = static_cast<int32_t>((t / p.num_splits) % n_kv);
      const int32_t r = static_cast<int32_t>(t / (p.num_splits * n_kv));
      attention_task_scalar(p, r, kvh, split);
    }
  }
  const int64_t heads = int64_t{p.n_rows} * p.n_q_heads;
  const int32_t dv = p.v_head_dim;  // partials and output are V rows
#pragma omp parallel for schedule(static) if (heads * p.num_splits * dv > (int64_t{1} << 18))
  for (int64_t rh = 0; rh < heads; ++rh) {
    const int32_t r = static_cast<int32_t>(rh / p.n_q_heads), h = static_cast<int32_t>(rh % p.n_q_heads);
    std::vector<float> row(static_cast<size_t>(dv));
    merge_partials(p.o_part + rh * p.num_splits * dv, p.lse_part + rh * p.num_splits, p.num_splits, dv,
                   p.maybe_sinks ? p.maybe_sinks[h] : math::neg_inf_f32(), row.data());
    const int64_t off = int64_t{r} * p.out_row_stride + int64_t{h} * p.out_head_stride;
    for (int32_t d = 0; d < dv; ++d) store_q_elem(p.out, off + d, p.out_elem, row[d]);
  }
}

}  // namespace kvcore::ops::cpu
