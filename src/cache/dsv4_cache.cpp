// Dsv4Cache: storage, append (decode and prefill paths), reads, reset.
#include "kvcore/cache/dsv4_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <sstream>

#include "cache/dsv4_export.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/dsv4.hpp"
#include "kvcore/runtime.hpp"
#include "ops/checks.hpp"
#include "ops/dsv4_checks.hpp"
#include "ops/dsv4_shift.hpp"
#include "ops/shift_params.hpp"

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

Dsv4CacheConfig Dsv4CacheConfig::v4_flash(int32_t max_context, int32_t max_seqs) {
  Dsv4CacheConfig c;
  c.layers = v4_flash_schedule();
  c.max_context = max_context;
  c.max_seqs = max_seqs;
  return c;
}

Dsv4CacheConfig Dsv4CacheConfig::v4_pro(int32_t max_context, int32_t max_seqs) {
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
  for (size_t l = 0; l < layers.size(); ++l)
    KVCORE_DSV4_CHECK(static_cast<uint8_t>(layers[l]) <= static_cast<uint8_t>(Dsv4LayerKind::HCA), w, ".layers[", l,
                      "] must be Window, CSA or HCA, got ", static_cast<int>(layers[l]));
  KVCORE_DSV4_CHECK(quant == Dsv4Quant::Off || quant == Dsv4Quant::On, w, ".quant must be Off or On, got ",
                    static_cast<int>(quant));
  KVCORE_DSV4_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 4096, w, ".head_dim must be even in [2, 4096], got ", head_dim);
  KVCORE_DSV4_CHECK(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim, w, ".n_rot must be even in [2, head_dim], got ", n_rot);
  KVCORE_DSV4_CHECK(window >= 1 && window <= 65536, w, ".window must be in [1, 65536], got ", window);
  KVCORE_DSV4_CHECK(csa_ratio >= 1 && csa_ratio <= 4096, w, ".csa_ratio must be in [1, 4096], got ", csa_ratio);
  KVCORE_DSV4_CHECK(hca_ratio >= 1 && hca_ratio <= 4096, w, ".hca_ratio must be in [1, 4096], got ", hca_ratio);
  KVCORE_DSV4_CHECK(max_context >= 1 && max_context <= (1 << 24), w, ".max_context must be in [1, 2^24], got ", max_context);
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
  if (maybe_compressed_rope_table) {
    const auto& l = maybe_compressed_rope_table->layout;
    KVCORE_DSV4_CHECK(l.n_rot == n_rot && l.first_dim == head_dim - n_rot && (l.interleaved == 0 || l.interleaved == 1), w,
                ".maybe_compressed_rope_table must rotate the last n_rot dims of head_dim");
    checks::rope_table_finite(w, "maybe_compressed_rope_table", *maybe_compressed_rope_table);
  } else {
    compressed_rope.validate(head_dim);
    KVCORE_DSV4_CHECK(compressed_rope.n_rot == n_rot && compressed_rope.slice == RopeSlice::Tail, w,
                ".compressed_rope must rotate the tail n_rot = ", n_rot, " dims, got ", described(compressed_rope));
  }
}

// ---- the implementation ------------------------------------------------------------

struct Dsv4Cache::Impl {
  struct Layer {
    Dsv4LayerKind kind = Dsv4LayerKind::Window;
    Dsv4Compressor comp, idx;
    int64_t comp_cap = 0, idx_cap = 0;
    Buffer ring, comp_kv, comp_score, comp_rows, idx_kv, idx_score, idx_rows;
    Buffer comp_ape, comp_norm, idx_ape, idx_norm;
    DType comp_ape_dtype = DType::F32, idx_ape_dtype = DType::F32;
    bool has_weights = false;
  };
  Dsv4CacheConfig cfg;
  Device device;
  math::RopeTable comp_rope{}, idx_rope{};
  bool comp_packed = false, idx_packed = false;
  std::vector<Layer> layers;
  std::vector<int32_t> length;      // [slot * n_layers + layer]
  std::map<SeqId, int32_t> slots;   // live sequence -> its storage slot
  std::vector<int32_t> free_slots;  // a stack: back() is the next slot handed out
  SeqId next_id = 0;
  Buffer shift_scratch;  // snapshots of shift(): grown on demand, kept for the next shift

  int32_t n_layers() const { return static_cast<int32_t>(layers.size()); }
  const Layer& layer_of(const char* what, int32_t layer) const {
    KVCORE_DSV4_CHECK(layer >= 0 && layer < n_layers(), "Dsv4Cache::", what, ": layer must be in [0, ", n_layers(), "), got ",
                      layer);
    return layers[layer];
  }
  int32_t slot_of(const char* what, SeqId seq) const {
    auto it = slots.find(seq);
    KVCORE_DSV4_CHECK(it != slots.end(), "Dsv4Cache::", what, ": unknown or erased sequence id ", seq);
    return it->second;
  }
  int32_t& len(int32_t slot, int32_t layer) { return length[static_cast<size_t>(slot) * layers.size() + layer]; }
  int32_t len(int32_t slot, int32_t layer) const { return length[static_cast<size_t>(slot) * layers.size() + layer]; }
  int32_t compressed_row_bytes() const {
    return comp_packed ? cfg.compressor(Dsv4LayerKind::CSA).packed_row_bytes() : cfg.head_dim * 4;
  }
  int32_t indexer_row_bytes() const { return idx_packed ? cfg.indexer().packed_row_bytes() : cfg.index_dim * 4; }

  // Views of one slot's storage (arguments already checked).
  TensorRef slice(const Buffer& b, DType dt, int32_t slot, int64_t rows, int64_t cols) const {
    auto* base = static_cast<uint8_t*>(b.data()) + static_cast<size_t>(slot) * rows * cols * dtype_size(dt);
    return TensorRef(base, dt, device, {rows, cols});
  }
  TensorRef ring(int32_t slot, int32_t layer) const {
    return slice(layers[layer].ring, cfg.quant == Dsv4Quant::On ? DType::F16 : DType::F32, slot, cfg.window, cfg.head_dim);
  }
  TensorRef comp_store(int32_t slot, int32_t layer) const {
    const Layer& L = layers[layer];
    const int64_t cap = std::max<int64_t>(L.comp_cap, 1);
    return comp_packed ? slice(L.comp_rows, DType::U8, slot, cap, compressed_row_bytes())
                       : slice(L.comp_rows, DType::F32, slot, cap, cfg.head_dim);
  }
  TensorRef idx_store(int32_t slot, int32_t layer) const {
    const Layer& L = layers[layer];
    const int64_t cap = std::max<int64_t>(L.idx_cap, 1);
    return idx_packed ? slice(L.idx_rows, DType::U8, slot, cap, indexer_row_bytes())
                      : slice(L.idx_rows, DType::F32, slot, cap, cfg.index_dim);
  }
  TensorRef state_of(int32_t slot, int32_t layer, bool indexer, bool score) const {
    const Layer& L = layers[layer];
    const Dsv4Compressor& c = indexer ? L.idx : L.comp;
    const Buffer& b = indexer ? (score ? L.idx_score : L.idx_kv) : (score ? L.comp_score : L.comp_kv);
    return slice(b, DType::F32, slot, c.state_rows(), c.width());
  }
  Dsv4CompressorWeights weights_of(const Layer& L, bool indexer) const {
    const Dsv4Compressor& c = indexer ? L.idx : L.comp;
    Dsv4CompressorWeights w;
    w.ape = TensorRef((indexer ? L.idx_ape : L.comp_ape).data(), indexer ? L.idx_ape_dtype : L.comp_ape_dtype, device,
                      {c.ratio, c.width()});
    w.norm_weight = TensorRef((indexer ? L.idx_norm : L.comp_norm).data(), DType::F32, device, {c.head_dim});
    w.rope = indexer ? idx_rope : comp_rope;
    return w;
  }
  // Empty one slot's storage of every layer (ring zeros, compressor states reset).
  void clear_slot(int32_t slot) {
    for (int32_t li = 0; li < n_layers(); ++li) {
      const Layer& L = layers[li];
      const TensorRef r = ring(slot, li);
      fill_bytes(r.data(), device, 0, static_cast<size_t>(r.span_bytes()), cfg.stream);
      if (L.kind != Dsv4LayerKind::Window)
        dsv4_compressor_reset(state_of(slot, li, false, false), state_of(slot, li, false, true), L.comp, cfg.stream);
      if (L.kind == Dsv4LayerKind::CSA)
        dsv4_compressor_reset(state_of(slot, li, true, false), state_of(slot, li, true, true), L.idx, cfg.stream);
    }
  }
};

Dsv4Cache::Impl& Dsv4Cache::impl() {
  KVCORE_DSV4_CHECK(impl_ != nullptr, "Dsv4Cache: this cache was moved from; it holds nothing and accepts no calls");
  return *impl_;
}

const Dsv4Cache::Impl& Dsv4Cache::impl() const {
  KVCORE_DSV4_CHECK(impl_ != nullptr, "Dsv4Cache: this cache was moved from; it holds nothing and accepts no calls");
  return *impl_;
}

Dsv4Cache::~Dsv4Cache() = default;
Dsv4Cache::Dsv4Cache(Dsv4Cache&&) noexcept = default;
Dsv4Cache& Dsv4Cache::operator=(Dsv4Cache&&) noexcept = default;

// ---- construction ------------------------------------------------------------------

Dsv4Cache::Dsv4Cache(Dsv4CacheConfig config, Device device) {
  config.validate();
  checks::device_known("Dsv4Cache", device);
  checks::backend_available("Dsv4Cache", device);
  auto m = std::make_unique<Impl>();
  m->cfg = std::move(config);
  m->device = device;
  const Dsv4CacheConfig& cfg = m->cfg;
  m->comp_rope = cfg.maybe_compressed_rope_table ? *cfg.maybe_compressed_rope_table : make_rope_table(cfg.compressed_rope, cfg.head_dim);
  m->comp_rope.attention_factor = 1.0f;
  m->idx_rope = m->comp_rope;
  m->idx_rope.layout.first_dim = cfg.index_dim - cfg.n_rot;
  const bool quant = cfg.quant == Dsv4Quant::On;
  m->comp_packed = quant && cfg.packed && cfg.compressor(Dsv4LayerKind::CSA).packed_row_bytes() > 0;
  m->idx_packed = quant && cfg.packed && cfg.indexer().packed_row_bytes() > 0;

  const size_t S = static_cast<size_t>(cfg.max_seqs);
  m->layers.resize(cfg.layers.size());
  for (size_t li = 0; li < m->layers.size(); ++li) {
    Impl::Layer& L = m->layers[li];
    L.kind = cfg.layers[li];
    L.ring = Buffer(S * cfg.window * cfg.head_dim * (quant ? 2 : 4), device);
    if (L.kind == Dsv4LayerKind::Window) continue;
    L.comp = cfg.compressor(L.kind);
    L.comp_cap = cfg.max_context / L.comp.ratio;
    const size_t st = S * L.comp.state_rows() * L.comp.width() * 4;
    L.comp_kv = Buffer(st, device);
    L.comp_score = Buffer(st, device);
    L.comp_rows = Buffer(S * std::max<int64_t>(L.comp_cap, 1) * m->compressed_row_bytes(), device);
    if (L.kind == Dsv4LayerKind::CSA) {
      L.idx = cfg.indexer();
      L.idx_cap = cfg.max_context / L.idx.ratio;
      const size_t si = S * L.idx.state_rows() * L.idx.width() * 4;
      L.idx_kv = Buffer(si, device);
      L.idx_score = Buffer(si, device);
      L.idx_rows = Buffer(S * std::max<int64_t>(L.idx_cap, 1) * m->indexer_row_bytes(), device);
    }
  }
  m->length.assign(S * m->layers.size(), 0);
  for (int32_t s = cfg.max_seqs - 1; s >= 0; --s) m->free_slots.push_back(s);  // slot 0 first
  impl_ = std::move(m);
}

const Dsv4CacheConfig& Dsv4Cache::config() const { return impl().cfg; }
Device Dsv4Cache::device() const { return impl().device; }
int32_t Dsv4Cache::n_layers() const { return impl().n_layers(); }
bool Dsv4Cache::compressed_packed() const { return impl().comp_packed; }
bool Dsv4Cache::indexer_packed() const { return impl().idx_packed; }

Dsv4LayerKind Dsv4Cache::kind(int32_t layer) const { return impl().layer_of("kind", layer).kind; }

int32_t Dsv4Cache::raw_row_bytes() const {
  const Impl& m = impl();
  return m.cfg.head_dim * (m.cfg.quant == Dsv4Quant::On ? 2 : 4);
}
int32_t Dsv4Cache::compressed_row_bytes() const { return impl().compressed_row_bytes(); }
int32_t Dsv4Cache::indexer_row_bytes() const { return impl().indexer_row_bytes(); }

// ---- sequences ---------------------------------------------------------------------------

SeqId Dsv4Cache::create() {
  Impl& m = impl();
  require(!m.free_slots.empty(), ErrorCode::OutOfMemory, "Dsv4Cache::create: all max_seqs = ", m.cfg.max_seqs,
          " sequences are live");
  const int32_t slot = m.free_slots.back();
  m.clear_slot(slot);  // before anything is recorded: a device error leaves the cache as it was
  m.free_slots.pop_back();
  for (int32_t li = 0; li < m.n_layers(); ++li) m.len(slot, li) = 0;
  const SeqId id = m.next_id++;
  m.slots.emplace(id, slot);
  return id;
}

void Dsv4Cache::erase(SeqId seq) {
  Impl& m = impl();
  const int32_t slot = m.slot_of("erase", seq);
  m.free_slots.push_back(slot);  // its storage is cleared when create() hands it out again
  m.slots.erase(seq);
}

bool Dsv4Cache::contains(SeqId seq) const { return impl().slots.count(seq) != 0; }

std::vector<SeqId> Dsv4Cache::sequences() const {
  std::vector<SeqId> ids;
  for (const auto& [id, slot] : impl().slots) ids.push_back(id);
  return ids;
}

void Dsv4Cache::truncate(SeqId seq, int32_t n) {
  Impl& m = impl();
  const int32_t slot = m.slot_of("truncate", seq);
  int32_t lo = INT32_MAX, hi = 0;  // shortest and longest layer
  for (int32_t li = 0; li < m.n_layers(); ++li) {
    lo = std::min(lo, m.len(slot, li));
    hi = std::max(hi, m.len(slot, li));
  }
  KVCORE_DSV4_CHECK(n >= 0 && n <= lo, "Dsv4Cache::truncate: n = ", n, " outside [0, ", lo, "] (the shortest layer of sequence ",
                    seq, ")");
  if (n == hi) return;  // every layer already holds n tokens
  require(n == 0, ErrorCode::NotSupported, "Dsv4Cache::truncate(", seq, ", ", n,
          "): only n = 0 (empty) or n = the length is possible: compressor states cannot be rewound");
  m.clear_slot(slot);
  for (int32_t li = 0; li < m.n_layers(); ++li) m.len(slot, li) = 0;
}

int32_t Dsv4Cache::shift_granule() const {
  const Impl& m = impl();
  int64_t g = 1;  // each ratio is <= 4096 and at most two kinds exist: the lcm fits
  for (const Impl::Layer& L : m.layers)
    if (L.kind != Dsv4LayerKind::Window) g = std::lcm(g, static_cast<int64_t>(m.cfg.ratio(L.kind)));
  return static_cast<int32_t>(g);
}

void Dsv4Cache::shift(SeqId seq, int32_t n_keep, int32_t n_discard) {
  Impl& m = impl();
  const Dsv4CacheConfig& cfg = m.cfg;
  const int32_t slot = m.slot_of("shift", seq);
  const int32_t L = m.len(slot, 0);
  for (int32_t li = 1; li < m.n_layers(); ++li)
    KVCORE_DSV4_CHECK(m.len(slot, li) == L, "Dsv4Cache::shift: every layer of sequence ", seq,
                      " must hold the same number of tokens; layer 0 holds ", L, ", layer ", li, " holds ", m.len(slot, li),
                      " (finish the step's appends first)");
  KVCORE_DSV4_CHECK(n_keep >= 0 && n_discard >= 0 && static_cast<int64_t>(n_keep) + n_discard <= L,
                    "Dsv4Cache::shift: need 0 <= n_keep and 0 <= n_discard with n_keep + n_discard <= ", L,
                    " (the sequence length), got n_keep ", n_keep, ", n_discard ", n_discard);
  const int32_t g = shift_granule();
  KVCORE_DSV4_CHECK(n_keep % g == 0 && n_discard % g == 0, "Dsv4Cache::shift: n_keep (", n_keep, ") and n_discard (",
                    n_discard, ") must be multiples of ", g,
                    " (the lcm of the compression ratios): a cut inside a window would split a compressed row");
  if (n_discard == 0) return;
  const int32_t W = cfg.window;
  const int64_t tail = static_cast<int64_t>(L) - n_keep - n_discard;
  require(!(L > W && tail < W), ErrorCode::NotSupported, "Dsv4Cache::shift(n_keep ", n_keep, ", n_discard ", n_discard,
          "): sequence ", seq, " holds ", L, " tokens, more than the window of ", W, ", and the kept tail of ", tail,
          " tokens is shorter than the window: the new window would need raw rows of kept tokens before ", n_keep,
          " that the ring has evicted (keep at least ", W, " tokens after the discarded range)");
  require(n_discard < (1 << 24), ErrorCode::NotSupported, "Dsv4Cache::shift: n_discard = ", n_discard,
          " must be < 2^24 (the accurate angle reduction of a shift needs it)");
  // The row-job kernels carry up to 64 pairs per RoPE table.
  require(cfg.n_rot <= 128, ErrorCode::NotSupported, "Dsv4Cache::shift: n_rot = ", cfg.n_rot, " > 128 is not supported");
  const bool has_window = std::find(cfg.layers.begin(), cfg.layers.end(), Dsv4LayerKind::Window) != cfg.layers.end();
  const bool has_comp = std::any_of(cfg.layers.begin(), cfg.layers.end(), [](Dsv4LayerKind k) { return k != Dsv4LayerKind::Window; });
  require(!has_comp || m.comp_packed || cfg.head_dim * 4 <= ops::kShiftMaxHeadBytes, ErrorCode::NotSupported,
          "Dsv4Cache::shift: f32 compressed rows of head_dim ", cfg.head_dim, " exceed the ", ops::kShiftMaxHeadBytes,
          " bytes the row shift takes");
  math::RopeTable window_table{};
  if (has_window) {
    try {
      window_table = make_rope_table(cfg.window_rope, cfg.head_dim);
    } catch (const Error& e) {
      throw Error(ErrorCode::InvalidArgument, detail::concat("Dsv4Cache::shift: Dsv4CacheConfig.window_rope does not fit head_dim ",
                                                             cfg.head_dim, ": ", e.what()));
    }
    require(window_table.layout.n_rot <= 128, ErrorCode::NotSupported, "Dsv4Cache::shift: window_rope rotates ",
            window_table.layout.n_rot, " dims, more than the 128 supported");
  }

  ops::Dsv4ShiftCall call;
  call.comp_rope = &m.comp_rope;
  call.idx_rope = &m.idx_rope;
  call.quant = cfg.quant == Dsv4Quant::On;
  call.rows_packed = m.comp_packed;
  call.idx_packed = m.idx_packed;
  call.window = W;
  call.head_dim = cfg.head_dim;
  call.index_dim = cfg.index_dim;
  call.length = L;
  call.n_keep = n_keep;
  call.n_discard = n_discard;
  call.device = m.device;
  call.stream = cfg.stream;
  for (int32_t li = 0; li < m.n_layers(); ++li) {
    const Impl::Layer& Ly = m.layers[li];
    ops::Dsv4ShiftLayerViews v;
    v.ring = m.ring(slot, li);
    v.raw_rope = Ly.kind == Dsv4LayerKind::Window ? &window_table : &m.comp_rope;
    v.ratio = cfg.ratio(Ly.kind);
    if (Ly.kind != Dsv4LayerKind::Window) v.rows = m.comp_store(slot, li);
    if (Ly.kind == Dsv4LayerKind::CSA) v.idx_rows = m.idx_store(slot, li);
    call.layers.push_back(v);
  }
  ops::dsv4_shift_sequence(call, m.shift_scratch);
  for (int32_t li = 0; li < m.n_layers(); ++li) m.len(slot, li) = L - n_discard;
}

// ---- weights -------------------------------------------------------------------------

namespace {

Buffer copy_tensor(const TensorRef& t, Device to, Stream stream) {
  Buffer b(static_cast<size_t>(t.numel()) * t.element_size(), to);
  copy_bytes(b.data(), to, t.data(), t.device(), b.size(), stream);
  synchronize(to, stream);
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
  Impl& m = impl();
  const Dsv4LayerKind k = m.layer_of("set_weights", layer).kind;
  KVCORE_DSV4_CHECK(k != Dsv4LayerKind::Window, "Dsv4Cache::set_weights: layer ", layer, " is window-only and has no compressor");
  Impl::Layer& L = m.layers[layer];
  check_weight("comp_ape", w.comp_ape, {L.comp.ratio, L.comp.width()}, true);
  check_weight("comp_norm", w.comp_norm, {L.comp.head_dim}, false);
  if (k == Dsv4LayerKind::CSA) {
    check_weight("idx_ape", w.idx_ape, {L.idx.ratio, L.idx.width()}, true);
    check_weight("idx_norm", w.idx_norm, {L.idx.head_dim}, false);
  }
  Buffer ca = copy_tensor(w.comp_ape, m.device, m.cfg.stream), cn = copy_tensor(w.comp_norm, m.device, m.cfg.stream), ia, in;
  if (k == Dsv4LayerKind::CSA) {
    ia = copy_tensor(w.idx_ape, m.device, m.cfg.stream);
    in = copy_tensor(w.idx_norm, m.device, m.cfg.stream);
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

// ---- views -----------------------------------------------------------------------------

TensorRef Dsv4Cache::raw_ring(SeqId seq, int32_t layer) const {
  const Impl& m = impl();
  m.layer_of("raw_ring", layer);
  return m.ring(m.slot_of("raw_ring", seq), layer);
}

TensorRef Dsv4Cache::compressed_store(SeqId seq, int32_t layer) const {
  const Impl& m = impl();
  const Impl::Layer& L = m.layer_of("compressed_store", layer);
  const int32_t slot = m.slot_of("compressed_store", seq);
  KVCORE_DSV4_CHECK(L.kind != Dsv4LayerKind::Window, "Dsv4Cache::compressed_store: layer ", layer, " is window-only");
  return m.comp_store(slot, layer);
}

TensorRef Dsv4Cache::indexer_store(SeqId seq, int32_t layer) const {
  const Impl& m = impl();
  const Impl::Layer& L = m.layer_of("indexer_store", layer);
  const int32_t slot = m.slot_of("indexer_store", seq);
  KVCORE_DSV4_CHECK(L.kind == Dsv4LayerKind::CSA, "Dsv4Cache::indexer_store: layer ", layer, " is not a CSA layer");
  return m.idx_store(slot, layer);
}

TensorRef Dsv4Cache::state(SeqId seq, int32_t layer, Dsv4State which) const {
  const Impl& m = impl();
  const Impl::Layer& L = m.layer_of("state", layer);
  const int32_t slot = m.slot_of("state", seq);
  KVCORE_DSV4_CHECK(static_cast<uint8_t>(which) <= static_cast<uint8_t>(Dsv4State::IndexerScore),
                    "Dsv4Cache::state: which must be a Dsv4State, got ", static_cast<int>(which));
  const bool indexer = which == Dsv4State::IndexerKv || which == Dsv4State::IndexerScore;
  const bool score = which == Dsv4State::CompressorScore || which == Dsv4State::IndexerScore;
  KVCORE_DSV4_CHECK(indexer ? L.kind == Dsv4LayerKind::CSA : L.kind != Dsv4LayerKind::Window, "Dsv4Cache::state: layer ",
                    layer, " (", dsv4_layer_kind_name(L.kind), ") has no ", indexer ? "indexer" : "compressor");
  return m.state_of(slot, layer, indexer, score);
}

int32_t Dsv4Cache::length(SeqId seq, int32_t layer) const {
  const Impl& m = impl();
  m.layer_of("length", layer);
  return m.len(m.slot_of("length", seq), layer);
}

int32_t Dsv4Cache::compressed_rows(SeqId seq, int32_t layer) const {
  const int32_t r = impl().cfg.ratio(kind(layer));
  return r ? length(seq, layer) / r : 0;
}

int32_t Dsv4Cache::indexer_rows(SeqId seq, int32_t layer) const {
  return kind(layer) == Dsv4LayerKind::CSA ? length(seq, layer) / impl().cfg.csa_ratio : 0;
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

void Dsv4Cache::append(SeqId seq, int32_t layer, int32_t pos, const Dsv4TokenInputs& in) {
  Impl& m = impl();
  const Dsv4CacheConfig& cfg = m.cfg;
  m.layer_of("append", layer);
  const int32_t slot = m.slot_of("append", seq);
  Impl::Layer& L = m.layers[layer];
  int32_t& len = m.len(slot, layer);
  KVCORE_DSV4_CHECK(pos == len, "Dsv4Cache::append: seq ", seq, " layer ", layer, " holds ", len,
              " tokens, so the next position is ", len, "; got pos ", pos, pos < len ? " (repeats)" : " (skips)");
  KVCORE_DSV4_CHECK(in.kv.data() != nullptr && in.kv.ndim() == 2, "Dsv4Cache::append: kv must be f32[n, ", cfg.head_dim, "], got ",
              described(in.kv));
  const int64_t n = in.kv.size(0);
  KVCORE_DSV4_CHECK(n >= 1, "Dsv4Cache::append: at least one token, got kv ", described(in.kv));
  KVCORE_DSV4_CHECK(n <= cfg.max_context - pos, "Dsv4Cache::append: positions up to ", pos + n - 1, " exceed max_context ",
              cfg.max_context);
  check_input("kv", in.kv, n, cfg.head_dim, m.device);
  if (L.kind != Dsv4LayerKind::Window) {
    KVCORE_DSV4_CHECK(L.has_weights, "Dsv4Cache::append: layer ", layer, " (", dsv4_layer_kind_name(L.kind),
                ") has no weights: call set_weights first");
    check_input("comp_c", in.comp_c, n, L.comp.width(), m.device);
    check_input("comp_z", in.comp_z, n, L.comp.width(), m.device);
  }
  if (L.kind == Dsv4LayerKind::CSA) {
    check_input("idx_c", in.idx_c, n, L.idx.width(), m.device);
    check_input("idx_z", in.idx_z, n, L.idx.width(), m.device);
  }
  // Everything checked: from here on the ops cannot reject their arguments.
  const bool has_comp = L.kind != Dsv4LayerKind::Window, has_idx = L.kind == Dsv4LayerKind::CSA;
  if (n == 1) {  // decode: one fused call (one kernel on CUDA)
    Dsv4DecodeCompressor dc, di;
    auto part = [&](Dsv4DecodeCompressor& d, bool indexer, const TensorRef& c, const TensorRef& z) {
      d.comp = indexer ? L.idx : L.comp;
      d.c = row_of(c, 0);
      d.z = row_of(z, 0);
      d.state_kv = m.state_of(slot, layer, indexer, false);
      d.state_score = m.state_of(slot, layer, indexer, true);
      d.w = m.weights_of(L, indexer);
      d.rows = indexer ? m.idx_store(slot, layer) : m.comp_store(slot, layer);
    };
    if (has_comp) part(dc, false, in.comp_c, in.comp_z);
    if (has_idx) part(di, true, in.idx_c, in.idx_z);
    dsv4_decode_layer(in.kv, m.ring(slot, layer), cfg.n_rot, pos, cfg.quant, has_comp ? &dc : nullptr,
                      has_idx ? &di : nullptr, cfg.stream);
    len = pos + 1;
    return;
  }
  dsv4_kv_finalize(in.kv, m.ring(slot, layer), pos % cfg.window, cfg.n_rot, cfg.quant, cfg.stream);
  auto compress = [&](bool indexer, const TensorRef& c, const TensorRef& z) {
    const Dsv4Compressor& comp = indexer ? L.idx : L.comp;
    dsv4_compress_prefill(c, z, m.state_of(slot, layer, indexer, false), m.state_of(slot, layer, indexer, true), pos, comp,
                          m.weights_of(L, indexer), cfg.quant, indexer ? m.idx_store(slot, layer) : m.comp_store(slot, layer),
                          cfg.stream);
  };
  if (has_comp) compress(false, in.comp_c, in.comp_z);
  if (has_idx) compress(true, in.idx_c, in.idx_z);
  len = pos + static_cast<int32_t>(n);
}

// ---- reading ------------------------------------------------------------------------------

namespace {

std::vector<uint8_t> download(const TensorRef& t, int64_t rows, Stream stream) {
  const size_t row_bytes = static_cast<size_t>(t.size(1)) * t.element_size();
  std::vector<uint8_t> v(static_cast<size_t>(rows) * row_bytes);
  copy_bytes(v.data(), Device::cpu(), t.data(), t.device(), v.size(), stream);
  return v;
}

}  // namespace

std::vector<float> Dsv4Cache::read_window(SeqId seq, int32_t layer) const {
  const Impl& m = impl();
  const TensorRef ring = raw_ring(seq, layer);
  const int64_t L = length(seq, layer), W = m.cfg.window, hd = m.cfg.head_dim;
  const std::vector<uint8_t> raw = download(ring, W, m.cfg.stream);
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

std::vector<float> Dsv4Cache::read_compressed(SeqId seq, int32_t layer) const {
  const Impl& m = impl();
  const int64_t n = compressed_rows(seq, layer), hd = m.cfg.head_dim;
  if (n == 0) return {};
  const TensorRef store = compressed_store(seq, layer);
  const std::vector<uint8_t> raw = download(store, n, m.cfg.stream);
  std::vector<float> out(static_cast<size_t>(n * hd));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < hd; ++d) {
      if (m.comp_packed) {
        out[i * hd + d] = math::dsv4_unpack_attention_value(raw.data() + i * store.size(1), static_cast<int>(d));
      } else {
        std::memcpy(&out[i * hd + d], raw.data() + (i * hd + d) * 4, 4);
      }
    }
  return out;
}

std::vector<float> Dsv4Cache::read_indexer(SeqId seq, int32_t layer) const {
  const Impl& m = impl();
  const int64_t n = indexer_rows(seq, layer), D = m.cfg.index_dim;
  if (n == 0) return {};
  const TensorRef store = indexer_store(seq, layer);
  const std::vector<uint8_t> raw = download(store, n, m.cfg.stream);
  std::vector<float> out(static_cast<size_t>(n * D));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d) {
      if (m.idx_packed) {
        out[i * D + d] = math::dsv4_unpack_fp4_value(raw.data() + i * store.size(1), static_cast<int>(D), static_cast<int>(d));
      } else {
        std::memcpy(&out[i * D + d], raw.data() + (i * D + d) * 4, 4);
      }
    }
  return out;
}

std::vector<float> Dsv4Cache::read_state(SeqId seq, int32_t layer, Dsv4State which) const {
  const TensorRef t = state(seq, layer, which);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy_bytes(v.data(), Device::cpu(), t.data(), t.device(), v.size() * 4, impl().cfg.stream);
  return v;
}

void Dsv4Cache::indexer_topk(SeqId seq, int32_t layer, const TensorRef& q, const TensorRef& weights,
                             int32_t first_query_pos, const TensorRef& scores, const TensorRef& out) const {
  const Impl& m = impl();
  const Impl::Layer& L = m.layer_of("indexer_topk", layer);
  const int32_t slot = m.slot_of("indexer_topk", seq);
  KVCORE_DSV4_CHECK(L.kind == Dsv4LayerKind::CSA, "Dsv4Cache::indexer_topk: layer ", layer, " is not a CSA layer");
  KVCORE_DSV4_CHECK(q.ndim() == 3 && q.size(1) == m.cfg.index_heads && q.size(2) == m.cfg.index_dim,
                    "Dsv4Cache::indexer_topk: q must be [n, ", m.cfg.index_heads, ", ", m.cfg.index_dim, "], got ", described(q));
  const int32_t len = m.len(slot, layer);
  KVCORE_DSV4_CHECK(first_query_pos >= 0 && q.size(0) <= len - first_query_pos, "Dsv4Cache::indexer_topk: queries at ",
                    first_query_pos, "..", first_query_pos + q.size(0) - 1, " must be tokens already appended (", len, ")");
  dsv4_indexer_topk(q, weights, m.idx_store(slot, layer), len / m.cfg.csa_ratio, first_query_pos, m.cfg.csa_ratio,
                    m.cfg.quant, scores, out, m.cfg.stream);
}

// ---- inspection -----------------------------------------------------------------------------------

std::string Dsv4Cache::debug_state() const {
  const Impl& m = impl();
  std::ostringstream os;
  os << "next_id " << m.next_id << "\n";
  for (const auto& [id, slot] : m.slots) {
    os << "seq " << id << " slot " << slot << " lengths";
    for (int32_t li = 0; li < m.n_layers(); ++li) os << ' ' << m.len(slot, li);
    os << "\n";
  }
  os << "free";
  for (int32_t s : m.free_slots) os << ' ' << s;
  os << "\nweights";
  for (const Impl::Layer& L : m.layers) os << ' ' << (L.has_weights ? 1 : 0);
  os << "\n";
  return os.str();
}

std::vector<Dsv4MemoryRow> Dsv4Cache::memory_report(const std::vector<int32_t>& contexts) const {
  const Impl& m = impl();
  const Dsv4CacheConfig& cfg = m.cfg;
  std::vector<Dsv4MemoryRow> out;
  const double hd = cfg.head_dim, D = cfg.index_dim;
  for (int32_t ctx : contexts) {
    KVCORE_DSV4_CHECK(ctx >= 1, "Dsv4Cache::memory_report: contexts must be >= 1, got ", ctx);
    double ours = 0, f32 = 0, f16 = 0;
    for (const Impl::Layer& L : m.layers) {
      const double raw = static_cast<double>(std::min(ctx, cfg.window));
      ours += raw * raw_row_bytes();
      f32 += raw * hd * 4;
      f16 += raw * hd * 2;
      if (L.kind == Dsv4LayerKind::Window) continue;
      const double state = 2.0 * L.comp.state_rows() * L.comp.width() * 4;
      const double rows = static_cast<double>(ctx / L.comp.ratio);
      ours += state + rows * m.compressed_row_bytes();
      f32 += state + rows * hd * 4;
      f16 += state + rows * hd * 2;
      if (L.kind != Dsv4LayerKind::CSA) continue;
      const double istate = 2.0 * L.idx.state_rows() * L.idx.width() * 4;
      const double irows = static_cast<double>(ctx / L.idx.ratio);
      ours += istate + irows * m.indexer_row_bytes();
      f32 += istate + irows * D * 4;
      f16 += istate + irows * D * 2;
    }
    out.push_back({ctx, ours / ctx, f32 / ctx, f16 / ctx, ours});
  }
  return out;
}

size_t Dsv4Cache::allocated_bytes() const {
  size_t s = 0;
  for (const Impl::Layer& L : impl().layers)
    for (const Buffer* b : {&L.ring, &L.comp_kv, &L.comp_score, &L.comp_rows, &L.idx_kv, &L.idx_score, &L.idx_rows})
      s += b->size();
  return s;
}

// ---- the persistence hook (cache/dsv4_export.hpp) -----------------------------------------

struct Dsv4CacheAccess {
  static Dsv4Cache::Impl& impl(Dsv4Cache& c) { return c.impl(); }
};

void dsv4_set_lengths(Dsv4Cache& cache, SeqId seq, std::span<const int64_t> lengths) {
  Dsv4Cache::Impl& m = Dsv4CacheAccess::impl(cache);
  const int32_t slot = m.slot_of("dsv4_set_lengths", seq);
  require_arg(lengths.size() == m.layers.size(), "dsv4_set_lengths: ", lengths.size(), " lengths for ", m.layers.size(),
              " layers");
  for (size_t l = 0; l < lengths.size(); ++l) m.len(slot, static_cast<int32_t>(l)) = static_cast<int32_t>(lengths[l]);
}

}  // namespace kvcore
