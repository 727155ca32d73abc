// CUDA port of the seed's per-thread RoPE (seeds/000_*.txt, kv_shift_k_to_scratch): one
// thread per (token, head, NeoX pair), the frequency recomputed per element with powf,
// cosf/sinf, f16 storage. Rotates in place at per-token positions (the seed rotates by one
// delta into scratch; the arithmetic per element is the same).
#pragma once
#include <cstdint>

namespace kvcore::bench {

// k: f16 [tokens, n_kv_heads, head_dim] contiguous, on the current CUDA device; positions: i32 [tokens].
void seed_rope_f16_inplace(void* k, const int32_t* positions, uint32_t tokens, uint32_t n_kv_heads,
                           uint32_t head_dim, float freq_base, void* stream);
// Fill n f16 values with deterministic pseudo-random numbers in [-2, 2) (benchmark inputs).
void fill_random_f16(void* dst, uint64_t n, uint64_t seed, void* stream);

}  // namespace kvcore::bench
