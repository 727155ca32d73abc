// Entry points of the shift family: validate every argument (nothing is
// touched before all layers pass), build the plain Params, dispatch.
#include "kvcore/ops/shift.hpp"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/math/shift_rotate.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "ops/checks.hpp"
#include "ops/shift_params.hpp"
#include "ops/tuning.hpp"

namespace kvcore {
namespace {

using ops::ShiftKind;
using ops::ShiftTensorParams;

constexpr int64_t kMaxDelta = int64_t{1} << 24;  // shift_sincos needs |delta| < 2^24
static_assert(ops::kShiftMaxFp8HeadDim == kMaxKvHeadDim, "FP8 keys of every pool head width shift");
// A RopeSpec rotates n_rot <= 2 * kMaxPairs dims at the head or the tail of a head whose width is a
// multiple of 64: ceil(n_rot / 64) blocks, which the kernels' FP8 scratch holds.
static_assert(2 * math::RopeTable::kMaxPairs <= ops::kShiftFp8ScratchDims, "an FP8 head's rotated blocks fit the scratch");

// Rows must be [n_heads, head_dim] contiguous inside a token; tokens may be any
// (non-overlapping) stride apart.
void check_row_strides(const std::string& name, const TensorRef& t, int64_t n_heads, int64_t row_elems) {
  const std::string_view op = "shift";
  checks::not_null(op, name, t);
  checks::non_negative_strides(op, name, t);
  checks::innermost_contiguous(op, name, t);
  // Messages are built only on failure: a call validates every layer, and describe() strings
  // for 32-64 tensors would cost more host time than a small shift takes on the GPU.
  if (t.ndim() == 3 && !(t.size(1) <= 1 || t.stride(1) == row_elems / n_heads))
    require_arg(false, "shift: ", name, ".stride[1] must be ", row_elems / n_heads, " (heads packed in a token), got ",
                t.stride(1), " for ", described(t));
  if (!(t.size(0) <= 1 || t.stride(0) >= row_elems))
    require_arg(false, "shift: ", name, ".stride[0] = ", t.stride(0), " is smaller than one token's ", row_elems,
                " elements: rows would overlap in ", described(t));
}

struct KInfo {
  ShiftTensorParams params;
  int64_t capacity = 0;
  int64_t n_heads = 0;
  int head_dim = 0;
  math::RopeTable table{};
  bool table_reused = false;  // taken from a TableCache: same spec and head_dim as the layer before
};

// Every field of RopeSpec that a table depends on. A call usually gives every
// layer the same spec: its table and cos/sin are then computed once (each costs
// microseconds of host time per layer, which a small GPU shift would wait for).
bool same_rotation(const RopeSpec& a, const RopeSpec& b) {
  static_assert(sizeof(RopeSpec) == 112, "RopeSpec changed: compare the new fields in same_rotation()");
  return a.n_rot == b.n_rot && a.slice == b.slice && a.pairing == b.pairing && a.theta == b.theta &&
         a.scaling == b.scaling && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor && a.original_max_position == b.original_max_position &&
         a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.yarn_truncate == b.yarn_truncate &&
         a.freq_factors == b.freq_factors && a.attention_factor == b.attention_factor;
}

// The last table made, for the next layer to reuse.
struct TableCache {
  bool valid = false;
  RopeSpec spec;
  int head_dim = 0;
  math::RopeTable table{};
};

// Validates K (and its FP8 scales) against the RopeSpec; returns its byte description.
KInfo describe_k(const std::string& name, const TensorRef& k, const TensorRef& scales, const RopeSpec& rope,
                 TableCache* maybe_cache = nullptr) {
  KInfo info;
  require_arg(!k.empty(), "shift: ", name, ".k is empty");
  ShiftTensorParams& p = info.params;
  const DType dt = k.dtype();
  if (dt == DType::F32 || dt == DType::F16 || dt == DType::BF16 || dt == DType::E4M3) {
    if (k.ndim() != 3) checks::ndim_is("shift", name + ".k", k, 3);
    info.head_dim = static_cast<int>(k.size(2));
    p.kind = dt == DType::F32 ? ShiftKind::F32 : dt == DType::F16 ? ShiftKind::F16 : dt == DType::BF16 ? ShiftKind::BF16 : ShiftKind::Fp8;
  } else if (dt == DType::U8) {
    if (!(k.ndim() == 2 || k.ndim() == 3))
      require_arg(false, "shift: ", name, ".k (DeepSeek-V4 rows) must be u8 [capacity, 584] or [capacity, n_kv_heads, 584], got ", described(k));
    if (k.size(k.ndim() - 1) != math::Dsv4RowLayout::kBytes)
      require_arg(false, "shift: ", name, ".k (DeepSeek-V4 rows) must have ", math::Dsv4RowLayout::kBytes,
                  " bytes per row, got ", described(k));
    info.head_dim = math::Dsv4RowLayout::kHeadDim;
    p.kind = ShiftKind::Dsv4;
  } else {
    throw Error(ErrorCode::InvalidArgument, detail::concat("shift: ", name, ".k must be f32, f16, bf16, u8 (DeepSeek-V4 rows) or e4m3, got ", dtype_name(dt)));
  }
  info.capacity = k.size(0);
  info.n_heads = k.ndim() == 3 ? k.size(1) : 1;
  const int64_t head_elems = p.kind == ShiftKind::Dsv4 ? math::Dsv4RowLayout::kBytes : info.head_dim;
  check_row_strides(name + ".k", k, info.n_heads, info.n_heads * head_elems);
  if (!(info.n_heads > 0 && info.head_dim > 0)) require_arg(false, "shift: ", name, ".k has no heads or no dims: ", described(k));
  try {
    if (maybe_cache && maybe_cache->valid && maybe_cache->head_dim == info.head_dim && same_rotation(maybe_cache->spec, rope)) {
      info.table = maybe_cache->table;
      info.table_reused = true;
    } else {
      info.table = make_rope_table(rope, info.head_dim);
      if (maybe_cache) *maybe_cache = {true, rope, info.head_dim, info.table};
    }
  } catch (const Error& e) {
    throw Error(ErrorCode::InvalidArgument, detail::concat("shift: ", name, ".rope does not fit head_dim ", info.head_dim, ": ", e.what()));
  }
  const math::RopeLayout& l = info.table.layout;
  if (p.kind == ShiftKind::Dsv4 && l.first_dim < math::Dsv4RowLayout::kNope)
    require_arg(false, "shift: ", name, ".rope rotates dims [", l.first_dim, ", ", l.first_dim + l.n_rot,
                ") but a DeepSeek-V4 row keeps only dims [448, 512) in bf16 (", described(rope), ")");
  p.base = static_cast<uint8_t*>(k.data());
  p.token_stride = k.stride(0) * static_cast<int64_t>(k.element_size());
  if (p.kind == ShiftKind::Dsv4)  // the bf16 tail is read as 16-bit values
    require_arg(reinterpret_cast<uintptr_t>(p.base) % 2 == 0 && p.token_stride % 2 == 0, "shift: ", name,
                ".k (DeepSeek-V4 rows) must start at an even address with an even row stride, got stride ", p.token_stride);
  p.n_heads = static_cast<int32_t>(info.n_heads);
  p.head_bytes = static_cast<int32_t>(head_elems * static_cast<int64_t>(k.element_size()));
  if (p.kind == ShiftKind::Fp8) {
    require_arg(info.head_dim % math::kFp8Block == 0 && info.head_dim <= ops::kShiftMaxFp8HeadDim, "shift: ", name,
                ".k (e4m3) head_dim must be a multiple of 64 and <= ", ops::kShiftMaxFp8HeadDim, ", got ", info.head_dim);
    require_arg(!scales.empty(), "shift: ", name, ".k is e4m3 but maybe_k_scales is missing");
    checks::dtype_is("shift", name + ".maybe_k_scales", scales, DType::UE8M0);
    if (scales.ndim() != 3) checks::ndim_is("shift", name + ".maybe_k_scales", scales, 3);
    const int64_t nb = info.head_dim / math::kFp8Block;
    if (!(scales.size(0) == info.capacity && scales.size(1) == info.n_heads && scales.size(2) == nb))
      require_arg(false, "shift: ", name, ".maybe_k_scales must be [", info.capacity, ", ", info.n_heads, ", ", nb, "] for ",
                  described(k), ", got ", described(scales));
    check_row_strides(name + ".maybe_k_scales", scales, info.n_heads, info.n_heads * nb);
    if (scales.device() != k.device()) checks::same_device("shift", name + ".k", k, name + ".maybe_k_scales", scales);
    p.maybe_scales = static_cast<uint8_t*>(scales.data());
    p.scale_token_stride = scales.stride(0);
    p.scale_head_bytes = static_cast<int32_t>(nb);
  } else {
    require_arg(scales.empty(), "shift: ", name, ".maybe_k_scales is given but ", name, ".k is ", dtype_name(dt), ", not e4m3");
  }
  require_arg(p.head_bytes + p.scale_head_bytes <= ops::kShiftMaxHeadBytes, "shift: ", name, ".k heads of ", p.head_bytes,
              " bytes exceed ", ops::kShiftMaxHeadBytes);
  return info;
}

ShiftTensorParams describe_v(const std::string& name, const TensorRef& v, const KInfo& k) {
  ShiftTensorParams p;
  const DType dt = v.dtype();
  require_arg(dt == DType::F32 || dt == DType::F16 || dt == DType::BF16, "shift: ", name, ".maybe_v must be f32, f16 or bf16, got ", dtype_name(dt));
  if (v.ndim() != 3) checks::ndim_is("shift", name + ".maybe_v", v, 3);
  require_arg(v.size(0) == k.capacity, "shift: ", name, ".maybe_v capacity ", v.size(0), " differs from ", name, ".k capacity ", k.capacity);
  require_arg(v.size(1) == k.n_heads, "shift: ", name, ".maybe_v has ", v.size(1), " kv heads but ", name, ".k has ", k.n_heads);
  require_arg(v.size(2) > 0, "shift: ", name, ".maybe_v has head_dim 0");
  check_row_strides(name + ".maybe_v", v, v.size(1), v.size(1) * v.size(2));
  p.kind = ShiftKind::Copy;
  p.base = static_cast<uint8_t*>(v.data());
  p.token_stride = v.stride(0) * static_cast<int64_t>(v.element_size());
  p.n_heads = static_cast<int32_t>(v.size(1));
  p.head_bytes = static_cast<int32_t>(v.size(2) * static_cast<int64_t>(v.element_size()));
  require_arg(p.head_bytes <= ops::kShiftMaxHeadBytes, "shift: ", name, ".maybe_v heads of ", p.head_bytes, " bytes exceed ", ops::kShiftMaxHeadBytes);
  return p;
}

// cos and sin of delta * w_i for every pair of a table (shared by both backends).
void append_sincos(const math::RopeTable& t, int32_t delta, std::vector<float>& c, std::vector<float>& s) {
  for (int32_t i = 0; i < t.layout.n_pairs(); ++i) {
    float si, co;
    math::shift_sincos(delta, t.freq[i], &si, &co);
    c.push_back(co);
    s.push_back(si);
  }
}

}  // namespace

void shift_dense(std::span<const ShiftDenseLayer> layers, int64_t length, int64_t n_keep, int64_t n_discard, Stream stream) {
  ops::shift_dense(layers, length, n_keep, n_discard, ops::ShiftKernel::Auto, stream);
}

void ops::shift_dense(std::span<const ShiftDenseLayer> layers, int64_t length, int64_t n_keep, int64_t n_discard,
                      ShiftKernel kernel, Stream stream) {
  require_arg(kernel >= ShiftKernel::Auto && kernel <= ShiftKernel::Sweep, "shift_dense: kernel must be a ShiftKernel, got ",
              static_cast<int32_t>(kernel));
  require_arg(!layers.empty(), "shift_dense: no layers given");
  require_arg(length >= 0, "shift_dense: length must be >= 0, got ", length);
  require_arg(n_keep >= 0, "shift_dense: n_keep must be >= 0, got ", n_keep);
  require_arg(n_discard >= 0, "shift_dense: n_discard must be >= 0, got ", n_discard);
  require_arg(n_discard < kMaxDelta, "shift_dense: n_discard must be < 2^24, got ", n_discard);
  if (n_keep > length - n_discard) {  // both >= 0, so their sum may overflow: computed checked
    int64_t sum = 0;
    const bool overflow = __builtin_add_overflow(n_keep, n_discard, &sum);
    require_arg(false, "shift_dense: n_keep + n_discard = ", n_keep, " + ", n_discard, " = ",
                overflow ? std::string("more than int64 holds") : std::to_string(sum), " exceeds the stored length ", length);
  }
  require_arg(layers.size() < (size_t{1} << 20), "shift_dense: too many layers: ", layers.size());

  const Device dev = layers[0].k.device();
  std::vector<ShiftTensorParams> tensors;
  std::vector<math::RopeLayout> layouts;
  std::vector<int32_t> pair_offset;
  std::vector<float> cos_t, sin_t;
  std::vector<const void*> seen;
  TableCache cache;
  for (size_t i = 0; i < layers.size(); ++i) {
    const ShiftDenseLayer& L = layers[i];
    const std::string name = "layers[" + std::to_string(i) + "]";
    if (L.k.device() != dev) checks::same_device("shift_dense", "layers[0].k", layers[0].k, name + ".k", L.k);
    KInfo k = describe_k(name, L.k, L.maybe_k_scales, L.rope, &cache);
    require_arg(length <= k.capacity, "shift_dense: length ", length, " exceeds ", name, ".k capacity ", k.capacity);
    k.params.layer = static_cast<int32_t>(i);
    tensors.push_back(k.params);
    seen.push_back(L.k.data());
    if (k.params.maybe_scales) seen.push_back(k.params.maybe_scales);
    if (!L.maybe_v.empty()) {
      if (L.maybe_v.device() != L.k.device()) checks::same_device("shift_dense", name + ".k", L.k, name + ".maybe_v", L.maybe_v);
      ShiftTensorParams v = describe_v(name, L.maybe_v, k);
      v.layer = static_cast<int32_t>(i);
      tensors.push_back(v);
      seen.push_back(L.maybe_v.data());
    }
    layouts.push_back(k.table.layout);
    if (k.table_reused && !pair_offset.empty()) {
      pair_offset.push_back(pair_offset.back());  // same frequencies as the previous layer: share its cos/sin
    } else {
      pair_offset.push_back(static_cast<int32_t>(cos_t.size()));
      append_sincos(k.table, static_cast<int32_t>(-n_discard), cos_t, sin_t);
    }
  }
  // Sorted, a shared pointer sits next to its twin (the pairwise check cost ~3 us of host
  // time for 64 tensors, which a 4k-token GPU shift waits for).
  std::sort(seen.begin(), seen.end(), std::less<>());
  for (size_t a = 0; a + 1 < seen.size(); ++a)
    require_arg(seen[a] != seen[a + 1] || seen[a] == nullptr, "shift_dense: two tensors share the data pointer ", seen[a],
                ": each layer's K, scales and V must be distinct memory");
  checks::backend_available("shift_dense", dev);

  const int64_t n_moved = length - n_keep - n_discard;
  if (n_discard == 0 || n_moved == 0) return;  // nothing moves

  ops::ShiftDenseParams p;
  p.tensors = tensors.data();
  p.n_tensors = static_cast<int32_t>(tensors.size());
  p.layouts = layouts.data();
  p.pair_offset = pair_offset.data();
  p.cos_t = cos_t.data();
  p.sin_t = sin_t.data();
  p.n_layers = static_cast<int32_t>(layers.size());
  p.n_keep = n_keep;
  p.n_discard = n_discard;
  p.n_moved = n_moved;
  p.device_index = dev.index;
  p.kernel = kernel;
  if (dev.is_cpu()) {
    kvcore::cpu::shift_dense(p);
  } else {
#if KVCORE_WITH_CUDA
    kvcore::ops::cuda::shift_dense(p, stream);
#endif
  }
  (void)stream;
}

void rope_shift_rows(const TensorRef& k, const TensorRef& maybe_k_scales, const RopeSpec& rope, const TensorRef& delta, Stream stream) {
  KInfo info = describe_k("k", k, maybe_k_scales, rope);
  require_arg(!delta.empty(), "rope_shift_rows: delta is empty");
  checks::dtype_is("rope_shift_rows", "delta", delta, DType::I32);
  checks::ndim_is("rope_shift_rows", "delta", delta, 1);
  checks::size_is("rope_shift_rows", "delta", delta, 0, info.capacity);
  require_arg(delta.size(0) <= 1 || delta.stride(0) == 1, "rope_shift_rows: delta must be contiguous, got stride ", delta.stride(0));
  checks::not_null("rope_shift_rows", "delta", delta);
  checks::same_device("rope_shift_rows", "k", k, "delta", delta);
  checks::backend_available("rope_shift_rows", k.device());
  if (k.device().is_cpu()) {
    const int32_t* d = delta.data_as<const int32_t>();
    for (int64_t r = 0; r < info.capacity; ++r)
      require_arg(d[r] > -kMaxDelta && d[r] < kMaxDelta, "rope_shift_rows: delta[", r, "] = ", d[r], " is out of (-2^24, 2^24)");
  }
  if (info.capacity == 0) return;
  ops::RopeShiftRowsParams p;
  p.k = info.params;
  p.rows = info.capacity;
  p.delta = delta.data_as<const int32_t>();
  p.table = info.table;
  p.device_index = k.device().index;
  if (k.device().is_cpu()) {
    cpu::rope_shift_rows(p);
  } else {
#if KVCORE_WITH_CUDA
    ops::cuda::rope_shift_rows(p, stream);
#endif
  }
  (void)stream;
}

}  // namespace kvcore
