// rope_shift_rows: every row of a dense K tensor rotated by its own delta (a
// llama.cpp-style per-cell position shift). Bytes: the rotated values read once
// and written once (Traffic::Copy). Shapes: Llama-3-8B f16 K [L, 8, 128] and
// DeepSeek-V4 packed rows [L, 1, 584 B] (only the 64-dim bf16 rope tail rotates).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/math/dsv4_row.hpp"
#include "kvcore/ops/shift.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;

void run_case(cli::BenchOptions& opt, const std::string& name, int64_t rows, int heads, int64_t row_elems, DType dt,
              const RopeSpec& spec) {
  if (!opt.wants(name)) return;
  const size_t bytes = static_cast<size_t>(rows) * heads * row_elems * dtype_size(dt);
  std::vector<uint8_t> host(bytes);
  std::mt19937_64 rng(5);
  for (size_t i = 0; i + 1 < bytes; i += 2) {  // f16 / bf16 values of moderate size (exponent bits 0x38..0x3f)
    host[i] = static_cast<uint8_t>(rng());
    host[i + 1] = static_cast<uint8_t>(0x38 + rng() % 8 + ((rng() & 1) << 7));
  }
  Buffer k = Buffer::from_host(host, opt.device);
  std::vector<int32_t> hd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) hd[r] = -1 - static_cast<int32_t>(r % 4093);  // every row moves
  Buffer delta = Buffer::from_host(hd, opt.device);
  const TensorRef kt(k.data(), dt, opt.device, {rows, heads, row_elems});
  const TensorRef dtr(delta.data(), DType::I32, opt.device, {rows});
  cli::BenchRecord r;
  r.bench = "rope_shift_rows";
  r.case_name = name;
  const double rotated_bytes = 2.0 * spec.n_rot;  // n_rot 16-bit values a head
  r.bytes = 2.0 * static_cast<double>(rows) * heads * rotated_bytes;
  r.traffic = cli::Traffic::Copy;
  // rotations keep norms: repeated shifts of the same buffer stay on real data
  r.t = opt.time([&](int) { rope_shift_rows(kt, TensorRef(), spec, dtr); });
  opt.report(r);
}

}  // namespace

KVCORE_BENCH(rope_shift_rows, "per-row RoPE shift of a dense K tensor (rope_shift_rows): Llama-3-8B f16, DeepSeek-V4 rows") {
  const int64_t L = opt.quick ? 4096 : 32768;
  const std::string n = std::to_string(L / 1024) + "k";
  run_case(opt, "llama8b_f16_L" + n + " [L,8,128]", L, 8, 128, DType::F16, RopeSpec::llama3_8b());
  run_case(opt, "dsv4_rows_L" + n + " [L,1,584 B]", L, 1, math::Dsv4RowLayout::kBytes, DType::U8,
           RopeSpec::deepseek_v4_compressed());
}
