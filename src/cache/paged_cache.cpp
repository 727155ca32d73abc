// PagedCache: construction, views of the layout contract, statistics, read-back.
#include "kvcore/cache/paged_cache.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <sstream>
#include <utility>

#include "cache/paged_impl.hpp"
#include "kvcore/error.hpp"
#include "kvcore/runtime.hpp"
#include "ops/attention_support.hpp"
#include "ops/checks.hpp"
#include "ops/kv_store_row.hpp"

namespace kvcore {

void PagedCacheConfig::validate() const {
  auto format_ok = [](KvFormat f) { return static_cast<uint8_t>(f) <= static_cast<uint8_t>(KvFormat::Dsv4Row); };
  require_arg(format_ok(k_format), "PagedCacheConfig.k_format must be a KvFormat, got ", static_cast<int>(k_format));
  require_arg(format_ok(v_format), "PagedCacheConfig.v_format must be a KvFormat, got ", static_cast<int>(v_format));
  require_arg(rope_mode == RopeMode::RopeStored || rope_mode == RopeMode::RopeOnRead,
              "PagedCacheConfig.rope_mode must be RopeStored or RopeOnRead, got ", static_cast<int>(rope_mode));
  require_arg(n_layers > 0, "PagedCacheConfig.n_layers must be > 0, got ", n_layers);
  require_arg(n_kv_heads > 0, "PagedCacheConfig.n_kv_heads must be > 0, got ", n_kv_heads);
  require_arg(head_dim > 0 && head_dim <= kMaxKvHeadDim, "PagedCacheConfig.head_dim must be in [1, ", kMaxKvHeadDim,
              "], got ", head_dim);
  require_arg(v_head_dim >= 0 && v_head_dim <= kMaxKvHeadDim, "PagedCacheConfig.v_head_dim must be in [0, ", kMaxKvHeadDim,
              "], got ", v_head_dim);
  require_arg(block_size > 0 && block_size <= 4096, "PagedCacheConfig.block_size must be in [1, 4096], got ", block_size);
  require_arg(num_blocks > 0, "PagedCacheConfig.num_blocks must be > 0, got ", num_blocks);
  require_arg(static_cast<int64_t>(num_blocks) * block_size <= INT32_MAX, "PagedCacheConfig: num_blocks ", num_blocks,
              " x block_size ", block_size, " cells exceed i32 cell ids");
  if (k_format == KvFormat::Fp8)
    require_arg(head_dim % 64 == 0, "PagedCacheConfig: fp8 K needs head_dim % 64 == 0, got ", head_dim);
  if (v_from_k_latent) {
    // V is read from K's rows: it must fit in them, in a format whose dims are addressable one by
    // one (Dsv4Row packs dims), on whole FP8 scale groups, and no rotation may ever touch it.
    require_arg(v_head_dim >= 1 && v_head_dim <= head_dim, "PagedCacheConfig.v_head_dim must be in [1, head_dim = ",
                head_dim, "] with v_from_k_latent (V is the first v_head_dim dims of the K row), got ", v_head_dim);
    require_arg(k_format != KvFormat::Dsv4Row, "PagedCacheConfig.k_format: v_from_k_latent needs f32, f16, bf16 or fp8 K, got ",
                kv_format_name(k_format));
    if (k_format == KvFormat::Fp8)
      require_arg(v_head_dim % 64 == 0, "PagedCacheConfig.v_head_dim must be a multiple of 64 with fp8 K and v_from_k_latent ",
                  "(V takes K's first v_head_dim / 64 scale groups), got ", v_head_dim);
  }
  if (k_format == KvFormat::Dsv4Row) {
    require_arg(head_dim == math::Dsv4RowLayout::kHeadDim, "PagedCacheConfig: Dsv4Row K needs head_dim ",
                math::Dsv4RowLayout::kHeadDim, ", got ", head_dim);
    require_arg(v_head_dim == 0, "PagedCacheConfig: Dsv4Row rows are K and V at once: v_head_dim must be 0, got ", v_head_dim);
  }
  if (v_head_dim > 0 && !v_from_k_latent) {
    require_arg(v_format != KvFormat::Dsv4Row, "PagedCacheConfig.v_format: Dsv4Row is a K-only format");
    if (v_format == KvFormat::Fp8)
      require_arg(v_head_dim % 64 == 0, "PagedCacheConfig: fp8 V needs v_head_dim % 64 == 0, got ", v_head_dim);
  }
  require_arg(rope.size() == 1 || rope.size() == static_cast<size_t>(n_layers), "PagedCacheConfig.rope must hold 1 or n_layers = ",
              n_layers, " specs, got ", rope.size());
  for (size_t l = 0; l < rope.size(); ++l) {
    rope[l].validate(head_dim);
    // Rows wider than the rotation tables (MLA's 576) rotate a slice: DeepSeek-V2/V3 the 64-dim tail.
    require_arg(rope[l].n_rot <= 2 * math::RopeTable::kMaxPairs, "PagedCacheConfig.rope[", l, "].n_rot must be <= ",
                2 * math::RopeTable::kMaxPairs, " (rotate a head or tail slice of wider rows), got ", rope[l].n_rot);
    if (v_from_k_latent) {
      const math::RopeLayout lay = rope[l].layout(head_dim);
      require_arg(lay.n_rot == 0 || lay.first_dim >= v_head_dim, "PagedCacheConfig.rope[", l, "] rotates dims [",
                  lay.first_dim, ", ", lay.first_dim + lay.n_rot, "), but with v_from_k_latent dims [0, v_head_dim = ",
                  v_head_dim, ") are V and must never rotate (use a tail slice past the latent)");
    }
    if (k_format == KvFormat::Dsv4Row) {
      const math::RopeLayout lay = rope[l].layout(head_dim);
      require_arg(lay.first_dim >= math::Dsv4RowLayout::kNope, "PagedCacheConfig.rope[", l,
                  "]: a Dsv4Row cache rotates only dims [448, 512); this spec starts at dim ", lay.first_dim);
    }
  }
}

void PagedCache::Impl::check_usable() const {
  require(!corrupt, ErrorCode::Corrupt, "PagedCache: a device fault interrupted prepare(); the cache cannot be used");
}

KvPool PagedCache::Impl::pool(bool is_k, int32_t layer) const {
  KvPool p;
  const KvFormat f = is_k ? cfg.k_format : cfg.v_format;
  const int32_t hd = is_k ? cfg.head_dim : cfg.v_head_dim;
  if (!is_k && !has_v()) return p;
  p.format = f;
  p.head_dim = hd;
  const PoolMem& data = is_k ? k_data[layer] : v_data[layer];
  p.data = TensorRef(data.data, kv_format_dtype(f), dev, {cfg.num_blocks, cfg.block_size, cfg.n_kv_heads, kv_row_width(f, hd)});
  if (kv_format_has_scales(f)) {
    const PoolMem& s = is_k ? k_scales[layer] : v_scales[layer];
    p.scales = TensorRef(s.data, DType::UE8M0, dev, {cfg.num_blocks, cfg.block_size, cfg.n_kv_heads, hd / 64});
  }
  return p;
}

KvPool PagedCache::Impl::v_in_k_view(const KvPool& k) const {
  // Rows of K's pool cut to their first v_head_dim dims: K's row stride, so no byte is copied.
  const int64_t nb = cfg.num_blocks, bs = cfg.block_size, H = cfg.n_kv_heads, D = cfg.head_dim, DV = cfg.v_head_dim;
  KvPool v;
  v.format = k.format;
  v.head_dim = cfg.v_head_dim;
  v.data = TensorRef(k.data.data(), k.data.dtype(), dev, {nb, bs, H, DV}, {bs * H * D, H * D, D, 1});
  if (!k.scales.empty())
    v.scales = TensorRef(k.scales.data(), k.scales.dtype(), dev, {nb, bs, H, DV / 64},
                         {bs * H * (D / 64), H * (D / 64), D / 64, 1});
  return v;
}

TensorRef PagedCache::Impl::pending_view() const {
  void* p = mirrored() ? pending_dev.data() : const_cast<int32_t*>(meta.pending.data());
  return TensorRef(p, DType::I32, dev, {cfg.num_blocks, cfg.block_size});
}

ops::PagedCellArrays PagedCache::Impl::cell_arrays() {
  return {pos_dev.as<int32_t>(), pending_dev.as<int32_t>(), valid_dev.as<uint8_t>(), cfg.block_size};
}

void PagedCache::Impl::mirror_edit(const int32_t* blocks, int32_t n_blocks, int32_t delta, int32_t pending_delta,
                                   bool clear_pending, const int32_t* maybe_block_delta) {
  ops::PagedEditCellsParams p;
  p.cells = cell_arrays();
  p.blocks = blocks;
  p.n_blocks = n_blocks;
  p.delta = delta;
  p.pending_delta = pending_delta;
  p.clear_pending = clear_pending;
  p.maybe_block_delta = maybe_block_delta;
  ops::paged_edit_cells(p, dev, cfg.stream);
  // lists come from `scratch`, reused by the next call; also surfaces faults here
  if (dev.is_cuda()) synchronize(dev, cfg.stream);
}

void PagedCache::Impl::mirror_scatter(const int32_t* packed, int32_t n_blocks) {
  ops::PagedScatterCellsParams p;
  p.cells = cell_arrays();
  p.packed = packed;
  p.n_blocks = n_blocks;
  ops::paged_scatter_cells(p, dev, cfg.stream);
  if (dev.is_cuda()) synchronize(dev, cfg.stream);
}

void PagedCache::Impl::mirror_set_cells(const int32_t* slots, const int32_t* stored, int32_t n) {
  if (!mirrored() || n == 0) return;
  ops::PagedSetCellsParams p;
  p.cells = cell_arrays();
  p.slots = slots;
  p.stored = stored;
  p.n = n;
  ops::paged_set_cells(p, dev, cfg.stream);
}

void PagedCache::Impl::sync_cells(int32_t lo, int32_t hi) {
  if (!mirrored() || lo >= hi) return;
  const size_t c0 = static_cast<size_t>(lo) * cfg.block_size, n = static_cast<size_t>(hi - lo) * cfg.block_size;
  copy_bytes(pos_dev.as<int32_t>() + c0, dev, meta.positions.data() + c0, Device::cpu(), n * 4, cfg.stream);
  copy_bytes(valid_dev.as<uint8_t>() + c0, dev, meta.valid.data() + c0, Device::cpu(), n, cfg.stream);
  copy_bytes(pending_dev.as<int32_t>() + c0, dev, meta.pending.data() + c0, Device::cpu(), n * 4, cfg.stream);
}

int32_t* PagedCache::Impl::upload_list(const std::vector<int32_t>& v) {
  const size_t bytes = v.size() * sizeof(int32_t);
  if (scratch.size() < bytes) scratch = Buffer(std::max<size_t>(bytes, scratch.size() * 2), dev);
  copy_bytes(scratch.data(), dev, v.data(), Device::cpu(), bytes, cfg.stream);
  return scratch.as<int32_t>();
}

void PagedCache::Impl::device_shift_cells(const std::vector<int32_t>& blocks, int32_t delta, int32_t pending_delta) {
  if (!mirrored() || blocks.empty()) return;
  mirror_edit(upload_list(blocks), static_cast<int32_t>(blocks.size()), delta, pending_delta, false);
}

void PagedCache::Impl::sync_blocks(const std::vector<int32_t>& blocks) {
  if (!mirrored() || blocks.empty()) return;
  const int32_t bs = cfg.block_size;
  const size_t n = blocks.size(), cells = n * static_cast<size_t>(bs);
  std::vector<int32_t> packed(n + 3 * cells);
  std::copy(blocks.begin(), blocks.end(), packed.begin());
  for (size_t i = 0; i < n; ++i) {
    for (int32_t j = 0; j < bs; ++j) {
      const int64_t c = meta.cell(blocks[i], j);
      const size_t k = i * bs + j;
      packed[n + k] = meta.pos(c);
      packed[n + cells + k] = meta.pending[c];
      packed[n + 2 * cells + k] = meta.valid[c];
    }
  }
  mirror_scatter(upload_list(packed), static_cast<int32_t>(n));
}

void PagedCache::Impl::copy_blocks(const std::vector<int32_t>& pairs) {
  if (pairs.empty()) return;
  ops::PagedCopyBlocksParams p;
  p.n_arrays = static_cast<int32_t>(arrays.size());
  p.n_pairs = static_cast<int32_t>(pairs.size() / 2);
  if (dev.is_cpu()) {
    p.arrays = arrays.data();
    p.pairs = pairs.data();
    ops::paged_copy_blocks(p, dev, cfg.stream);
    return;
  }
  p.arrays = arrays_dev.as<PagedPoolArray>();
  p.pairs = upload_list(pairs);
  ops::paged_copy_blocks(p, dev, cfg.stream);
  synchronize(dev, cfg.stream);  // the scratch list is reused by the next call; also surfaces faults here
}

const char* pool_part_name(PoolPart part) {
  switch (part) {
    case PoolPart::KData: return "k";
    case PoolPart::KScales: return "k_scales";
    case PoolPart::VData: return "v";
    case PoolPart::VScales: return "v_scales";
  }
  return "?";
}

std::vector<PagedPoolSpec> paged_pool_specs(const PagedCacheConfig& config) {
  config.validate();
  // One block more than the pools expose: the all-zero block (Impl::zero_block()).
  const int64_t blocks = static_cast<int64_t>(config.num_blocks) + 1;
  std::vector<PagedPoolSpec> specs;
  auto add = [&](int32_t layer, PoolPart part, DType dtype, int64_t width) {
    PagedPoolSpec s;
    s.layer = layer;
    s.part = part;
    s.dtype = dtype;
    s.shape = {blocks, config.block_size, config.n_kv_heads, width};
    s.bytes = blocks * config.block_size * config.n_kv_heads * width * static_cast<int64_t>(dtype_size(dtype));
    specs.push_back(s);
  };
  for (int32_t l = 0; l < config.n_layers; ++l) {
    add(l, PoolPart::KData, kv_format_dtype(config.k_format), kv_row_width(config.k_format, config.head_dim));
    if (kv_format_has_scales(config.k_format)) add(l, PoolPart::KScales, DType::UE8M0, config.head_dim / 64);
    if (config.v_head_dim > 0 && !config.v_from_k_latent) {
      add(l, PoolPart::VData, kv_format_dtype(config.v_format), kv_row_width(config.v_format, config.v_head_dim));
      if (kv_format_has_scales(config.v_format)) add(l, PoolPart::VScales, DType::UE8M0, config.v_head_dim / 64);
    }
  }
  return specs;
}

namespace {

std::string shape_text(const std::array<int64_t, 4>& s) {
  return detail::concat("[", s[0], ", ", s[1], ", ", s[2], ", ", s[3], "]");
}

// Refuses (InvalidArgument naming pools[i]) caller pool memory that is not exactly what `specs` asks for.
void check_pools(std::span<const TensorRef> pools, const std::vector<PagedPoolSpec>& specs, Device device) {
  require_arg(pools.size() == specs.size(), "PagedCache: pools holds ", pools.size(), " arrays, the config needs ",
              specs.size(), " (paged_pool_specs: per layer k, k_scales for fp8 K, v, v_scales for fp8 V)");
  struct Range {
    uintptr_t lo, hi;
    size_t i;
  };
  std::vector<Range> ranges;
  for (size_t i = 0; i < pools.size(); ++i) {
    const TensorRef& t = pools[i];
    const PagedPoolSpec& s = specs[i];
    const std::string what = detail::concat("PagedCache: pools[", i, "] (layer ", s.layer, " ", pool_part_name(s.part), ")");
    require_arg(t.data() != nullptr, what, " has no memory");
    require_arg(t.device() == device, what, " is on ", t.device().str(), ", the cache on ", device.str());
    const bool u8_ok = t.dtype() == DType::U8 && dtype_size(s.dtype) == 1;
    require_arg(t.dtype() == s.dtype || u8_ok, what, " has dtype ", dtype_name(t.dtype()), ", needs ",
                dtype_name(s.dtype), dtype_size(s.dtype) == 1 && s.dtype != DType::U8 ? " (or u8)" : "");
    bool shape_ok = t.ndim() == 4;
    for (int d = 0; shape_ok && d < 4; ++d) shape_ok = t.size(d) == s.shape[d];
    require_arg(shape_ok, what, " has shape ", t.shape_str(), ", needs ", shape_text(s.shape),
                " (num_blocks + 1 blocks: the last is the cache's zero block)");
    require_arg(t.is_contiguous(), what, " must be contiguous");
    const uintptr_t p = reinterpret_cast<uintptr_t>(t.data());
    require_arg(p % PagedPoolSpec::kAlignment == 0, what, " at ", t.data(), " is not ", PagedPoolSpec::kAlignment,
                "-byte aligned");
    ranges.push_back({p, p + static_cast<uintptr_t>(s.bytes), i});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  for (size_t j = 1; j < ranges.size(); ++j)
    require_arg(ranges[j].lo >= ranges[j - 1].hi, "PagedCache: pools[", ranges[j - 1].i, "] and pools[", ranges[j].i,
                "] overlap (every pool array needs its own memory)");
}

}  // namespace

PagedCache::PagedCache(PagedCacheConfig config, Device device) : impl_(std::make_unique<Impl>()) {
  impl().init(std::move(config), device, nullptr);
}

PagedCache::PagedCache(PagedCacheConfig config, Device device, std::span<const TensorRef> pools)
    : impl_(std::make_unique<Impl>()) {
  impl().init(std::move(config), device, &pools);
}

void PagedCache::Impl::init(PagedCacheConfig config, Device device, const std::span<const TensorRef>* maybe_pools) {
  const std::vector<PagedPoolSpec> specs = paged_pool_specs(config);  // validates the config
  checks::device_known("PagedCache", device);
  checks::backend_available("PagedCache", device);
  if (config.kvcore_attention && config.k_format != KvFormat::Dsv4Row) {
    const DType v = config.v_head_dim > 0 && !config.v_from_k_latent ? kv_format_dtype(config.v_format)
                                                                      : kv_format_dtype(config.k_format);
    const std::string why = ops::attention_cannot_read(
        device, {kv_format_dtype(config.k_format), v, config.head_dim, config.v_head_dim});
    require_arg(why.empty(), "PagedCacheConfig (kvcore_attention = true, on ", device.str(), "): attention cannot read ",
                why, " (k_format ", kv_format_name(config.k_format), ", v_format ",
                config.v_from_k_latent ? std::string_view("k's (v_from_k_latent)") : kv_format_name(config.v_format),
                ", head_dim ", config.head_dim, ", v_head_dim ", config.v_head_dim,
                "); set kvcore_attention = false for pages an engine reads itself");
  }
  require_arg(!config.debug_mirror || device.is_cpu(), "PagedCacheConfig.debug_mirror is for CPU caches, got ", device.str());
  if (maybe_pools) check_pools(*maybe_pools, specs, device);
  Impl& m = *this;
  m.cfg = std::move(config);
  m.dev = device;
  m.lay = PagedLayout{m.cfg.block_size, m.cfg.n_kv_heads, m.cfg.head_dim};
  m.meta.init(m.cfg.block_size, m.cfg.num_blocks);
  for (int32_t l = 0; l < m.cfg.n_layers; ++l) m.rope.push_back(make_rope_table(m.cfg.rope_for(l), m.cfg.head_dim));
  m.shared_angles = m.cfg.rope_mode == RopeMode::RopeStored && m.rope[0].layout.n_pairs() > 0;
  for (const math::RopeTable& t : m.rope)
    m.shared_angles = m.shared_angles && t.layout.n_pairs() == m.rope[0].layout.n_pairs() &&
                      std::equal(t.freq, t.freq + t.layout.n_pairs(), m.rope[0].freq);
  const math::RopeLayout& l0 = m.rope[0].layout;
  m.one_rope = m.cfg.rope_mode != RopeMode::RopeStored || l0.n_rot == 0 ||
               (l0.first_dim == 0 && l0.n_rot == m.cfg.head_dim);
  for (const math::RopeTable& t : m.rope)
    m.one_rope = m.one_rope && (m.cfg.rope_mode != RopeMode::RopeStored ||
                                (t.layout.n_rot == l0.n_rot && t.layout.first_dim == l0.first_dim &&
                                 t.layout.interleaved == l0.interleaved && t.attention_factor == m.rope[0].attention_factor &&
                                 std::equal(t.freq, t.freq + t.layout.n_pairs(), m.rope[0].freq)));

  static std::atomic<uint64_t> next_cache_id{1};
  m.id = next_cache_id.fetch_add(1);
  m.ticket_key = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^ (m.id * 0x9e3779b97f4a7c15ull);
  m.owns_pools = maybe_pools == nullptr;
  for (size_t i = 0; i < specs.size(); ++i) {
    const PagedPoolSpec& s = specs[i];
    PoolMem mem;
    if (maybe_pools) {
      mem.data = static_cast<uint8_t*>((*maybe_pools)[i].data());
    } else {
      mem.owned = Buffer(static_cast<size_t>(s.bytes), device);
      mem.data = mem.owned.as<uint8_t>();
    }
    fill_bytes(mem.data, device, 0, static_cast<size_t>(s.bytes), m.cfg.stream);
    std::vector<PoolMem>& v = s.part == PoolPart::KData    ? m.k_data
                              : s.part == PoolPart::KScales ? m.k_scales
                              : s.part == PoolPart::VData   ? m.v_data
                                                            : m.v_scales;
    v.push_back(std::move(mem));
    const int64_t block_bytes = s.bytes / s.shape[0];
    m.arrays.push_back({v.back().data, block_bytes});
    m.bytes_per_block += block_bytes;
  }
  if (m.mirrored()) {
    m.pos_dev = Buffer(static_cast<size_t>(m.num_cells()) * 4, device);
    m.valid_dev = Buffer(static_cast<size_t>(m.num_cells()), device);
    m.pending_dev = Buffer(static_cast<size_t>(m.num_cells()) * 4, device);
    m.sync_cells(0, m.cfg.num_blocks);
  }
  if (device.is_cuda()) m.arrays_dev = Buffer::from_host(m.arrays, device);
  for (int32_t l = 0; l < m.cfg.n_layers; ++l) {
    m.k_pools.push_back(m.pool(true, l));
    if (m.has_v()) m.v_pools.push_back(m.pool(false, l));
  }
  // Caller memory is zeroed on the caller's stream: finish before the caller sees the cache.
  if (maybe_pools && device.is_cuda()) synchronize(device, m.cfg.stream);
}

PagedCache::Impl& PagedCache::impl() {
  require_arg(impl_ != nullptr, "PagedCache: this cache was moved from; it holds nothing and accepts no calls");
  return *impl_;
}

const PagedCache::Impl& PagedCache::impl() const {
  require_arg(impl_ != nullptr, "PagedCache: this cache was moved from; it holds nothing and accepts no calls");
  return *impl_;
}

PagedCache::~PagedCache() = default;
PagedCache::PagedCache(PagedCache&&) noexcept = default;
PagedCache& PagedCache::operator=(PagedCache&&) noexcept = default;

const PagedCacheConfig& PagedCache::config() const { return impl().cfg; }
Device PagedCache::device() const { return impl().dev; }
bool PagedCache::owns_pools() const { return impl().owns_pools; }
void PagedCache::set_stream(Stream stream) { impl().cfg.stream = stream; }
PagedLayout PagedCache::layout() const { return impl().lay; }

TensorRef PagedCache::positions() const {
  const Impl& m = impl();
  void* p = m.mirrored() ? m.pos_dev.data() : const_cast<int32_t*>(m.meta.positions.data());
  return TensorRef(p, DType::I32, m.dev, {m.cfg.num_blocks, m.cfg.block_size});
}

TensorRef PagedCache::valid() const {
  const Impl& m = impl();
  void* p = m.mirrored() ? m.valid_dev.data() : const_cast<uint8_t*>(m.meta.valid.data());
  return TensorRef(p, DType::U8, m.dev, {m.cfg.num_blocks, m.cfg.block_size});
}

KvPool PagedCache::k_pool(int32_t layer) const {
  require_arg(layer >= 0 && layer < impl().cfg.n_layers, "PagedCache::k_pool: layer ", layer, " outside [0, ",
              impl().cfg.n_layers, ")");
  return impl().pool(true, layer);
}

KvPool PagedCache::v_pool(int32_t layer) const {
  require_arg(layer >= 0 && layer < impl().cfg.n_layers, "PagedCache::v_pool: layer ", layer, " outside [0, ",
              impl().cfg.n_layers, ")");
  return impl().pool(false, layer);
}

const math::RopeTable& PagedCache::rope_table(int32_t layer) const {
  require_arg(layer >= 0 && layer < impl().cfg.n_layers, "PagedCache::rope_table: layer ", layer, " outside [0, ",
              impl().cfg.n_layers, ")");
  return impl().rope[layer];
}

bool PagedCache::contains(SeqId seq) const { return impl().meta.seqs.count(seq) != 0; }

std::vector<SeqId> PagedCache::sequences() const {
  std::vector<SeqId> ids;
  for (const auto& [id, s] : impl().meta.seqs) ids.push_back(id);
  return ids;
}

SeqInfo PagedCache::info(SeqId seq) const {
  const PagedMeta& mt = impl().meta;
  const PagedSeq& s = mt.seq(seq);
  SeqInfo i;
  i.n_live = s.n_live;
  i.n_cells = s.n_cells;
  i.n_blocks = static_cast<int32_t>(s.blocks.size());
  if (s.n_cells > 0) {
    const int32_t c = s.n_cells - 1;
    i.last_position = mt.pos(mt.cell(s.blocks[c / mt.block_size], c % mt.block_size)) - s.pos_offset;
  }
  return i;
}

PagedStats PagedCache::stats() const {
  const Impl& m = impl();
  PagedStats st;
  st.sequences = static_cast<int32_t>(m.meta.seqs.size());
  st.blocks_total = m.cfg.num_blocks;
  st.blocks_free = static_cast<int32_t>(m.meta.free_list.size());
  st.blocks_used = st.blocks_total - st.blocks_free;
  for (int32_t rc : m.meta.refcount) st.blocks_shared += rc > 1 ? 1 : 0;
  st.bytes_per_block = m.bytes_per_block;
  st.bytes_total = m.bytes_per_block * m.cfg.num_blocks;
  st.bytes_used = m.bytes_per_block * st.blocks_used;
  for (const auto& [id, s] : m.meta.seqs) {
    st.tokens_live += s.n_live;
    st.tokens_dead += s.n_cells - s.n_live;
  }
  for (int32_t b = 0; b < m.cfg.num_blocks; ++b)
    if (m.meta.pending_flag[b] && m.meta.refcount[b] > 0)
      for (int32_t j = 0; j < m.cfg.block_size; ++j) st.cells_pending += m.meta.pending[m.meta.cell(b, j)] != 0 ? 1 : 0;
  return st;
}

std::string PagedCache::debug_state() const {
  const PagedMeta& mt = impl().meta;
  std::ostringstream os;
  os << "next_id " << mt.next_id << "\n";
  for (const auto& [id, s] : mt.seqs) {
    os << "seq " << id << " cells " << s.n_cells << " live " << s.n_live << " offset " << s.pos_offset << " blocks";
    for (int32_t b : s.blocks) os << ' ' << b;
    os << "\n";
  }
  os << "free";
  for (int32_t b : mt.free_list) os << ' ' << b;
  os << "\n";
  for (int32_t b = 0; b < mt.num_blocks; ++b) {
    os << "block " << b << " rc " << mt.refcount[b] << " live " << mt.block_live[b] << " pf " << int(mt.pending_flag[b])
       << " |";
    for (int32_t j = 0; j < mt.block_size; ++j) {
      const int64_t c = mt.cell(b, j);
      os << ' ' << mt.pos(c) << ':' << int(mt.valid[c]) << ':' << mt.pending[c];
    }
    os << "\n";
  }
  return os.str();
}

PagedReadBack PagedCache::read(SeqId seq, int32_t layer) {
  Impl& m = impl();
  m.check_usable();
  require_arg(layer >= 0 && layer < m.cfg.n_layers, "PagedCache::read: layer ", layer, " outside [0, ", m.cfg.n_layers, ")");
  m.meta.seq(seq);
  m.rotate_pending();  // positions: stored - the sequence's offset, no fold needed
  const PagedSeq& s = m.meta.seq(seq);
  const int32_t H = m.cfg.n_kv_heads, D = m.cfg.head_dim, DV = m.cfg.v_head_dim;
  PagedReadBack out;
  out.positions.reserve(s.n_live);
  out.k.reserve(static_cast<size_t>(s.n_live) * H * D);
  const bool v_in_k = m.cfg.v_from_k_latent;  // V: the first DV dims of the K row just decoded
  if (m.has_v() || v_in_k) out.v.reserve(static_cast<size_t>(s.n_live) * H * DV);

  // Bring one block of a pool array to the host (a view on the CPU).
  auto block_bytes = [&](const Impl::PoolMem& buf, int64_t block_bytes, int32_t b, std::vector<uint8_t>& tmp) -> const uint8_t* {
    const uint8_t* src = buf.data + b * block_bytes;
    if (m.dev.is_cpu()) return src;
    tmp.resize(static_cast<size_t>(block_bytes));
    copy_bytes(tmp.data(), Device::cpu(), src, m.dev, tmp.size(), m.cfg.stream);
    return tmp.data();
  };
  const KvFormat kf = m.cfg.k_format, vf = m.cfg.v_format;
  const int64_t k_row = kv_row_width(kf, D) * static_cast<int64_t>(dtype_size(kv_format_dtype(kf)));
  const int64_t v_row = m.has_v() ? kv_row_width(vf, DV) * static_cast<int64_t>(dtype_size(kv_format_dtype(vf))) : 0;
  const int32_t kg = kvrow::n_fp8_groups(kf, D), vg = m.has_v() ? kvrow::n_fp8_groups(vf, DV) : 0;
  std::vector<uint8_t> tk, tks, tv, tvs;
  std::vector<float> row(static_cast<size_t>(std::max(D, DV)));
  const int64_t rows_per_block = static_cast<int64_t>(m.cfg.block_size) * H;
  for (size_t bi = 0; bi < s.blocks.size(); ++bi) {
    const int32_t b = s.blocks[bi];
    const uint8_t* kd = block_bytes(m.k_data[layer], rows_per_block * k_row, b, tk);
    const uint8_t* ks = kg && kf == KvFormat::Fp8 ? block_bytes(m.k_scales[layer], rows_per_block * kg, b, tks) : nullptr;
    const uint8_t* vd = m.has_v() ? block_bytes(m.v_data[layer], rows_per_block * v_row, b, tv) : nullptr;
    const uint8_t* vs = vg && vf == KvFormat::Fp8 ? block_bytes(m.v_scales[layer], rows_per_block * vg, b, tvs) : nullptr;
    const int32_t used = m.meta.cells_in_block(s, bi);
    for (int32_t j = 0; j < used; ++j) {
      const int64_t c = m.meta.cell(b, j);
      if (!m.meta.valid[c]) continue;
      const int32_t pos = m.meta.pos(c) - s.pos_offset;
      out.positions.push_back(pos);
      for (int32_t h = 0; h < H; ++h) {
        const int64_t r = static_cast<int64_t>(j) * H + h;
        for (int32_t d = 0; d < D; ++d) row[d] = kvrow::decode(kf, kd + r * k_row, ks ? ks + r * kg : nullptr, d);
        if (m.cfg.rope_mode == RopeMode::RopeOnRead)
          math::rope_rotate_row(row.data(), m.rope[layer], static_cast<float>(pos), m.rope[layer].attention_factor);
        out.k.insert(out.k.end(), row.begin(), row.begin() + D);
        // (RoPE never rotates dims below DV in this layout: the rotated row's prefix is V as stored.)
        if (v_in_k) out.v.insert(out.v.end(), row.begin(), row.begin() + DV);
        if (!vd) continue;
        for (int32_t d = 0; d < DV; ++d) row[d] = kvrow::decode(vf, vd + r * v_row, vs ? vs + r * vg : nullptr, d);
        out.v.insert(out.v.end(), row.begin(), row.begin() + DV);
      }
    }
  }
  return out;
}

BlockTable PagedCache::block_tables(std::span<const SeqId> seqs, PagedPositions positions) {
  return block_tables(seqs, impl().csr, positions);
}

BlockTable PagedCache::block_tables(std::span<const SeqId> seqs, Buffer& storage, PagedPositions positions) {
  Impl& m = impl();
  m.check_usable();
  require_arg(positions == PagedPositions::Materialized || positions == PagedPositions::Offsets,
              "PagedCache::block_tables: positions must be Materialized or Offsets, got ", static_cast<int>(positions));
  require_arg(storage.empty() || storage.device() == m.dev, "PagedCache::block_tables: storage is on ",
              storage.device().str(), " but the cache is on ", m.dev.str());
  for (SeqId id : seqs) m.meta.seq(id);  // validate every id first
  const bool offsets = positions == PagedPositions::Offsets;
  if (offsets) m.rotate_pending();
  else prepare();
  return m.tables(seqs, offsets, storage);
}

PagedKV PagedCache::paged_kv(int32_t layer) const {
  const Impl& m = impl();
  m.check_usable();
  require_arg(layer >= 0 && layer < m.cfg.n_layers, "PagedCache::paged_kv: layer must be in [0, ", m.cfg.n_layers,
              "), got ", layer);
  const KvPool k = m.pool(true, layer), v = m.cfg.v_from_k_latent ? m.v_in_k_view(k) : m.pool(false, layer);
  PagedKV kv;
  kv.k = k.data;
  kv.v = v.data;
  kv.k_scale = k.scales;
  kv.v_scale = v.scales;
  kv.positions = positions();
  kv.valid = valid();
  kv.rope_mode = m.cfg.rope_mode;
  kv.maybe_rope = &m.rope[layer];
  return kv;
}

BlockTable PagedCache::Impl::tables(std::span<const SeqId> seqs, bool with_offsets, Buffer& storage) {
  const size_t batch = seqs.size();
  // indptr [batch + 1], last_page_len [batch], pos_offset [batch]; indices appended after.
  std::vector<int32_t> host(batch + 1 + 2 * batch);
  std::vector<int32_t> indices;
  host[0] = 0;
  for (size_t i = 0; i < batch; ++i) {
    const PagedSeq& s = meta.seq(seqs[i]);
    indices.insert(indices.end(), s.blocks.begin(), s.blocks.end());
    host[i + 1] = static_cast<int32_t>(indices.size());
    host[batch + 1 + i] = s.blocks.empty() ? 0 : meta.cells_in_block(s, s.blocks.size() - 1);
    host[2 * batch + 1 + i] = with_offsets ? s.pos_offset : 0;
  }
  host.insert(host.end(), indices.begin(), indices.end());
  const size_t bytes = host.size() * 4;
  if (storage.size() < bytes) storage = Buffer(std::max<size_t>(bytes, 4096), dev);
  copy_bytes(storage.data(), dev, host.data(), Device::cpu(), bytes, cfg.stream);
  int32_t* base = storage.as<int32_t>();
  BlockTable out;
  out.indptr = TensorRef(base, DType::I32, dev, {static_cast<int64_t>(batch + 1)});
  out.last_page_len = TensorRef(base + batch + 1, DType::I32, dev, {static_cast<int64_t>(batch)});
  out.pos_offset = TensorRef(base + 2 * batch + 1, DType::I32, dev, {static_cast<int64_t>(batch)});
  out.indices = TensorRef(base + 3 * batch + 1, DType::I32, dev, {static_cast<int64_t>(indices.size())});
  return out;
}

AppendTicket::AppendTicket(AppendTicket&& other) noexcept { *this = std::move(other); }

AppendTicket& AppendTicket::operator=(AppendTicket&& other) noexcept {
  if (this == &other) return *this;
  owner_ = std::exchange(other.owner_, 0);
  stamp_ = std::exchange(other.stamp_, 0);
  seqs_ = std::move(other.seqs_);
  versions_ = std::move(other.versions_);
  counts_ = std::move(other.counts_);
  n_tokens_ = std::exchange(other.n_tokens_, 0);
  slots_ = std::move(other.slots_);
  positions_ = std::move(other.positions_);
  return *this;
}

TensorRef AppendTicket::slot_mapping() const {
  return TensorRef(slots_.data(), DType::I32, slots_.empty() ? Device::cpu() : slots_.device(), {n_tokens_});
}

TensorRef AppendTicket::position_view() const {
  return TensorRef(positions_.data(), DType::I32, positions_.empty() ? Device::cpu() : positions_.device(), {n_tokens_});
}

}  // namespace kvcore
