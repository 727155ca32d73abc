#include "ops/attention_common.hpp"

#include <omp.h>

#include "kvcore/runtime.hpp"
#include "ops/checks.hpp"

namespace kvcore::ops::attn {

std::vector<int32_t> host_i32(const TensorRef& t, Stream stream) {
  std::vector<int32_t> h(static_cast<size_t>(t.numel()));
  if (!h.empty()) copy_bytes(h.data(), Device::cpu(), t.data(), t.device(), h.size() * sizeof(int32_t), stream);
  return h;
}

QElem q_elem_of(DType t) {
  return t == DType::F32 ? QElem::F32 : t == DType::F16 ? QElem::F16 : QElem::BF16;
}

int cpu_threads() { return omp_get_max_threads(); }

void check_float_tensor(const char* op, const char* name, const TensorRef& t, int ndim) {
  checks::not_null(op, name, t);
  checks::ndim_is(op, name, t, ndim);
  require_arg(t.dtype() == DType::F32 || t.dtype() == DType::F16 || t.dtype() == DType::BF16, op, ": ", name,
              " must be f32, f16 or bf16, got ", dtype_name(t.dtype()));
  checks::innermost_contiguous(op, name, t);
  checks::non_negative_strides(op, name, t);
}

namespace {

// Rows of v_head_dim elements spaced s >= v_head_dim apart, packed as [blocks][slots][heads]: V read
// in place from a wider pool (MLA's latent, the first v_head_dim dims of each K row).
bool rows_with_stride(const TensorRef& t) {
  const int64_t s = t.stride(2);
  return t.stride(3) == 1 && s >= t.size(3) && t.stride(1) == t.size(2) * s && t.stride(0) == t.size(1) * t.stride(1);
}

void check_cell_array(const char* op, const char* name, const TensorRef& t, DType want, const TensorRef& pool,
                      Device dev) {
  checks::not_null(op, name, t);
  checks::ndim_is(op, name, t, 2);
  checks::dtype_is(op, name, t, want);
  checks::size_is(op, name, t, 0, pool.size(0));
  checks::size_is(op, name, t, 1, pool.size(1));
  require_arg(t.device() == dev, op, ": ", name, " is on ", t.device().str(), ", q on ", dev.str());
  require_arg(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

}  // namespace

void check_pools(const char* op, const PagedKV& kv, Device dev, int64_t head_dim, int64_t n_q_heads,
                 PagedAttentionParams& p) {
  for (const char* name : {"pages.k", "pages.v"}) {
    const TensorRef& t = name[6] == 'k' ? kv.k : kv.v;
    checks::not_null(op, name, t);
    checks::ndim_is(op, name, t, 4);
    require_arg(t.device() == dev, op, ": ", name, " is on ", t.device().str(), ", q on ", dev.str());
    if (name[6] == 'k' || t.is_contiguous()) {
      require_arg(t.is_contiguous(), op, ": ", name, " must be contiguous [num_blocks, block_size, n_kv_heads, head_dim]");
    } else {
      require_arg(rows_with_stride(t), op, ": ", name, " must be contiguous [num_blocks, block_size, n_kv_heads, v_head_dim] ",
                  "or rows of a wider pool (strides [block_size * n_kv_heads * s, n_kv_heads * s, s, 1], s >= v_head_dim, ",
                  "e.g. K's latent), got ", described(t), " with strides [", t.stride(0), ", ", t.stride(1), ", ", t.stride(2),
                  ", ", t.stride(3), "]");
    }
    require_arg(t.dtype() == DType::F32 || t.dtype() == DType::F16 || t.dtype() == DType::BF16 ||
                    t.dtype() == DType::E4M3,
                op, ": ", name, " must be f32, f16, bf16 or e4m3, got ", dtype_name(t.dtype()));
  }
  for (int d = 0; d < 3; ++d)
    require_arg(kv.k.size(d) == kv.v.size(d), op, ": pages.k ", shape_of(kv.k), " and pages.v ", shape_of(kv.v),
                " must have the same blocks, block size and kv heads");
  const int64_t v_head_dim = kv.v.size(3);
  const int64_t num_blocks = kv.k.size(0), block_size = kv.k.size(1), n_kv = kv.k.size(2);
  require_arg(kv.k.size(3) == head_dim, op, ": q has head_dim ", head_dim, " but the pools have ", kv.k.size(3));
  require_arg(block_size >= 1 && n_kv >= 1 && num_blocks >= 1, op, ": pools must be non-empty, got ", described(kv.k));
  require_arg(num_blocks * block_size < (int64_t{1} << 31), op, ": pools hold more than 2^31 cells");
  require_arg(n_q_heads % n_kv == 0, op, ": n_q_heads = ", n_q_heads, " must be a multiple of n_kv_heads = ", n_kv);

  p.k = kv.k.data();
  p.v = kv.v.data();
  p.kv_elem = kv.k.dtype() == DType::F32    ? math::KvElem::F32
              : kv.k.dtype() == DType::F16  ? math::KvElem::F16
              : kv.k.dtype() == DType::BF16 ? math::KvElem::BF16
                                            : math::KvElem::E4M3;
  p.scale_mode = math::KvScaleMode::None;
  p.maybe_k_scale_u8 = p.maybe_v_scale_u8 = nullptr;
  p.maybe_k_scale_f32 = p.maybe_v_scale_f32 = nullptr;
  if (p.kv_elem == math::KvElem::E4M3) {
    require_arg(!kv.k_scale.empty() && !kv.v_scale.empty(), op, ": e4m3 pools need pages.k_scale and pages.v_scale");
    for (const char* name : {"pages.k_scale", "pages.v_scale"}) {
      const TensorRef& s = name[6] == 'k' ? kv.k_scale : kv.v_scale;
      checks::not_null(op, name, s);
      require_arg(s.device() == dev, op, ": ", name, " is on ", s.device().str(), ", q on ", dev.str());
      require_arg(s.is_contiguous() || (name[6] == 'v' && s.ndim() == 4 && rows_with_stride(s)), op, ": ", name,
                  " must be contiguous (V's scales: or rows of a wider scale array, as pages.v)");
      if (s.dtype() == DType::F32) {
        checks::ndim_is(op, name, s, 3);
        for (int d = 0; d < 3; ++d) checks::size_is(op, name, s, d, kv.k.size(d));
      } else {
        require_arg(s.dtype() == DType::UE8M0 || s.dtype() == DType::U8, op, ": ", name,
                    " must be ue8m0 (per 64 dims) or f32 (per token and head), got ", dtype_name(s.dtype()));
        checks::ndim_is(op, name, s, 4);
        for (int d = 0; d < 3; ++d) checks::size_is(op, name, s, d, kv.k.size(d));
        checks::size_is(op, name, s, 3, (name[6] == 'k' ? head_dim : v_head_dim) / 64);
      }
    }
    require_arg((kv.k_scale.dtype() == DType::F32) == (kv.v_scale.dtype() == DType::F32), op,
                ": pages.k_scale and pages.v_scale must use one scale format, got ", dtype_name(kv.k_scale.dtype()), " and ",
                dtype_name(kv.v_scale.dtype()));
    if (kv.k_scale.dtype() == DType::F32) {
      p.scale_mode = math::KvScaleMode::F32PerRow;
      p.maybe_k_scale_f32 = kv.k_scale.data_as<const float>();
      p.maybe_v_scale_f32 = kv.v_scale.data_as<const float>();
    } else {
      p.scale_mode = math::KvScaleMode::Ue8m0Per64;
      p.maybe_k_scale_u8 = kv.k_scale.data_as<const uint8_t>();
      p.maybe_v_scale_u8 = kv.v_scale.data_as<const uint8_t>();
    }
  } else {
    require_arg(kv.k_scale.empty() && kv.v_scale.empty(), op, ": scales given for a ", dtype_name(kv.k.dtype()),
                " pool (only e4m3 pools take scales)");
  }
  p.maybe_positions = nullptr;
  p.maybe_valid = nullptr;
  if (!kv.positions.empty()) {
    check_cell_array(op, "pages.positions", kv.positions, DType::I32, kv.k, dev);
    p.maybe_positions = kv.positions.data_as<const int32_t>();
  }
  if (!kv.valid.empty()) {
    require_arg(kv.valid.dtype() == DType::U8, op, ": pages.valid must be u8, got ", dtype_name(kv.valid.dtype()));
    check_cell_array(op, "pages.valid", kv.valid, DType::U8, kv.k, dev);
    p.maybe_valid = kv.valid.data_as<const uint8_t>();
  }
  p.layout.block_size = static_cast<int32_t>(block_size);
  p.layout.n_kv_heads = static_cast<int32_t>(n_kv);
  p.layout.head_dim = static_cast<int32_t>(head_dim);
  p.v_head_dim = static_cast<int32_t>(v_head_dim);
  // Contiguous arrays: their own row widths (whatever strides their size-1 dims carry).
  p.v_row_stride = kv.v.is_contiguous() ? v_head_dim : kv.v.stride(2);
  p.v_scale_row_stride = p.scale_mode == math::KvScaleMode::Ue8m0Per64 && !kv.v_scale.is_contiguous()
                             ? kv.v_scale.stride(2)
                             : v_head_dim / 64;
  p.num_blocks = static_cast<int32_t>(num_blocks);
}

}  // namespace kvcore::ops::attn
