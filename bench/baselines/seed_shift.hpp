// Baseline: a faithful CUDA port of seed 000's context shift (a Metal n_keep
// shift on a dense f16 cache), kept for the benchmark and as a cross-check.
// Per layer: (1) kv_shift_k_to_scratch rotates every retained K pair (NeoX,
// whole head, freq = base^(-2d/head_dim), angle = -shift * freq in f32) into
// a scratch buffer; (2) memcpy_f16_offsets copies it back to n_keep; (3, 4) V
// goes to scratch and back the same way. Four passes over K and four over V.
#pragma once
#include <cstdint>

namespace kvcore::baselines {

struct SeedShiftLayer {
  void* k;  // f16 [L, n_kv_heads * head_dim]
  void* v;  // f16 [L, n_kv_heads * head_dim]
};

// scratch: f16, at least (new_seq_len - n_keep) * n_kv_heads * head_dim elements.
// new_seq_len = L - shift. stream: a cudaStream_t (nullptr: default stream).
void seed_shift_f16(const SeedShiftLayer* layers, int n_layers, void* scratch, uint32_t n_keep, uint32_t shift,
                    uint32_t new_seq_len, uint32_t n_kv_heads, uint32_t head_dim, float freq_base, void* stream);

}  // namespace kvcore::baselines
