// Entry point of the fused DeepSeek-V4 decode step (finalize + store + emit + shift).
#include "kvcore/ops/dsv4.hpp"
#include "ops/dsv4_checks.hpp"

namespace kvcore {

using namespace dsv4_checks;

namespace {

dsv4::CompressorParams decode_part(string_view op, const Dsv4DecodeCompressor& d, int64_t pos, Dsv4Quant quant,
                                   const TensorRef& kv, int32_t* due) {
  const Dsv4Compressor& c = d.comp;
  check_comp(op, c);
  check_state(op, d.state_kv, d.state_score, c);
  check_vector(op, "c", d.c, DType::F32, c.width());
  check_vector(op, "z", d.z, DType::F32, c.width());
  same_device(op, "c", d.c, "kv", kv);
  same_device(op, "z", d.z, "kv", kv);
  same_device(op, "state_kv", d.state_kv, "kv", kv);
  check_ape(op, d.w.ape, c, d.state_kv);
  check_weights(op, d.w, c, d.state_kv);
  const int64_t cap = check_rows(op, d.rows, c, quant, d.state_kv);
  check_quant_geometry(op, c, quant);
  *due = (pos + 1) % c.ratio == 0 ? 1 : 0;
  if (*due)
    KVCORE_DSV4_CHECK(pos / c.ratio < cap, op, ": token ", pos, " completes row ", pos / c.ratio, " but the row store holds ", cap);
  dsv4::CompressorParams p = make_params(c, d.state_kv, d.state_score, quant);
  set_ape(p, d.w.ape);
  set_emit(p, d.w, d.rows);
  p.c = d.c.data_as<const float>();
  p.z = d.z.data_as<const float>();
  p.pos = pos;
  p.n_tokens = 1;
  p.window = pos / c.ratio;
  return p;
}

}  // namespace

void dsv4_decode_layer(const TensorRef& kv, const TensorRef& raw_ring, int32_t n_rot, int64_t pos, Dsv4Quant quant,
                       const Dsv4DecodeCompressor* maybe_comp, const Dsv4DecodeCompressor* maybe_idx, Stream stream) {
  constexpr string_view op = "dsv4_decode_layer";
  ndim_is(op, "kv", kv, 2);
  size_is(op, "kv", kv, 0, 1);
  const int64_t hd = kv.size(1);
  KVCORE_DSV4_CHECK(hd > 0 && hd <= 4096, op, ": kv head_dim must be in [1, 4096], got ", described(kv));
  check_matrix(op, "kv", kv, DType::F32, 1, hd);
  ndim_is(op, "raw_ring", raw_ring, 2);
  KVCORE_DSV4_CHECK(raw_ring.dtype() == DType::F32 || raw_ring.dtype() == DType::F16, op, ": raw_ring must be f32 or f16, got ",
              dtype_name(raw_ring.dtype()));
  check_matrix(op, "raw_ring", raw_ring, raw_ring.dtype(), -1, hd);
  KVCORE_DSV4_CHECK(raw_ring.size(0) > 0, op, ": raw_ring must have rows");
  same_device(op, "kv", kv, "raw_ring", raw_ring);
  KVCORE_DSV4_CHECK(n_rot >= 0 && n_rot % 2 == 0 && n_rot <= hd, op, ": n_rot must be even and in [0, ", hd,
                    "] (rope dims come in pairs), got ", n_rot);
  check_quant(op, quant);
  KVCORE_DSV4_CHECK(pos >= 0 && pos < (int64_t{1} << 24), op, ": pos must be in [0, 2^24), got ", pos);
  dsv4::DecodeParams p{};
  p.fin.kv = kv.data_as<float>();
  p.fin.kv_stride = kv.stride(0);
  p.fin.n_rows = 1;
  p.fin.head_dim = static_cast<int32_t>(hd);
  p.fin.n_rot = n_rot;
  p.fin.raw = raw_ring.data();
  p.fin.raw_stride = raw_ring.stride(0);
  p.fin.raw_f16 = raw_ring.dtype() == DType::F16 ? 1 : 0;
  p.fin.raw_rows = static_cast<int32_t>(raw_ring.size(0));
  p.fin.first_raw_row = pos % raw_ring.size(0);
  p.fin.quant = quant == Dsv4Quant::On ? 1 : 0;
  if (maybe_comp) {
    p.comp = decode_part(op, *maybe_comp, pos, quant, kv, &p.comp_due);
    p.has_comp = 1;
  }
  if (maybe_idx) {
    p.idx = decode_part(op, *maybe_idx, pos, quant, kv, &p.idx_due);
    p.has_idx = 1;
  }
  dispatch(op, kv.device(), [&] { dsv4::cpu::decode_layer(p); }, [&] {
#if KVCORE_WITH_CUDA
    ops::cuda::dsv4::decode_layer(p, stream);
#endif
  });
  (void)stream;
}

}  // namespace kvcore
