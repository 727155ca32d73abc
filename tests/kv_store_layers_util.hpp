// Shared by the kv_store_layers tests (CPU: tests/kv_store_layers_test.cpp; CUDA:
// tests/cuda/kv_store_layers_cuda_test.cpp): a case's per-layer pools on a device, its random
// sources, slots and positions (the same values on every device for the same seed), and the
// two ways of storing them: kv_store_layers, and kv_store per layer and part.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "kvcore/ops/kv_store_layers.hpp"
#include "kvcore/runtime.hpp"
#include "paged_model.hpp"

namespace kvsl_test {

using namespace kvcore;

struct LayersCase {
  int32_t layers = 3, n = 5, H = 2, Dk = 128, Dv = 128;  // Dv 0: no V
  int32_t blocks = 9, bs = 4;
  KvFormat kf = KvFormat::F16, vf = KvFormat::F16;
  DType src = DType::F16;
  bool rotate = true;
  RopeSpec spec = RopeSpec::llama3_8b();
  uint64_t seed = 1;
};

// One pool per layer (and per part), zero-filled, on `dev`.
struct LayersPools {
  std::vector<Buffer> mem;  // k data, k scales, v data, v scales of every layer (empty buffers skipped)
  std::vector<KvPool> k, v;
  // Every byte of every array, in mem's order.
  std::vector<std::vector<uint8_t>> bytes() const {
    std::vector<std::vector<uint8_t>> out;
    for (const Buffer& b : mem) out.push_back(b.to_host<uint8_t>());
    return out;
  }
};

inline KvPool make_pool(std::vector<Buffer>& mem, KvFormat f, int32_t D, const LayersCase& c, Device dev) {
  KvPool p;
  p.format = f;
  p.head_dim = D;
  const int64_t rows = static_cast<int64_t>(c.blocks) * c.bs * c.H;
  const size_t bytes = static_cast<size_t>(rows * kv_row_width(f, D) * dtype_size(kv_format_dtype(f)));
  mem.emplace_back(bytes, dev);
  fill_bytes(mem.back().data(), dev, 0, bytes);
  p.data = TensorRef(mem.back().data(), kv_format_dtype(f), dev, {c.blocks, c.bs, c.H, kv_row_width(f, D)});
  if (kv_format_has_scales(f)) {
    mem.emplace_back(static_cast<size_t>(rows * D / 64), dev);
    fill_bytes(mem.back().data(), dev, 0, mem.back().size());
    p.scales = TensorRef(mem.back().data(), DType::UE8M0, dev, {c.blocks, c.bs, c.H, D / 64});
  }
  return p;
}

inline LayersPools make_pools(const LayersCase& c, Device dev) {
  LayersPools p;
  p.mem.reserve(static_cast<size_t>(c.layers) * 4);  // KvPool views point into mem: no reallocation
  for (int32_t l = 0; l < c.layers; ++l) {
    p.k.push_back(make_pool(p.mem, c.kf, c.Dk, c, dev));
    if (c.Dv > 0) p.v.push_back(make_pool(p.mem, c.vf, c.Dv, c, dev));
  }
  return p;
}

struct LayersInputs {
  paged_test::Source k, v;  // [layers, n, H, D]
  std::vector<int32_t> slots, positions;
  Buffer slots_mem, positions_mem;
  TensorRef slots_t, positions_t;
  math::RopeTable table{};
  const math::RopeTable* rope() const { return &table; }
};

// Distinct cells in shuffled order, token 1 skipped (slot -1) when n > 2; positions up to 100000.
inline LayersInputs make_inputs(const LayersCase& c, Device dev) {
  LayersInputs in;
  std::mt19937_64 rng(c.seed);
  in.k = paged_test::make_source(rng, c.layers, c.n, c.H, c.Dk, c.src, dev, false);
  if (c.Dv > 0) in.v = paged_test::make_source(rng, c.layers, c.n, c.H, c.Dv, c.src, dev, false);
  std::vector<int32_t> cells(static_cast<size_t>(c.blocks) * c.bs);
  std::iota(cells.begin(), cells.end(), 0);
  std::shuffle(cells.begin(), cells.end(), rng);
  in.slots.assign(cells.begin(), cells.begin() + c.n);
  if (c.n > 2) in.slots[1] = -1;
  in.positions.resize(static_cast<size_t>(c.n));
  for (int32_t& p : in.positions) p = static_cast<int32_t>(rng() % 100000);
  in.slots_mem = Buffer::from_host(in.slots, dev);
  in.positions_mem = Buffer::from_host(in.positions, dev);
  in.slots_t = TensorRef(in.slots_mem.data(), DType::I32, dev, {c.n});
  in.positions_t = TensorRef(in.positions_mem.data(), DType::I32, dev, {c.n});
  in.table = make_rope_table(c.spec, c.Dk);
  return in;
}

inline TensorRef layer_view(const TensorRef& t, int32_t l) {
  const int64_t shape[3] = {t.size(1), t.size(2), t.size(3)};
  const int64_t strides[3] = {t.stride(1), t.stride(2), t.stride(3)};
  char* base = static_cast<char*>(t.data()) + l * t.stride(0) * static_cast<int64_t>(t.element_size());
  return TensorRef(base, t.dtype(), t.device(), 3, shape, strides);
}

inline void store_fused(const LayersCase& c, const LayersInputs& in, const LayersPools& p) {
  kv_store_layers(in.k.tensor, c.Dv > 0 ? in.v.tensor : TensorRef(), in.slots_t, p.k, p.v,
                  c.rotate ? in.positions_t : TensorRef(), c.rotate ? in.rope() : nullptr);
}

inline void store_per_layer(const LayersCase& c, const LayersInputs& in, const LayersPools& p) {
  for (int32_t l = 0; l < c.layers; ++l) {
    kv_store(layer_view(in.k.tensor, l), in.slots_t, p.k[l], c.rotate ? in.positions_t : TensorRef(),
             c.rotate ? in.rope() : nullptr);
    if (c.Dv > 0) kv_store(layer_view(in.v.tensor, l), in.slots_t, p.v[l], TensorRef(), nullptr);
  }
}

}  // namespace kvsl_test
