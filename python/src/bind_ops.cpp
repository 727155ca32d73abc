// Op families over caller tensors: runtime queries, rope, the FP8 codecs, shift, kv_store.
// Every function converts its tensors first (no copy), then releases the GIL while kvcore works.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <vector>

#include "bindings.hpp"
#include "kvcore/error.hpp"
#include "kvcore/ops/fp8.hpp"
#include "kvcore/ops/kv_store.hpp"
#include "kvcore/ops/rope.hpp"
#include "kvcore/ops/shift.hpp"
#include "kvcore/runtime.hpp"
#include "names.hpp"
#include "tensors.hpp"

namespace kvcore::py {

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// A pool for kv_store: the format follows the data tensor (f32 / f16 / bf16 rows, e4m3 codes with
// scales, or 584-byte DeepSeek-V4 rows when uint8 comes without scales).
KvPool make_pool(const Tensor& data, const Tensor& scales, int32_t head_dim) {
  KvPool p;
  p.data = data.ref;
  p.scales = scales.ref;
  p.head_dim = head_dim;
  switch (data.ref.dtype()) {
    case DType::F32: p.format = KvFormat::F32; break;
    case DType::F16: p.format = KvFormat::F16; break;
    case DType::BF16: p.format = KvFormat::BF16; break;
    case DType::E4M3: p.format = KvFormat::Fp8; break;
    case DType::U8: p.format = scales.ref.empty() ? KvFormat::Dsv4Row : KvFormat::Fp8; break;
    default:
      throw Error(ErrorCode::InvalidArgument,
                  detail::concat("argument 'pool': ", described(data.ref), " is not a pool dtype (f32, f16, bf16, uint8)"));
  }
  if (p.format == KvFormat::Fp8) p.data = TensorRef(data.ref.data(), DType::E4M3, data.ref.device(), data.ref.ndim(),
                                                    data.ref.shape_data(), data.ref.strides_data());
  return p;
}

}  // namespace

void bind_ops(nb::module_& m) {
  // ---- runtime ----
  m.def("version", &kvcore::version, "The library version, e.g. '0.1.0'.");
  m.def("cuda_compiled", &cuda_compiled, "Was this build made with the CUDA backend?");
  m.def("cuda_device_count", &cuda_device_count, "CUDA devices visible (0 without the CUDA backend or a GPU).");

  // ---- rope ----
  m.def(
      "rope_apply",
      [](nb::handle x, nb::handle positions, const RopeSpec& rope, bool apply_attention_factor, nb::handle out,
         nb::handle stream) -> nb::object {
        Tensor tx = to_tensor(x, "x"), tp = to_tensor(positions, "positions");
        Tensor to = out.is_none() ? tx : to_tensor(out, "out");
        const Stream s = resolve_stream(stream, tx.ref.device());
        {
          nb::gil_scoped_release g;
          rope_apply(tx.ref, tp.ref, rope, parse_attention_factor(apply_attention_factor), to.ref, s);
        }
        return nb::borrow(out.is_none() ? x : out);
      },
      "x"_a.none(), "positions"_a.none(), "rope"_a, nb::kw_only(), "apply_attention_factor"_a = true, "out"_a = nb::none(),
      "stream"_a = nb::none(),
      "Rotate rows x [tokens, heads, head_dim] (f32/f16/bf16) at positions (int32/int64 [tokens]).\n"
      "In place unless out (same shape and dtype) is given; returns the tensor written.\n"
      "apply_attention_factor: scale cos/sin by rope.attention_factor (what a model does when it\n"
      "writes keys); False for a pure rotation (a shift, an inverse).");

  // ---- FP8 codecs ----
  m.def(
      "fp8_round_trip_rows",
      [](nb::handle src, int n_rot, nb::handle out, nb::handle stream) -> nb::object {
        Tensor ts = to_tensor(src, "src");
        Output o = output(out, "out", src, shape_with_last(ts.ref, ts.ref.ndim() ? ts.ref.size(ts.ref.ndim() - 1) : 0),
                          DType::F32);
        const Stream s = resolve_stream(stream, ts.ref.device());
        {
          nb::gil_scoped_release g;
          fp8_round_trip_rows(ts.ref, o.t.ref, n_rot, s);
        }
        return o.obj;
      },
      "src"_a.none(), "n_rot"_a = 0, nb::kw_only(), "out"_a = nb::none(), "stream"_a = nb::none(),
      "FP8-round the first cols - n_rot dims of each f32 row (E4M3 with one UE8M0 scale per 64),\n"
      "copy the n_rot tail. out=src runs in place; out=None returns a new f32 tensor.");
  m.def(
      "fp8_pack_rows",
      [](nb::handle src, int n_rot, nb::handle codes, nb::handle scales, nb::handle tail, nb::handle tail_dtype,
         nb::handle stream) -> nb::tuple {
        Tensor ts = to_tensor(src, "src");
        require_arg(ts.ref.ndim() >= 1, "argument 'src' must have rank >= 1, got ", described(ts.ref));
        const int64_t cols = ts.ref.size(ts.ref.ndim() - 1), n_nope = cols - n_rot;
        require_arg(n_rot >= 0 && n_nope >= 0, "argument 'n_rot' must be in [0, ", cols, "], got ", n_rot);
        Output oc = output(codes, "codes", src, shape_with_last(ts.ref, n_nope), DType::U8, DType::E4M3);
        Output os = output(scales, "scales", src, shape_with_last(ts.ref, (n_nope + 63) / 64), DType::U8, DType::UE8M0);
        Output ot{nb::none(), {}};
        if (n_rot > 0 || !tail.is_none())
          ot = output(tail, "tail", src, shape_with_last(ts.ref, n_rot), parse_dtype(tail_dtype));
        const Stream s = resolve_stream(stream, ts.ref.device());
        {
          nb::gil_scoped_release g;
          fp8_pack_rows(ts.ref, oc.t.ref, os.t.ref, ot.t.ref, s);
        }
        return nb::make_tuple(oc.obj, os.obj, ot.obj);
      },
      "src"_a.none(), "n_rot"_a = 0, nb::kw_only(), "codes"_a = nb::none(), "scales"_a = nb::none(), "tail"_a = nb::none(),
      "tail_dtype"_a = "float16", "stream"_a = nb::none(),
      "Pack rows src [..., cols] (f32/f16/bf16) into FP8: returns (codes uint8 [..., n_nope],\n"
      "scales uint8 [..., ceil(n_nope/64)] UE8M0, tail [..., n_rot] f16/bf16 or None), n_nope = cols - n_rot.\n"
      "Pass codes/scales/tail to write into your tensors.");
  m.def(
      "fp8_unpack_rows",
      [](nb::handle codes, nb::handle scales, nb::handle tail, nb::handle out, nb::handle dtype,
         nb::handle stream) -> nb::object {
        Tensor tc = to_tensor(codes, "codes", DType::E4M3), ts = to_tensor(scales, "scales", DType::UE8M0);
        Tensor tt = to_optional_tensor(tail, "tail");
        const int64_t n_nope = tc.ref.ndim() ? tc.ref.size(tc.ref.ndim() - 1) : 0;
        const int64_t n_rot = tt.ref.ndim() ? tt.ref.size(tt.ref.ndim() - 1) : 0;
        Output o = output(out, "out", codes, shape_with_last(tc.ref, n_nope + n_rot), parse_dtype(dtype));
        const Stream s = resolve_stream(stream, tc.ref.device());
        {
          nb::gil_scoped_release g;
          fp8_unpack_rows(tc.ref, ts.ref, tt.ref, o.t.ref, s);
        }
        return o.obj;
      },
      "codes"_a.none(), "scales"_a.none(), "tail"_a = nb::none(), nb::kw_only(), "out"_a = nb::none(), "dtype"_a = "float32",
      "stream"_a = nb::none(), "Decode fp8_pack_rows' output into rows [..., n_nope + n_rot] of dtype (or into out).");
  m.def(
      "dsv4_pack_rows",
      [](nb::handle src, nb::handle out, nb::handle stream) -> nb::object {
        Tensor ts = to_tensor(src, "src");
        Output o = output(out, "out", src, shape_with_last(ts.ref, 584), DType::U8);
        const Stream s = resolve_stream(stream, ts.ref.device());
        {
          nb::gil_scoped_release g;
          dsv4_pack_rows(ts.ref, o.t.ref, s);
        }
        return o.obj;
      },
      "src"_a.none(), nb::kw_only(), "out"_a = nb::none(), "stream"_a = nb::none(),
      "Pack f32 rows [..., 512] into DeepSeek-V4's 584-byte rows (uint8 [..., 584]): 448 e4m3 codes,\n"
      "64 bf16 rope dims, 7 UE8M0 scales, 1 pad byte.");
  m.def(
      "dsv4_unpack_rows",
      [](nb::handle packed, nb::handle out, nb::handle dtype, nb::handle stream) -> nb::object {
        Tensor tp = to_tensor(packed, "packed");
        Output o = output(out, "out", packed, shape_with_last(tp.ref, 512), parse_dtype(dtype));
        const Stream s = resolve_stream(stream, tp.ref.device());
        {
          nb::gil_scoped_release g;
          dsv4_unpack_rows(tp.ref, o.t.ref, s);
        }
        return o.obj;
      },
      "packed"_a.none(), nb::kw_only(), "out"_a = nb::none(), "dtype"_a = "float32", "stream"_a = nb::none(),
      "Decode 584-byte DeepSeek-V4 rows into [..., 512] rows of dtype (or into out).");

  // ---- shift ----
  m.def(
      "shift_dense",
      [](nb::list k, nb::handle v, nb::handle rope, int64_t length, int64_t n_keep, int64_t n_discard,
         nb::handle k_scales, nb::handle stream) {
        const size_t n = nb::len(k);
        std::vector<Tensor> held;
        held.reserve(3 * n);
        std::vector<ShiftDenseLayer> layers(n);
        nb::list vl = v.is_none() ? nb::list() : nb::cast<nb::list>(v);
        nb::list sl = k_scales.is_none() ? nb::list() : nb::cast<nb::list>(k_scales);
        require_arg(v.is_none() || nb::len(vl) == n, "argument 'v': ", nb::len(vl), " tensors for ", n, " layers");
        require_arg(k_scales.is_none() || nb::len(sl) == n, "argument 'k_scales': ", nb::len(sl), " tensors for ", n,
                    " layers");
        const bool one_rope = nb::isinstance<RopeSpec>(rope);
        nb::list rl = one_rope ? nb::list() : nb::cast<nb::list>(rope);
        require_arg(one_rope || nb::len(rl) == n, "argument 'rope': ", nb::len(rl), " specs for ", n, " layers");
        for (size_t i = 0; i < n; ++i) {
          held.push_back(to_tensor(k[i], "k", DType::E4M3));
          layers[i].k = held.back().ref;
          if (layers[i].k.dtype() == DType::E4M3 && k_scales.is_none())  // uint8 K without scales: DeepSeek-V4 rows
            layers[i].k = TensorRef(layers[i].k.data(), DType::U8, layers[i].k.device(), layers[i].k.ndim(),
                                    layers[i].k.shape_data(), layers[i].k.strides_data());
          if (!v.is_none()) {
            held.push_back(to_tensor(vl[i], "v"));
            layers[i].maybe_v = held.back().ref;
          }
          if (!k_scales.is_none()) {
            held.push_back(to_tensor(sl[i], "k_scales", DType::UE8M0));
            layers[i].maybe_k_scales = held.back().ref;
          }
          layers[i].rope = nb::cast<RopeSpec>(one_rope ? rope : rl[i]);
        }
        const Stream s = resolve_stream(stream, n ? layers[0].k.device() : Device::cpu());
        nb::gil_scoped_release g;
        shift_dense(layers, length, n_keep, n_discard, s);
      },
      "k"_a, "v"_a.none(), "rope"_a, "length"_a, "n_keep"_a, "n_discard"_a, nb::kw_only(), "k_scales"_a = nb::none(),
      "stream"_a = nb::none(),
      "Context shift of a dense cache you own, in place, every layer in one call: keep tokens\n"
      "[0, n_keep), drop [n_keep, n_keep + n_discard), move later tokens (< length) down by n_discard and\n"
      "re-rotate their keys by -n_discard.\n"
      "k: list of per-layer K [capacity, n_kv_heads, head_dim] (f32/f16/bf16; uint8 e4m3 codes with\n"
      "k_scales; uint8 [capacity, (heads,) 584] DeepSeek-V4 rows without k_scales); v: list of V or None;\n"
      "rope: one RopeSpec or one per layer.");
  m.def(
      "rope_shift_rows",
      [](nb::handle k, nb::handle delta, const RopeSpec& rope, nb::handle k_scales, nb::handle stream) {
        Tensor tk = to_tensor(k, "k", k_scales.is_none() ? DType::U8 : DType::E4M3);
        Tensor ts = to_optional_tensor(k_scales, "k_scales", DType::UE8M0), td = to_tensor(delta, "delta");
        const Stream s = resolve_stream(stream, tk.ref.device());
        nb::gil_scoped_release g;
        rope_shift_rows(tk.ref, ts.ref, rope, td.ref, s);
      },
      "k"_a.none(), "delta"_a.none(), "rope"_a, nb::kw_only(), "k_scales"_a = nb::none(), "stream"_a = nb::none(),
      "Rotate K rows in place, row r by delta[r] (int32) positions (a pure rotation).");

  // ---- kv_store ----
  m.def(
      "kv_store",
      [](nb::handle src, nb::handle slots, nb::handle pool, nb::handle scales, nb::handle positions,
         std::optional<RopeSpec> rope, nb::handle stream) {
        Tensor tsrc = to_tensor(src, "src"), tslots = to_tensor(slots, "slots");
        Tensor tpool = to_tensor(pool, "pool", DType::U8), tsc = to_optional_tensor(scales, "scales", DType::UE8M0);
        Tensor tpos = to_optional_tensor(positions, "positions");
        require_arg(tsrc.ref.ndim() == 3, "argument 'src' must be [n_tokens, n_heads, head_dim], got ",
                    described(tsrc.ref));
        const KvPool p = make_pool(tpool, tsc, static_cast<int32_t>(tsrc.ref.size(2)));
        math::RopeTable table{};
        if (rope) {
          rope->validate(p.head_dim);
          table = make_rope_table(*rope, p.head_dim);
        }
        const Stream s = resolve_stream(stream, tsrc.ref.device());
        nb::gil_scoped_release g;
        kv_store(tsrc.ref, tslots.ref, p, tpos.ref, rope ? &table : nullptr, s);
      },
      "src"_a.none(), "slots"_a.none(), "pool"_a.none(), nb::kw_only(), "scales"_a = nb::none(), "positions"_a = nb::none(),
      "rope"_a = nb::none(), "stream"_a = nb::none(),
      "Write rows src [n_tokens, n_heads, head_dim] (f32/f16/bf16) into the cells slots (int32 [n_tokens],\n"
      "block * block_size + slot; negative skips) of a paged pool [num_blocks, block_size, n_heads, width].\n"
      "The pool's dtype picks the format: f32/f16/bf16 rows; uint8 e4m3 codes with scales (UE8M0\n"
      "[.., head_dim / 64]); uint8 [.., 584] DeepSeek-V4 rows without scales. positions + rope: rotate each\n"
      "row at its position first (rope-stored caches).");
}

}  // namespace kvcore::py
