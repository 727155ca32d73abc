// Small PagedCache configurations for tests: every format, both RoPE modes, RoPE
// variants that differ per layer (full NeoX with a write-time magnitude; a partial
// interleaved tail with YaRN; DeepSeek-V4's compressed and window specs), and MLA's 576/512 rows.
#pragma once
#include "kvcore/cache/paged_cache.hpp"

namespace paged_test {

inline kvcore::PagedCacheConfig small_config(kvcore::KvFormat f, kvcore::RopeMode mode, int32_t block_size = 8,
                                             int32_t num_blocks = 40) {
  using namespace kvcore;
  PagedCacheConfig c;
  c.n_layers = 2;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.rope_mode = mode;
  c.k_format = f;
  if (f == KvFormat::Dsv4Row) {
    c.n_kv_heads = 1;
    c.head_dim = 512;
    c.v_head_dim = 0;
    c.rope = {RopeSpec::deepseek_v4_compressed(), RopeSpec::deepseek_v4_window()};
    return c;
  }
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.v_head_dim = 64;
  c.v_format = f;
  RopeSpec full = RopeSpec::plain(64, 10000.0);
  full.attention_factor = 1.25;  // applied at write only: shifts must not re-apply it
  RopeSpec tail = RopeSpec::plain(32, 160000.0, RopePairing::Interleaved);
  tail.slice = RopeSlice::Tail;
  tail.scaling = RopeScaling::Yarn;
  tail.factor = 16.0;
  tail.original_max_position = 4096;
  c.rope = {full, tail};
  return c;
}

// DeepSeek-V2/V3 MLA's cache: one kv head, K rows of 576 dims (the 512-dim latent, then the 64
// dims RoPE rotates: an interleaved tail slice), V rows of 512. Layer 0 has DeepSeek-V2's YaRN
// (factor 40 over 4096 positions, cos and sin unscaled: mscale = mscale_all_dim), layer 1 plain
// RoPE with a write-time magnitude.
inline kvcore::PagedCacheConfig mla_config(kvcore::KvFormat f, kvcore::RopeMode mode, int32_t block_size = 8,
                                           int32_t num_blocks = 40) {
  using namespace kvcore;
  PagedCacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 1;
  c.head_dim = 576;
  c.v_head_dim = 512;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.rope_mode = mode;
  c.k_format = c.v_format = f;
  RopeSpec yarn = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
  yarn.slice = RopeSlice::Tail;
  yarn.scaling = RopeScaling::Yarn;
  yarn.factor = 40.0;
  yarn.original_max_position = 4096;
  yarn.attention_factor = yarn_attention_factor(40.0, 0.707, 0.707);
  RopeSpec plain = RopeSpec::plain(64, 10000.0, RopePairing::Interleaved);
  plain.slice = RopeSlice::Tail;
  plain.attention_factor = 1.25;
  c.rope = {yarn, plain};
  return c;
}

// The same geometry in MLA's shared layout (FlashMLA's): no V pools, V is each K row's 512-dim latent.
inline kvcore::PagedCacheConfig mla_shared_config(kvcore::KvFormat f, kvcore::RopeMode mode, int32_t block_size = 8,
                                                  int32_t num_blocks = 40) {
  kvcore::PagedCacheConfig c = mla_config(f, mode, block_size, num_blocks);
  c.v_from_k_latent = true;
  return c;
}

// The formats kvcore's attention reads at MLA's widths.
inline const kvcore::KvFormat kMlaFormats[] = {kvcore::KvFormat::F16, kvcore::KvFormat::BF16, kvcore::KvFormat::Fp8};

inline const kvcore::KvFormat kAllFormats[] = {kvcore::KvFormat::F32, kvcore::KvFormat::F16, kvcore::KvFormat::BF16,
                                               kvcore::KvFormat::Fp8, kvcore::KvFormat::Dsv4Row};

}  // namespace paged_test
