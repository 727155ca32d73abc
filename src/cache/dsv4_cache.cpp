// Dsv4Cache: storage, append (decode and prefill paths), reads, reset.
#include "kvcore/cache/dsv4_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kvcore/error.hpp"
#include "kvcore/math/dsv4.hpp"
#include "kvcore/runtime.hpp"
#include "ops/dsv4_checks.hpp"

namespace kvcore {

const char* dsv4_layer_kind_name(Dsv4LayerKind k) {
  switch (k) {
    case Dsv4LayerKind::Window: return "window";
    case Dsv4LayerKind::CSA: return "csa";
    case Dsv4LayerKind::HCA: return "hca";
  }
  return "?";
}

// ---- config ---------------------------------------------------------------------

std::vector<Dsv4LayerKind> Dsv4CacheConfig::v4_flash_schedule() {
  std::vector<Dsv4LayerKind> s(43);
  for (int i = 0; i < 43; ++i)
    s[i] = i < 2 ? Dsv4LayerKind::Window : (i % 2 == 0 ? Dsv4LayerKind::CSA : Dsv4LayerKind::HCA);
  return s;
}

std::vector<Dsv4LayerKind> Dsv4CacheConfig::v4_pro_schedule() {
  std::vector<Dsv4LayerKind> s(61);
  for (int i = 0; i < 61; ++i)
    s[i] = i < 2 ? Dsv4LayerKind::HCA : (i % 2 == 0 ? Dsv4LayerKind::CSA : Dsv4LayerKind::HCA);
  return s;
}

Dsv4CacheConfig Dsv4CacheConfig::v4_flash(int64_t max_context, int32_t max_seqs) {
  Dsv4CacheConfig c;
  c.layers = v4_flash_schedule();
  c.max_context = max_context;
  c.max_seqs = max_seqs;
  return c;
}

Dsv4CacheConfig Dsv4CacheConfig::v4_pro(int64_t max_context, int32_t max_seqs) {
  Dsv4CacheConfig c = v4_flash(max_context, max_seqs);
  c.layers = v4_pro_schedule();
  c.index_topk = 1024;
  return c;
}

int32_t Dsv4CacheConfig::ratio(Dsv4LayerKind k) const {
  return k == Dsv4LayerKind::CSA ? csa_ratio : k == Dsv4LayerKind::HCA ? hca_ratio : 0;
}

Dsv4Compressor Dsv4CacheConfig::compressor(Dsv4LayerKind k) const {
  Dsv4Compressor c = k == Dsv4LayerKind::CSA ? Dsv4Compressor::csa(head_dim, n_rot, csa_ratio)
                                             : Dsv4Compressor::hca(head_dim, n_rot, hca_ratio);
  c.eps = eps;
  return c;
}

Dsv4Compressor Dsv4CacheConfig::indexer() const {
  Dsv4Compressor c = Dsv4Compressor::indexer(index_dim, n_rot, csa_ratio);
  c.eps = eps;
  return c;
}

void Dsv4CacheConfig::validate() const {
  const char* w = "Dsv4CacheConfig";
  KVCORE_DSV4_CHECK(!layers.empty() && layers.size() <= 1024, w, ".layers must hold 1..1024 layers, got ", layers.size());
  KVCORE_DSV4_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 4096, w, ".head_dim must be even in [2, 4096], got ", head_dim);
  KVCORE_DSV4_CHECK(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim, w, ".n_rot must be even in [2, head_dim], got ", n_rot);
  KVCORE_DSV4_CHECK(window >= 1 && window <= 65536, w, ".window must be in [1, 65536], got ", window);
  KVCORE_DSV4_CHECK(csa_ratio >= 1 && csa_ratio <= 4096, w, ".csa_ratio must be in [1, 4096], got ", csa_ratio);
  KVCORE_DSV4_CHECK(hca_ratio >= 1 && hca_ratio <= 4096, w, ".hca_ratio must be in [1, 4096], got ", hca_ratio);
  KVCORE_DSV4_CHECK(max_context >= 1 && max_context <= (int64_t{1} << 24), w, ".max_context must be in [1, 2^24], got ", max_context);
  KVCORE_DSV4_CHECK(max_seqs >= 1 && max_seqs <= 65536, w, ".max_seqs must be in [1, 65536], got ", max_seqs);
  KVCORE_DSV4_CHECK(std::isfinite(eps) && eps >= 0, w, ".eps must be finite and >= 0, got ", eps);
  const bool has_csa = std::find(layers.begin(), layers.end(), Dsv4LayerKind::CSA) != layers.end();
  if (has_csa) {
    KVCORE_DSV4_CHECK(index_dim >= n_rot && index_dim <= 1024 && (index_dim & (index_dim - 1)) == 0, w,
                ".index_dim must be a power of two in [n_rot, 1024], got ", index_dim);
    if (quant == Dsv4Quant::On)
      KVCORE_DSV4_CHECK(index_dim % 32 == 0, w, ".index_dim must be a multiple of 32 when quantized (FP4 blocks), got ", index_dim);
    KVCORE_DSV4_CHECK(index_heads >= 1 && index_heads <= 256, w, ".index_heads must be in [1, 256], got ", index_heads);
    KVCORE_DSV4_CHECK(index_topk >= 1 && index_topk <= 2048, w, ".index_topk must be in [1, 2048], got ", index_topk);
    KVCORE_DSV4_CHECK(index_topk <= max_context / csa_ratio, w, ".index_topk (", index_topk,
                ") exceeds the indexer row capacity max_context / csa_ratio = ", max_context / csa_ratio);
  }
  if (compressed_rope_table) {
    const auto& l = compressed_rope_table->layout;
    KVCORE_DSV4_CHECK(l.n_rot == n_rot && l.first_dim == head_dim - n_rot, w,
                ".compressed_rope_table must rotate the last n_rot dims of head_dim");
  } else {
    compressed_rope.validate(head_dim);
    KVCORE_DSV4_CHECK(compressed_rope.n_rot == n_rot && compressed_rope.slice == RopeSlice::Tail, w,
                ".compressed_rope must rotate the tail n_rot = ", n_rot, " dims, got ", described(compressed_rope));
  }
}

// ---- construction ------------------------------------------------------------------

namespace {

Buffer alloc(size_t bytes, Device d) { return Buffer(bytes, d); }

}  // namespace

Dsv4Cache::Dsv4Cache(Dsv4CacheConfig config, Device device) : cfg_(std::move(config)), device_(device) {
  cfg_.validate();
  require(device.is_cpu() || cuda_compiled(), ErrorCode::NotSupported, "Dsv4Cache: device ", device.str(),
          " requested but this build has no CUDA backend");
  comp_rope_ = cfg_.compressed_rope_table ? *cfg_.compressed_rope_table : make_rope_table(cfg_.compressed_rope, cfg_.head_dim);
  comp_rope_.attention_factor = 1.0f;
  idx_rope_ = comp_rope_;
  idx_rope_.layout.first_dim = cfg_.index_dim - cfg_.n_rot;
  const bool quant = cfg_.quant == Dsv4Quant::On;
  comp_packed_ = quant && cfg_.packed && cfg_.compressor(Dsv4LayerKind::CSA).packed_row_bytes() > 0;
  idx_packed_ = quant && cfg_.packed && cfg_.indexer().packed_row_bytes() > 0;

  const size_t S = static_cast<size_t>(cfg_.max_seqs);
  layers_.resize(cfg_.layers.size());
  for (size_t li = 0; li < layers_.size(); ++li) {
    Layer& L = layers_[li];
    L.kind = cfg_.layers[li];
    L.ring = alloc(S * cfg_.window * cfg_.head_dim * (quant ? 2 : 4), device_);
    if (L.kind == Dsv4LayerKind::Window) continue;
    L.comp = cfg_.compressor(L.kind);
    L.comp_cap = cfg_.max_context / L.comp.ratio;
    const size_t st = S * L.comp.state_rows() * L.comp.width() * 4;
    L.comp_kv = alloc(st, device_);
    L.comp_score = alloc(st, device_);
    L.comp_rows = alloc(S * std::max<int64_t>(L.comp_cap, 1) * compressed_row_bytes(), device_);
    if (L.kind == Dsv4LayerKind::CSA) {
      L.idx = cfg_.indexer();
      L.idx_cap = cfg_.max_context / L.idx.ratio;
      const size_t si = S * L.idx.state_rows() * L.idx.width() * 4;
      L.idx_kv = alloc(si, device_);
      L.idx_score = alloc(si, device_);
      L.idx_rows = alloc(S * std::max<int64_t>(L.idx_cap, 1) * indexer_row_bytes(), device_);
    }
  }
  length_.assign(S * layers_.size(), 0);
  for (int32_t s = 0; s < cfg_.max_seqs; ++s) reset(s);
}

Dsv4LayerKind Dsv4Cache::kind(int32_t layer) const {
  KVCORE_DSV4_CHECK(layer >= 0 && layer < n_layers(), "Dsv4Cache: layer must be in [0, ", n_layers(), "), got ", layer);
  return layers_[layer].kind;
}

int32_t Dsv4Cache::raw_row_bytes() const { return cfg_.head_dim * (cfg_.quant == Dsv4Quant::On ? 2 : 4); }
int32_t Dsv4Cache::compressed_row_bytes() const {
  return comp_packed_ ? cfg_.compressor(Dsv4LayerKind::CSA).packed_row_bytes() : cfg_.head_dim * 4;
}
int32_t Dsv4Cache::indexer_row_bytes() const { return idx_packed_ ? cfg_.indexer().packed_row_bytes() : cfg_.index_dim * 4; }

void Dsv4Cache::check_seq_layer(const char* what, int32_t seq, int32_t layer) const {
  KVCORE_DSV4_CHECK(seq >= 0 && seq < cfg_.max_seqs, "Dsv4Cache::", what, ": seq must be in [0, ", cfg_.max_seqs, "), got ", seq);
  KVCORE_DSV4_CHECK(layer >= 0 && layer < n_layers(), "Dsv4Cache::", what, ": layer must be in [0, ", n_layers(), "), got ", layer);
}

// ---- weights -------------------------------------------------------------------------

namespace {

Buffer copy_tensor(const TensorRef& t, Device to) {
  Buffer b(static_cast<size_t>(t.numel()) * t.element_size(), to);
  copy_bytes(b.data(), to, t.data(), t.device(), b.size());
  synchronize(to);
  return b;
}

void check_weight(const char* name, const TensorRef& t, std::initializer_list<int64_t> shape, bool allow_f16) {
  KVCORE_DSV4_CHECK(t.data() != nullptr, "Dsv4Cache::set_weights: ", name, " is missing");
  KVCORE_DSV4_CHECK(t.dtype() == DType::F32 || (allow_f16 && t.dtype() == DType::F16), "Dsv4Cache::set_weights: ", name,
              " must be f32", allow_f16 ? " or f16" : "", ", got ", dtype_name(t.dtype()));
  KVCORE_DSV4_CHECK(t.ndim() == static_cast<int>(shape.size()), "Dsv4Cache::set_weights: ", name, " must have ", shape.size(),
              " dims, got ", described(t));
  int d = 0;
  for (int64_t s : shape) {
    KVCORE_DSV4_CHECK(t.size(d) == s, "Dsv4Cache::set_weights: ", name, ".shape[", d, "] must be ", s, ", got ", described(t));
    ++d;
  }
  KVCORE_DSV4_CHECK(t.is_contiguous(), "Dsv4Cache::set_weights: ", name, " must be contiguous");
}

}  // namespace

void Dsv4Cache::set_weights(int32_t layer, const Dsv4LayerWeights& w) {
  const Dsv4LayerKind k = kind(layer);
  KVCORE_DSV4_CHECK(k != Dsv4LayerKind::Window, "Dsv4Cache::set_weights: layer ", layer, " is window-only and has no compressor");
  Layer& L = layers_[layer];
  check_weight("comp_ape", w.comp_ape, {L.comp.ratio, L.comp.width()}, true);
  check_weight("comp_norm", w.comp_norm, {L.comp.head_dim}, false);
  if (k == Dsv4LayerKind::CSA) {
    check_weight("idx_ape", w.idx_ape, {L.idx.ratio, L.idx.width()}, true);
    check_weight("idx_norm", w.idx_norm, {L.idx.head_dim}, false);
  }
  Buffer ca = copy_tensor(w.comp_ape, device_), cn = copy_tensor(w.comp_norm, device_), ia, in;
  if (k == Dsv4LayerKind::CSA) {
    ia = copy_tensor(w.idx_ape, device_);
    in = copy_tensor(w.idx_norm, device_);
  }
  L.comp_ape = std::move(ca);
  L.comp_norm = std::move(cn);
  L.comp_ape_dtype = w.comp_ape.dtype();
  if (k == Dsv4LayerKind::CSA) {
    L.idx_ape = std::move(ia);
    L.idx_norm = std::move(in);
    L.idx_ape_dtype = w.idx_ape.dtype();
  }
  L.has_weights = true;
}

Dsv4CompressorWeights Dsv4Cache::comp_weights(const Layer& L, bool indexer) const {
  const Dsv4Compressor& c = indexer ? L.idx : L.comp;
  Dsv4CompressorWeights w;
  w.ape = TensorRef((indexer ? L.idx_ape : L.comp_ape).data(), indexer ? L.idx_ape_dtype : L.comp_ape_dtype, device_,
                    {c.ratio, c.width()});
  w.norm_weight = TensorRef((indexer ? L.idx_norm : L.comp_norm).data(), DType::F32, device_, {c.head_dim});
  w.rope = indexer ? idx_rope_ : comp_rope_;
  return w;
}

// ---- views -----------------------------------------------------------------------------

TensorRef Dsv4Cache::slice3(const Buffer& b, DType dt, int32_t seq, int64_t rows, int64_t cols) const {
  auto* base = static_cast<uint8_t*>(b.data()) + static_cast<size_t>(seq) * rows * cols * dtype_size(dt);
  return TensorRef(base, dt, device_, {rows, cols});
}

TensorRef Dsv4Cache::raw_ring(int32_t seq, int32_t layer) const {
  check_seq_layer("raw_ring", seq, layer);
  return slice3(layers_[layer].ring, cfg_.quant == Dsv4Quant::On ? DType::F16 : DType::F32, seq, cfg_.window, cfg_.head_dim);
}

TensorRef Dsv4Cache::compressed_store(int32_t seq, int32_t layer) const {
  check_seq_layer("compressed_store", seq, layer);
  const Layer& L = layers_[layer];
  KVCORE_DSV4_CHECK(L.kind != Dsv4LayerKind::Window, "Dsv4Cache::compressed_store: layer ", layer, " is window-only");
  const int64_t cap = std::max<int64_t>(L.comp_cap, 1);
  return comp_packed_ ? slice3(L.comp_rows, DType::U8, seq, cap, compressed_row_bytes())
                      : slice3(L.comp_rows, DType::F32, seq, cap, cfg_.head_dim);
}

TensorRef Dsv4Cache::indexer_store(int32_t seq, int32_t layer) const {
  check_seq_layer("indexer_store", seq, layer);
  const Layer& L = layers_[layer];
  KVCORE_DSV4_CHECK(L.kind == Dsv4LayerKind::CSA, "Dsv4Cache::indexer_store: layer ", layer, " is not a CSA layer");
  const int64_t cap = std::max<int64_t>(L.idx_cap, 1);
  return idx_packed_ ? slice3(L.idx_rows, DType::U8, seq, cap, indexer_row_bytes())
                     : slice3(L.idx_rows, DType::F32, seq, cap, cfg_.index_dim);
}

TensorRef Dsv4Cache::state_kv(int32_t seq, int32_t layer, bool indexer) const {
  check_seq_layer("state_kv", seq, layer);
  const Layer& L = layers_[layer];
  KVCORE_DSV4_CHECK(indexer ? L.kind == Dsv4LayerKind::CSA : L.kind != Dsv4LayerKind::Window, "Dsv4Cache::state_kv: layer ",
              layer, " has no ", indexer ? "indexer" : "compressor");
  const Dsv4Compressor& c = indexer ? L.idx : L.comp;
  return slice3(indexer ? L.idx_kv : L.comp_kv, DType::F32, seq, c.state_rows(), c.width());
}

TensorRef Dsv4Cache::state_score(int32_t seq, int32_t layer, bool indexer) const {
  check_seq_layer("state_score", seq, layer);
  const Layer& L = layers_[layer];
  KVCORE_DSV4_CHECK(indexer ? L.kind == Dsv4LayerKind::CSA : L.kind != Dsv4LayerKind::Window, "Dsv4Cache::state_score: layer ",
              layer, " has no ", indexer ? "indexer" : "compressor");
  const Dsv4Compressor& c = indexer ? L.idx : L.comp;
  return slice3(indexer ? L.idx_score : L.comp_score, DType::F32, seq, c.state_rows(), c.width());
}

int64_t Dsv4Cache::length(int32_t seq, int32_t layer) const {
  check_seq_layer("length", seq, layer);
  return length_[static_cast<size_t>(seq) * layers_.size() + layer];
}

int64_t Dsv4Cache::compressed_rows(int32_t seq, int32_t layer) const {
  const int32_t r = cfg_.ratio(kind(layer));
  return r ? length(seq, layer) / r : 0;
}

int64_t Dsv4Cache::indexer_rows(int32_t seq, int32_t layer) const {
  return kind(layer) == Dsv4LayerKind::CSA ? length(seq, layer) / cfg_.csa_ratio : 0;
}

// ---- writing ------------------------------------------------------------------------------

namespace {

void check_input(const char* name, const TensorRef& t, int64_t n, int64_t width, Device d) {
  KVCORE_DSV4_CHECK(t.data() != nullptr, "Dsv4Cache::append: ", name, " is missing");
  KVCORE_DSV4_CHECK(t.ndim() == 2 && t.dtype() == DType::F32 && t.size(0) == n && t.size(1) == width, "Dsv4Cache::append: ",
              name, " must be f32[", n, ", ", width, "], got ", described(t));
  KVCORE_DSV4_CHECK(t.stride(1) == 1 && t.stride(0) >= 0, "Dsv4Cache::append: ", name, " needs unit stride in its last dim");
  KVCORE_DSV4_CHECK(t.device() == d, "Dsv4Cache::append: ", name, " is on ", t.device().str(), ", the cache on ", d.str());
}

TensorRef row_of(const TensorRef& t, int64_t i) {
  auto* p = static_cast<uint8_t*>(t.data()) + i * t.stride(0) * static_cast<int64_t>(t.element_size());
  return TensorRef(p, t.dtype(), t.device(), {t.size(1)});
}

}  // namespace

void Dsv4Cache::append(int32_t seq, int32_t layer, int64_t pos, const Dsv4TokenInputs& in, Stream stream) {
  check_seq_layer("append", seq, layer);
  Layer& L = layers_[layer];
  int64_t& len = length_[static_cast<size_t>(seq) * layers_.size() + layer];
  KVCORE_DSV4_CHECK(pos == len, "Dsv4Cache::append: seq ", seq, " layer ", layer, " holds ", len,
              " tokens, so the next position is ", len, "; got pos ", pos, pos < len ? " (repeats)" : " (skips)");
  KVCORE_DSV4_CHECK(in.kv.data() != nullptr && in.kv.ndim() == 2, "Dsv4Cache::append: kv must be f32[n, ", cfg_.head_dim, "], got ",
              described(in.kv));
  const int64_t n = in.kv.size(0);
  KVCORE_DSV4_CHECK(n >= 1, "Dsv4Cache::append: at least one token, got kv ", described(in.kv));
  KVCORE_DSV4_CHECK(pos + n <= cfg_.max_context, "Dsv4Cache::append: positions up to ", pos + n - 1, " exceed max_context ",
              cfg_.max_context);
  check_input("kv", in.kv, n, cfg_.head_dim, device_);
  if (L.kind != Dsv4LayerKind::Window) {
    KVCORE_DSV4_CHECK(L.has_weights, "Dsv4Cache::append: layer ", layer, " (", dsv4_layer_kind_name(L.kind),
                ") has no weights: call set_weights first");
    check_input("comp_c", in.comp_c, n, L.comp.width(), device_);
    check_input("comp_z", in.comp_z, n, L.comp.width(), device_);
  }
  if (L.kind == Dsv4LayerKind::CSA) {
    check_input("idx_c", in.idx_c, n, L.idx.width(), device_);
    check_input("idx_z", in.idx_z, n, L.idx.width(), device_);
  }
  // Everything checked: from here on the ops cannot reject their arguments.
  if (n == 1) {  // decode: one fused call (one kernel on CUDA)
    Dsv4DecodeCompressor dc, di;
    auto part = [&](Dsv4DecodeCompressor& d, bool indexer, const TensorRef& c, const TensorRef& z) {
      d.comp = indexer ? L.idx : L.comp;
      d.c = row_of(c, 0);
      d.z = row_of(z, 0);
      d.state_kv = state_kv(seq, layer, indexer);
      d.state_score = state_score(seq, layer, indexer);
      d.w = comp_weights(L, indexer);
      d.rows = indexer ? indexer_store(seq, layer) : compressed_store(seq, layer);
    };
    const bool has_comp = L.kind != Dsv4LayerKind::Window, has_idx = L.kind == Dsv4LayerKind::CSA;
    if (has_comp) part(dc, false, in.comp_c, in.comp_z);
    if (has_idx) part(di, true, in.idx_c, in.idx_z);
    dsv4_decode_layer(in.kv, raw_ring(seq, layer), cfg_.n_rot, pos, cfg_.quant, has_comp ? &dc : nullptr,
                      has_idx ? &di : nullptr, stream);
    len = pos + n;
    return;
  }
  dsv4_kv_finalize(in.kv, raw_ring(seq, layer), pos % cfg_.window, cfg_.n_rot, cfg_.quant, stream);
  auto compress = [&](bool indexer, const TensorRef& c, const TensorRef& z) {
    const Dsv4Compressor& comp = indexer ? L.idx : L.comp;
    dsv4_compress_prefill(c, z, state_kv(seq, layer, indexer), state_score(seq, layer, indexer), pos, comp,
                          comp_weights(L, indexer), cfg_.quant, indexer ? indexer_store(seq, layer) : compressed_store(seq, layer),
                          stream);
  };
  if (L.kind != Dsv4LayerKind::Window) compress(false, in.comp_c, in.comp_z);
  if (L.kind == Dsv4LayerKind::CSA) compress(true, in.idx_c, in.idx_z);
  len = pos + n;
}

// ---- reading ------------------------------------------------------------------------------

namespace {

std::vector<uint8_t> download(const TensorRef& t, int64_t rows) {
  const size_t row_bytes = static_cast<size_t>(t.size(1)) * t.element_size();
  std::vector<uint8_t> v(static_cast<size_t>(rows) * row_bytes);
  copy_bytes(v.data(), Device::cpu(), t.data(), t.device(), v.size());
  return v;
}

}  // namespace

std::vector<float> Dsv4Cache::read_window(int32_t seq, int32_t layer) const {
  const TensorRef ring = raw_ring(seq, layer);
  const int64_t L = length(seq, layer), W = cfg_.window, hd = cfg_.head_dim;
  const std::vector<uint8_t> raw = download(ring, W);
  const int64_t n = std::min(L, W);
  std::vector<float> out(static_cast<size_t>(n * hd));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = (L - n + i) % W;
    for (int64_t d = 0; d < hd; ++d) {
      float v;
      if (ring.dtype() == DType::F16) {
        uint16_t h;
        std::memcpy(&h, raw.data() + (r * hd + d) * 2, 2);
        v = math::f16_bits_to_f32(h);
      } else {
        std::memcpy(&v, raw.data() + (r * hd + d) * 4, 4);
      }
      out[i * hd + d] = v;
    }
  }
  return out;
}

std::vector<float> Dsv4Cache::read_compressed(int32_t seq, int32_t layer) const {
  const int64_t n = compressed_rows(seq, layer), hd = cfg_.head_dim;
  if (n == 0) return {};
  const TensorRef store = compressed_store(seq, layer);
  const std::vector<uint8_t> raw = download(store, n);
  std::vector<float> out(static_cast<size_t>(n * hd));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < hd; ++d) {
      if (comp_packed_) {
        out[i * hd + d] = math::dsv4_unpack_attention_value(raw.data() + i * store.size(1), static_cast<int>(d));
      } else {
        std::memcpy(&out[i * hd + d], raw.data() + (i * hd + d) * 4, 4);
      }
    }
  return out;
}

std::vector<float> Dsv4Cache::read_indexer(int32_t seq, int32_t layer) const {
  const int64_t n = indexer_rows(seq, layer), D = cfg_.index_dim;
  if (n == 0) return {};
  const TensorRef store = indexer_store(seq, layer);
  const std::vector<uint8_t> raw = download(store, n);
  std::vector<float> out(static_cast<size_t>(n * D));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d) {
      if (idx_packed_) {
        out[i * D + d] = math::dsv4_unpack_fp4_value(raw.data() + i * store.size(1), static_cast<int>(D), static_cast<int>(d));
      } else {
        std::memcpy(&out[i * D + d], raw.data() + (i * D + d) * 4, 4);
      }
    }
  return out;
}

std::vector<float> Dsv4Cache::read_state(int32_t seq, int32_t layer, bool indexer, bool score) const {
  const TensorRef t = score ? state_score(seq, layer, indexer) : state_kv(seq, layer, indexer);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy_bytes(v.data(), Device::cpu(), t.data(), device_, v.size() * 4);
  return v;
}

void Dsv4Cache::indexer_topk(int32_t seq, int32_t layer, const TensorRef& q, const TensorRef& weights,
                             int64_t first_query_pos, const TensorRef& scores, const TensorRef& out, Stream stream) const {
  check_seq_layer("indexer_topk", seq, layer);
  KVCORE_DSV4_CHECK(layers_[layer].kind == Dsv4LayerKind::CSA, "Dsv4Cache::indexer_topk: layer ", layer, " is not a CSA layer");
  KVCORE_DSV4_CHECK(q.ndim() == 3 && q.size(1) == cfg_.index_heads && q.size(2) == cfg_.index_dim, "Dsv4Cache::indexer_topk: q must be [n, ",
              cfg_.index_heads, ", ", cfg_.index_dim, "], got ", described(q));
  KVCORE_DSV4_CHECK(first_query_pos >= 0 && first_query_pos + q.size(0) <= length(seq, layer), "Dsv4Cache::indexer_topk: queries at ",
              first_query_pos, "..", first_query_pos + q.size(0) - 1, " must be tokens already appended (",
              length(seq, layer), ")");
  dsv4_indexer_topk(q, weights, indexer_store(seq, layer), indexer_rows(seq, layer), first_query_pos, cfg_.csa_ratio,
                    cfg_.quant, scores, out, stream);
}

// ---- lifecycle ----------------------------------------------------------------------------------

void Dsv4Cache::reset(int32_t seq, Stream stream) {
  KVCORE_DSV4_CHECK(seq >= 0 && seq < cfg_.max_seqs, "Dsv4Cache::reset: seq must be in [0, ", cfg_.max_seqs, "), got ", seq);
  for (size_t li = 0; li < layers_.size(); ++li) {
    Layer& L = layers_[li];
    const TensorRef ring = raw_ring(seq, static_cast<int32_t>(li));
    fill_bytes(ring.data(), device_, 0, static_cast<size_t>(ring.span_bytes()), stream);
    if (L.kind != Dsv4LayerKind::Window)
      dsv4_compressor_reset(state_kv(seq, li, false), state_score(seq, li, false), L.comp, stream);
    if (L.kind == Dsv4LayerKind::CSA)
      dsv4_compressor_reset(state_kv(seq, li, true), state_score(seq, li, true), L.idx, stream);
    length_[static_cast<size_t>(seq) * layers_.size() + li] = 0;
  }
}

void Dsv4Cache::shift(int32_t seq, int64_t n_keep, int64_t n_discard) {
  KVCORE_DSV4_CHECK(seq >= 0 && seq < cfg_.max_seqs, "Dsv4Cache::shift: seq must be in [0, ", cfg_.max_seqs, "), got ", seq);
  const int64_t L = length(seq, 0);
  KVCORE_DSV4_CHECK(n_keep >= 0 && n_discard >= 0 && n_keep + n_discard <= L, "Dsv4Cache::shift: need 0 <= n_keep and 0 <= n_discard with n_keep + n_discard <= ",
              L, " (the sequence length), got n_keep ", n_keep, ", n_discard ", n_discard);
  throw Error(ErrorCode::NotSupported,
              detail::concat("Dsv4Cache::shift(n_keep ", n_keep, ", n_discard ", n_discard,
                             "): DeepSeek-V4 caches cannot shift: compressor windows straddle the cut and compressed "
                             "rows pool tokens across it (a rule for cuts at multiples of every ratio is not implemented)"));
}

// ---- memory -------------------------------------------------------------------------------------

std::vector<Dsv4MemoryRow> Dsv4Cache::memory_report(const std::vector<int64_t>& contexts) const {
  std::vector<Dsv4MemoryRow> out;
  const double hd = cfg_.head_dim, D = cfg_.index_dim;
  for (int64_t ctx : contexts) {
    KVCORE_DSV4_CHECK(ctx >= 1, "Dsv4Cache::memory_report: contexts must be >= 1, got ", ctx);
    double ours = 0, f32 = 0, f16 = 0;
    for (const Layer& L : layers_) {
      const double raw = static_cast<double>(std::min<int64_t>(ctx, cfg_.window));
      ours += raw * raw_row_bytes();
      f32 += raw * hd * 4;
      f16 += raw * hd * 2;
      if (L.kind == Dsv4LayerKind::Window) continue;
      const double state = 2.0 * L.comp.state_rows() * L.comp.width() * 4;
      const double rows = static_cast<double>(ctx / L.comp.ratio);
      ours += state + rows * compressed_row_bytes();
      f32 += state + rows * hd * 4;
      f16 += state + rows * hd * 2;
      if (L.kind != Dsv4LayerKind::CSA) continue;
      const double istate = 2.0 * L.idx.state_rows() * L.idx.width() * 4;
      const double irows = static_cast<double>(ctx / L.idx.ratio);
      ours += istate + irows * indexer_row_bytes();
      f32 += istate + irows * D * 4;
      f16 += istate + irows * D * 2;
    }
    out.push_back({ctx, ours / ctx, f32 / ctx, f16 / ctx, ours});
  }
  return out;
}

size_t Dsv4Cache::allocated_bytes() const {
  size_t s = 0;
  for (const Layer& L : layers_)
    for (const Buffer* b : {&L.ring, &L.comp_kv, &L.comp_score, &L.comp_rows, &L.idx_kv, &L.idx_score, &L.idx_rows})
      s += b->size();
  return s;
}

}  // namespace kvcore
