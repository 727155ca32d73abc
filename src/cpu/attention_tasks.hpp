// One task of CPU paged attention: query row r, kv head kvh and split `split`
// of the row's cells. A task covers every query head of the kv head's group, so
// each K and V row is read once for all of them, and writes the group's
// normalized partials (p.o_part, p.lse_part) for the split-K merge.
#pragma once
#include <cstdint>

#include "ops/attention_params.hpp"

namespace kvcore::ops::cpu {

// One element at a time: the reference and the fallback (any head dims of K and V).
void attention_task_scalar(const PagedAttentionParams& p, int32_t r, int32_t kvh, int32_t split);

// Whether attention_task_simd serves p: K and V head dims that are multiples of 8, V rows
// of their own pool or a view of K's (every pool format, scale mode, group size and option).
bool attention_simd_serves(const PagedAttentionParams& p);

// The SIMD kernel, on the target Highway dispatches to, for query rows [r0, r1) of one
// sequence and kv heads [h0, h1) at once: each K and V row a tile reads serves every
// row (prefill shares a tile's reads among a block of query rows) and every head of the
// range (their rows lie side by side in a cell, so the task reads longer contiguous
// runs). Float sums (dot products, exp2, the weighted sum of values) differ from the
// scalar path in rounding only: documented tolerance in tests/cpu_simd_attention_test.cpp.
void attention_task_simd(const PagedAttentionParams& p, int32_t r0, int32_t r1, int32_t h0, int32_t h1, int32_t split);

// Query rows per SIMD prefill task: a block of a sequence's rows shares each K/V tile read.
inline constexpr int32_t kSimdPrefillRows = 8;

}  // namespace kvcore::ops::cpu
