// Demo section "shift": a generation loop on a fixed-size dense f16 cache
// (Llama-3 RoPE) that shifts whenever the cache is full (keep the first 4
// tokens, drop the next quarter), and checks after every shift that every
// key equals a fresh float64 rotation of that token's key at its new
// position, and every V row is that token's V row.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/math/half.hpp"
#include "kvcore/ops/shift.hpp"
#include "kvcore/runtime.hpp"
#include "tools/registry.hpp"

namespace {

using namespace kvcore;

constexpr int kHeadDim = 128;

// The unrotated key (or the value) of token `id`: deterministic, so nothing is stored per token.
void token_vector(int64_t id, bool value, int n, double* out) {
  std::mt19937_64 rng(static_cast<uint64_t>(id) * 2 + (value ? 1 : 0));
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int i = 0; i < n; ++i) out[i] = normal(rng);
}

void rotate(double* head, const math::RopeLayout& l, const math::RopeTable& t, double pos) {
  for (int i = 0; i < l.n_pairs(); ++i) {
    const double a = pos * double(t.freq[i]), c = std::cos(a), s = std::sin(a);
    const double x0 = head[l.dim0(i)], x1 = head[l.dim1(i)];
    head[l.dim0(i)] = x0 * c - x1 * s;
    head[l.dim1(i)] = x0 * s + x1 * c;
  }
}

}  // namespace

KVCORE_DEMO_SECTION(30, "shift", "context shift: a generation loop on a full dense cache, every key re-checked after each shift") {
  const int heads = opt.quick ? 2 : 8;
  const int64_t capacity = opt.quick ? 256 : 4096;
  const int64_t n_tokens = opt.quick ? 1000 : 20000;
  const int64_t n_keep = 4, n_discard = capacity / 4;
  const int row = heads * kHeadDim;
  const RopeSpec rope = RopeSpec::llama3_8b();
  const math::RopeTable table = make_rope_table(rope, kHeadDim);
  const Device dev = opt.device;
  std::printf("dense f16 cache of %lld tokens x %d kv heads x %d on %s, %s\n", (long long)capacity, heads, kHeadDim,
              dev.str().c_str(), rope.describe().c_str());
  std::printf("generating %lld tokens; when full: keep %lld, discard %lld, shift the rest down and re-rotate K\n",
              (long long)n_tokens, (long long)n_keep, (long long)n_discard);

  Buffer k(capacity * row * 2, dev), v(capacity * row * 2, dev);
  ShiftDenseLayer layer;
  layer.k = TensorRef(k.data(), DType::F16, dev, {capacity, heads, kHeadDim});
  layer.maybe_v = TensorRef(v.data(), DType::F16, dev, {capacity, heads, kHeadDim});
  layer.rope = rope;

  std::vector<int64_t> ids;     // token id held by each slot; slot j is at position j
  std::vector<int> rotations;   // shifts each slot's key went through (error grows by one rounding each)
  std::vector<double> vec(row);
  std::vector<uint16_t> krow(row), vrow(row);
  int shifts = 0, failures = 0;
  double worst_rel = 0;
  for (int64_t id = 0; id < n_tokens; ++id) {
    if (static_cast<int64_t>(ids.size()) == capacity) {
      shift_dense(std::span<const ShiftDenseLayer>(&layer, 1), capacity, n_keep, n_discard);
      ids.erase(ids.begin() + n_keep, ids.begin() + n_keep + n_discard);
      rotations.erase(rotations.begin() + n_keep, rotations.begin() + n_keep + n_discard);
      for (size_t j = n_keep; j < rotations.size(); ++j) ++rotations[j];
      ++shifts;
      // check every key and value now in the cache
      const auto kh = k.to_host<uint16_t>(), vh = v.to_host<uint16_t>();
      double max_rel = 0, max_allowed = 0;
      int64_t bad = 0;
      for (size_t j = 0; j < ids.size(); ++j) {
        token_vector(ids[j], false, row, vec.data());
        for (int h = 0; h < heads; ++h) rotate(vec.data() + h * kHeadDim, table.layout, table, double(j));
        const double tol = 1.1 * (rotations[j] + 1) * std::ldexp(1.0, -11);  // one f16 rounding per write or shift
        max_allowed = std::max(max_allowed, tol);
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < table.layout.n_pairs(); ++i) {
            const int d0 = h * kHeadDim + table.layout.dim0(i), d1 = h * kHeadDim + table.layout.dim1(i);
            const double norm = std::hypot(vec[d0], vec[d1]);
            const double e = std::max(std::fabs(math::f16_bits_to_f32(kh[j * row + d0]) - vec[d0]),
                                      std::fabs(math::f16_bits_to_f32(kh[j * row + d1]) - vec[d1])) / norm;
            max_rel = std::max(max_rel, e);
            if (!(e <= tol)) ++bad;
          }
        token_vector(ids[j], true, row, vec.data());
        for (int i = 0; i < row; ++i)
          if (vh[j * row + i] != math::f32_to_f16_bits(static_cast<float>(vec[i]))) ++bad;
      }
      worst_rel = std::max(worst_rel, max_rel);
      if (bad) ++failures;
      if (shifts <= 3 || bad || id + capacity - n_discard >= n_tokens)
        std::printf("  shift %2d at token %6lld: %lld keys checked at their new positions, max error %.2e of the pair norm "
                    "(allowed %.2e), V rows intact: %s\n",
                    shifts, (long long)id, (long long)ids.size(), max_rel, max_allowed, bad ? "FAILED" : "ok");
      else if (shifts == 4)
        std::printf("  ...\n");
    }
    // append token `id` at slot = position ids.size()
    const int64_t slot = static_cast<int64_t>(ids.size());
    token_vector(id, false, row, vec.data());
    for (int h = 0; h < heads; ++h) rotate(vec.data() + h * kHeadDim, table.layout, table, double(slot));
    for (int i = 0; i < row; ++i) krow[i] = math::f32_to_f16_bits(static_cast<float>(vec[i]));
    token_vector(id, true, row, vec.data());
    for (int i = 0; i < row; ++i) vrow[i] = math::f32_to_f16_bits(static_cast<float>(vec[i]));
    copy_bytes(static_cast<uint8_t*>(k.data()) + slot * row * 2, dev, krow.data(), Device::cpu(), row * 2);
    copy_bytes(static_cast<uint8_t*>(v.data()) + slot * row * 2, dev, vrow.data(), Device::cpu(), row * 2);
    ids.push_back(id);
    rotations.push_back(0);
  }
  std::printf("%d shifts, every check after every shift %s; worst key error %.2e of the pair norm\n", shifts,
              failures ? "FAILED" : "passed", worst_rel);
  std::printf("(keys that survive many shifts pick up one f16 rounding per shift: a manager that defers shifts and\n"
              " applies the sum once with rope_shift_rows keeps a single rounding)\n");
  return failures ? 1 : 0;
}
