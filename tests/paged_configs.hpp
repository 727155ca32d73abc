// Small PagedCache configurations for tests: every format, both RoPE modes, RoPE
// variants that differ per layer (full NeoX with a write-time magnitude; a partial
// interleaved tail with YaRN; DeepSeek-V4's compressed and window specs).
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

inline const kvcore::KvFormat kAllFormats[] = {kvcore::KvFormat::F32, kvcore::KvFormat::F16, kvcore::KvFormat::BF16,
                                               kvcore::KvFormat::Fp8, kvcore::KvFormat::Dsv4Row};

}  // namespace paged_test
