// kv_store family entry points: validate every argument, then dispatch on the device.
#include "kvcore/ops/kv_store.hpp"

#include <vector>

#include "ops/checks.hpp"
#include "ops/kv_rotate_checks.hpp"
#include "ops/kv_store_params.hpp"

namespace kvcore {

namespace {

void check_pool(std::string_view op, const KvPool& pool) {
  const TensorRef& d = pool.data;
  require_arg(static_cast<uint8_t>(pool.format) <= static_cast<uint8_t>(KvFormat::Dsv4Row), op,
              ": pool.format must be a KvFormat, got ", static_cast<int>(pool.format));
  checks::not_null(op, "pool.data", d);
  checks::ndim_is(op, "pool.data", d, 4);
  checks::dtype_is(op, "pool.data", d, kv_format_dtype(pool.format));
  // Messages that format a tensor are built only on failure (this runs once per layer per step).
  if (!d.is_contiguous()) require_arg(false, op, ": pool.data must be contiguous, got ", described(d));
  require_arg(pool.head_dim > 0 && pool.head_dim <= kMaxKvHeadDim, op, ": pool.head_dim must be in [1, ", kMaxKvHeadDim,
              "], got ", pool.head_dim);
  if (pool.format == KvFormat::Dsv4Row)
    require_arg(pool.head_dim == math::Dsv4RowLayout::kHeadDim, op, ": a Dsv4Row pool has head_dim ",
                math::Dsv4RowLayout::kHeadDim, ", got ", pool.head_dim);
  checks::size_is(op, "pool.data", d, 3, kv_row_width(pool.format, pool.head_dim));
  if (kv_format_has_scales(pool.format)) {
    require_arg(pool.head_dim % 64 == 0, op, ": an fp8 pool needs head_dim % 64 == 0, got ", pool.head_dim);
    const TensorRef& s = pool.scales;
    checks::not_null(op, "pool.scales", s);
    checks::ndim_is(op, "pool.scales", s, 4);
    require_arg(s.dtype() == DType::UE8M0 || s.dtype() == DType::U8, op, ": pool.scales must be ue8m0 or u8, got ",
                dtype_name(s.dtype()));
    if (!s.is_contiguous()) require_arg(false, op, ": pool.scales must be contiguous, got ", described(s));
    for (int i = 0; i < 3; ++i) checks::size_is(op, "pool.scales", s, i, d.size(i));
    checks::size_is(op, "pool.scales", s, 3, pool.head_dim / 64);
    checks::same_device(op, "pool.data", d, "pool.scales", s);
  }
  checks::backend_available(op, d.device());
}

void check_rope_fits(std::string_view op, const math::RopeTable& rope, const KvPool& pool) {
  const math::RopeLayout& l = rope.layout;
  require_arg(l.n_rot >= 0 && l.n_rot % 2 == 0 && l.n_pairs() <= math::RopeTable::kMaxPairs, op,
              ": rope.layout.n_rot must be even and <= ", 2 * math::RopeTable::kMaxPairs, ", got ", l.n_rot);
  require_arg(l.first_dim >= 0 && l.first_dim + l.n_rot <= pool.head_dim, op, ": rope dims [", l.first_dim, ", ",
              l.first_dim + l.n_rot, ") do not fit head_dim ", pool.head_dim);
  if (pool.format == KvFormat::Dsv4Row)
    require_arg(l.n_rot == 0 || l.first_dim >= math::Dsv4RowLayout::kNope, op,
                ": a Dsv4Row pool rotates only its 16-bit tail [448, 512), rope starts at dim ", l.first_dim);
  checks::rope_table_finite(op, "rope", rope);
}

void check_i32_vector(std::string_view op, std::string_view name, const TensorRef& t, int64_t n, const TensorRef& like) {
  checks::not_null(op, name, t);
  checks::dtype_is(op, name, t, DType::I32);
  checks::ndim_is(op, name, t, 1);
  checks::size_is(op, name, t, 0, n);
  if (!t.is_contiguous()) require_arg(false, op, ": ", name, " must be contiguous, got ", described(t));
  checks::same_device(op, name, t, "pool.data", like);
}

}  // namespace

namespace ops {

void check_rotate_tables(std::string_view op, const TensorRef& blocks, const TensorRef& cell_delta,
                         const TensorRef& d) {
  checks::not_null(op, "blocks", blocks);
  checks::dtype_is(op, "blocks", blocks, DType::I32);
  checks::ndim_is(op, "blocks", blocks, 1);
  if (!blocks.is_contiguous()) require_arg(false, op, ": blocks must be contiguous, got ", described(blocks));
  checks::same_device(op, "blocks", blocks, "pool.data", d);
  require_arg(blocks.size(0) <= d.size(0), op, ": ", blocks.size(0), " blocks listed for a pool of ", d.size(0));
  checks::not_null(op, "cell_delta", cell_delta);
  checks::dtype_is(op, "cell_delta", cell_delta, DType::I32);
  checks::ndim_is(op, "cell_delta", cell_delta, 2);
  checks::size_is(op, "cell_delta", cell_delta, 0, d.size(0));
  checks::size_is(op, "cell_delta", cell_delta, 1, d.size(1));
  if (!cell_delta.is_contiguous())
    require_arg(false, op, ": cell_delta must be contiguous, got ", described(cell_delta));
  checks::same_device(op, "cell_delta", cell_delta, "pool.data", d);
  if (d.device().is_cpu()) {  // device lists cannot be read without a synchronization
    const int32_t* b = blocks.data_as<const int32_t>();
    std::vector<uint8_t> seen(static_cast<size_t>(d.size(0)), 0);
    for (int64_t i = 0; i < blocks.size(0); ++i) {
      require_arg(b[i] >= 0 && b[i] < d.size(0), op, ": blocks[", i, "] = ", b[i], " is outside [0, ", d.size(0), ")");
      require_arg(!seen[b[i]], op, ": blocks[", i, "] = ", b[i], " is listed twice (a block must be rotated once)");
      seen[b[i]] = 1;
    }
  }
}

void check_rotate_pool(std::string_view op, const KvPool& pool, const math::RopeTable& rope) {
  check_pool(op, pool);
  check_rope_fits(op, rope, pool);
}

}  // namespace ops

namespace ops {

KvStoreParams kv_store_checked(std::string_view op, const TensorRef& src, const TensorRef& slots, const KvPool& pool,
                               const TensorRef& maybe_positions, const math::RopeTable* maybe_rope,
                               const TensorRef& maybe_angles) {
  check_pool(op, pool);
  const TensorRef& d = pool.data;
  checks::not_null(op, "src", src);
  checks::ndim_is(op, "src", src, 3);
  require_arg(src.dtype() == DType::F32 || src.dtype() == DType::F16 || src.dtype() == DType::BF16, op,
              ": src must be f32, f16 or bf16, got ", dtype_name(src.dtype()));
  checks::size_is(op, "src", src, 1, d.size(2));
  checks::size_is(op, "src", src, 2, pool.head_dim);
  checks::innermost_contiguous(op, "src", src);
  checks::non_negative_strides(op, "src", src);
  checks::same_device(op, "src", src, "pool.data", d);
  const int64_t n = src.size(0);
  require_arg(n <= INT32_MAX, op, ": at most 2^31-1 tokens per call, got ", n);
  check_i32_vector(op, "slots", slots, n, d);
  const int64_t num_cells = d.size(0) * d.size(1);
  require_arg(num_cells <= INT32_MAX, op, ": pool has ", num_cells, " cells, more than i32 cell ids address");
  const bool rotate = maybe_rope != nullptr && maybe_rope->layout.n_rot > 0;
  if (maybe_rope) check_rope_fits(op, *maybe_rope, pool);
  if (rotate) {
    check_i32_vector(op, "positions", maybe_positions, n, d);
  } else {
    require_arg(maybe_positions.empty() || maybe_positions.numel() == 0 || maybe_rope != nullptr, op,
                ": positions given without a rope table");
  }
  const bool angles = !maybe_angles.empty() && maybe_angles.numel() > 0;
  if (angles) {
    require_arg(rotate, op, ": maybe_angles given without positions and a rope table that rotates");
    checks::dtype_is(op, "maybe_angles", maybe_angles, DType::F32);
    checks::ndim_is(op, "maybe_angles", maybe_angles, 3);
    checks::size_is(op, "maybe_angles", maybe_angles, 0, n);
    checks::size_is(op, "maybe_angles", maybe_angles, 1, maybe_rope->layout.n_pairs());
    checks::size_is(op, "maybe_angles", maybe_angles, 2, 2);
    if (!maybe_angles.is_contiguous())
      require_arg(false, op, ": maybe_angles must be contiguous, got ", described(maybe_angles));
    checks::same_device(op, "maybe_angles", maybe_angles, "pool.data", d);
  }
  if (d.device().is_cpu()) {
    const int32_t* s = slots.data_as<const int32_t>();
    for (int64_t i = 0; i < n; ++i)
      require_arg(s[i] < num_cells, op, ": slots[", i, "] = ", s[i], " is outside the pool's ", num_cells, " cells");
  }

  KvStoreParams p;
  p.src = src.data();
  p.src_token_stride = src.stride(0);
  p.src_head_stride = src.stride(1);
  p.src_dtype = src.dtype();
  p.slots = slots.data_as<const int32_t>();
  p.maybe_positions = rotate ? maybe_positions.data_as<const int32_t>() : nullptr;
  p.pool = d.data();
  p.maybe_scales = kv_format_has_scales(pool.format) ? pool.scales.data_as<uint8_t>() : nullptr;
  p.format = pool.format;
  p.n_tokens = static_cast<int32_t>(n);
  p.n_heads = static_cast<int32_t>(d.size(2));
  p.head_dim = pool.head_dim;
  p.row_width = kv_row_width(pool.format, pool.head_dim);
  p.num_cells = num_cells;
  if (rotate) p.rope = *maybe_rope;
  if (angles) p.maybe_angles = maybe_angles.data_as<const float>();
  return p;
}

void kv_store_dispatch(const KvStoreParams& p, Device device, Stream stream) {
  if (p.n_tokens == 0) return;
  if (device.is_cpu()) {
    cpu::kv_store(p);
    return;
  }
#if KVCORE_WITH_CUDA
  ops::cuda::kv_store(p, stream);
#else
  (void)stream;
#endif
}

}  // namespace ops

void kv_store(const TensorRef& src, const TensorRef& slots, const KvPool& pool, const TensorRef& maybe_positions,
              const math::RopeTable* maybe_rope, Stream stream, const TensorRef& maybe_angles) {
  const KvStoreParams p = ops::kv_store_checked("kv_store", src, slots, pool, maybe_positions, maybe_rope, maybe_angles);
  ops::kv_store_dispatch(p, pool.data.device(), stream);
}

void kv_rope_angles(const TensorRef& positions, const math::RopeTable& rope, const TensorRef& out, Stream stream) {
  constexpr std::string_view op = "kv_rope_angles";
  checks::not_null(op, "positions", positions);
  checks::dtype_is(op, "positions", positions, DType::I32);
  checks::ndim_is(op, "positions", positions, 1);
  if (!positions.is_contiguous()) require_arg(false, op, ": positions must be contiguous, got ", described(positions));
  const int64_t n = positions.size(0);
  require_arg(n <= INT32_MAX, op, ": at most 2^31-1 positions, got ", n);
  const math::RopeLayout& l = rope.layout;
  require_arg(l.n_rot >= 0 && l.n_rot % 2 == 0 && l.n_pairs() <= math::RopeTable::kMaxPairs, op,
              ": rope.layout.n_rot must be even and <= ", 2 * math::RopeTable::kMaxPairs, ", got ", l.n_rot);
  checks::not_null(op, "out", out);
  checks::dtype_is(op, "out", out, DType::F32);
  checks::ndim_is(op, "out", out, 3);
  checks::size_is(op, "out", out, 0, n);
  checks::size_is(op, "out", out, 1, l.n_pairs());
  checks::size_is(op, "out", out, 2, 2);
  if (!out.is_contiguous()) require_arg(false, op, ": out must be contiguous, got ", described(out));
  checks::same_device(op, "positions", positions, "out", out);
  checks::backend_available(op, out.device());
  if (n == 0 || l.n_pairs() == 0) return;
  KvAnglesParams p;
  p.positions = positions.data_as<const int32_t>();
  p.out = out.data_as<float>();
  p.n = static_cast<int32_t>(n);
  p.rope = rope;
  if (out.device().is_cpu()) {
    cpu::kv_rope_angles(p);
    return;
  }
#if KVCORE_WITH_CUDA
  ops::cuda::kv_rope_angles(p, stream);
#else
  (void)stream;
#endif
}

void kv_rotate_blocks(const KvPool& pool, const TensorRef& blocks, const TensorRef& cell_delta,
                      const math::RopeTable& rope, Stream stream) {
  constexpr std::string_view op = "kv_rotate_blocks";
  check_pool(op, pool);
  check_rope_fits(op, rope, pool);
  const TensorRef& d = pool.data;
  ops::check_rotate_tables(op, blocks, cell_delta, d);
  if (blocks.size(0) == 0 || rope.layout.n_rot == 0) return;

  KvRotateParams p;
  p.pool = d.data();
  p.maybe_scales = kv_format_has_scales(pool.format) ? pool.scales.data_as<uint8_t>() : nullptr;
  p.format = pool.format;
  p.n_heads = static_cast<int32_t>(d.size(2));
  p.head_dim = pool.head_dim;
  p.row_width = kv_row_width(pool.format, pool.head_dim);
  p.block_size = static_cast<int32_t>(d.size(1));
  p.blocks = blocks.data_as<const int32_t>();
  p.n_blocks = static_cast<int32_t>(blocks.size(0));
  p.cell_delta = cell_delta.data_as<const int32_t>();
  p.rope = rope;
  if (d.device().is_cpu()) {
    cpu::kv_rotate_blocks(p);
    return;
  }
#if KVCORE_WITH_CUDA
  ops::cuda::kv_rotate_blocks(p, stream);
#else
  (void)stream;
#endif
}

}  // namespace kvcore
