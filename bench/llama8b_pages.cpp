// Llama-3-8B paged K/V for the attention benches (llama8b_pages.hpp).
#include "bench/llama8b_pages.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "kvcore/math/half.hpp"

namespace kvcore::cli::llama8b {

namespace {

void fill_tiled(Tiled& t, size_t bytes, Device d, bool fp8, uint64_t seed, size_t unit) {
  const size_t pat = std::min<size_t>(bytes, (size_t{32} << 20) / unit * unit);
  t.pattern.resize(pat);
  std::mt19937_64 rng(seed);
  if (fp8) {
    for (auto& b : t.pattern) b = static_cast<uint8_t>((rng() % 0x58) | (rng() & 0x80));  // finite, |x| <= 20
  } else {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (size_t i = 0; i + 1 < pat; i += 2) {
      const uint16_t h = math::f32_to_f16_bits(u(rng));
      std::memcpy(&t.pattern[i], &h, 2);
    }
  }
  t.dev = Buffer(bytes, d);
  Buffer src = Buffer::from_host(t.pattern, d);
  for (size_t off = 0; off < bytes; off += pat)
    copy_bytes(static_cast<uint8_t*>(t.dev.data()) + off, d, src.data(), d, std::min(pat, bytes - off));
}

}  // namespace

double kv_bytes(int64_t batch, int64_t ctx, bool fp8) {
  const double rows = double(batch) * ctx * kKvHeads;
  return 2.0 * rows * (fp8 ? kHeadDim + kHeadDim / 64 : kHeadDim * 2);
}

Pages make_pages(Device d, int64_t batch, int64_t ctx, bool fp8, bool rope, int64_t copies) {
  Pages s;
  s.batch = batch;
  s.ctx = ctx;
  s.fp8 = fp8;
  s.rope = rope;
  s.copies = copies;
  s.blocks_per_seq = (ctx + kBlock - 1) / kBlock;
  s.num_blocks = s.copies * batch * s.blocks_per_seq;
  const size_t elem = fp8 ? 1 : 2;
  const size_t blk_bytes = kBlock * kKvHeads * kHeadDim * elem, blk_scales = kBlock * kKvHeads * (kHeadDim / 64);
  fill_tiled(s.k, s.num_blocks * blk_bytes, d, fp8, 1, blk_bytes);
  fill_tiled(s.v, s.num_blocks * blk_bytes, d, fp8, 2, blk_bytes);
  if (fp8) {
    // scale bytes 2^-6 .. 2^-3
    fill_tiled(s.ks, s.num_blocks * blk_scales, d, true, 3, blk_scales);
    fill_tiled(s.vs, s.num_blocks * blk_scales, d, true, 4, blk_scales);
    for (Tiled* t : {&s.ks, &s.vs}) {
      for (auto& b : t->pattern) b = static_cast<uint8_t>(121 + b % 4);
      Buffer src = Buffer::from_host(t->pattern, d);
      for (size_t off = 0; off < t->dev.size(); off += t->pattern.size())
        copy_bytes(static_cast<uint8_t*>(t->dev.data()) + off, d, src.data(), d, std::min(t->pattern.size(), t->dev.size() - off));
    }
  }
  // Each copy's sequences get a shuffled set of blocks (a fragmented pool).
  std::vector<int32_t> perm(s.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
  const int64_t per_copy = batch * s.blocks_per_seq;
  for (int64_t c = 0; c < s.copies; ++c) {
    s.indices.emplace_back(perm.begin() + c * per_copy, perm.begin() + (c + 1) * per_copy);
    s.indices_dev.push_back(Buffer::from_host(s.indices.back(), d));
  }
  std::vector<int32_t> ip(batch + 1), lp(batch, static_cast<int32_t>(ctx - (s.blocks_per_seq - 1) * kBlock));
  for (int64_t b = 0; b <= batch; ++b) ip[b] = static_cast<int32_t>(b * s.blocks_per_seq);
  s.indptr = Buffer::from_host(ip, d);
  s.lpl = Buffer::from_host(lp, d);
  std::vector<float> hq(batch * kQHeads * kHeadDim);
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : hq) x = u(rng);
  s.q = Buffer::from_host(hq, d);
  s.out = Buffer(hq.size() * 4, d);
  const DType t = fp8 ? DType::E4M3 : DType::F16;
  s.kv.k = TensorRef(s.k.dev.data(), t, d, {s.num_blocks, kBlock, kKvHeads, kHeadDim});
  s.kv.v = TensorRef(s.v.dev.data(), t, d, {s.num_blocks, kBlock, kKvHeads, kHeadDim});
  if (fp8) {
    s.kv.k_scale = TensorRef(s.ks.dev.data(), DType::UE8M0, d, {s.num_blocks, kBlock, kKvHeads, kHeadDim / 64});
    s.kv.v_scale = TensorRef(s.vs.dev.data(), DType::UE8M0, d, {s.num_blocks, kBlock, kKvHeads, kHeadDim / 64});
  }
  if (rope) {  // block i of every sequence holds positions i * 16 .. i * 16 + 15
    std::vector<int32_t> pos(s.num_blocks * kBlock);
    for (int64_t c = 0; c < s.copies; ++c)
      for (int64_t i = 0; i < per_copy; ++i)
        for (int64_t j = 0; j < kBlock; ++j)
          pos[s.indices[c][i] * kBlock + j] = static_cast<int32_t>((i % s.blocks_per_seq) * kBlock + j);
    s.pos = Buffer::from_host(pos, d);
    s.valid = Buffer::from_host(std::vector<uint8_t>(pos.size(), 1), d);
    s.kv.positions = TensorRef(s.pos.data(), DType::I32, d, {s.num_blocks, kBlock});
    s.kv.valid = TensorRef(s.valid.data(), DType::U8, d, {s.num_blocks, kBlock});
    s.rope_table = std::make_unique<math::RopeTable>(make_rope_table(RopeSpec::llama3_8b(), kHeadDim));
    s.kv.rope_mode = RopeMode::RopeOnRead;
    s.kv.maybe_rope = s.rope_table.get();
    s.qpos = Buffer::from_host(std::vector<int32_t>(batch, static_cast<int32_t>(ctx)), d);
  }
  for (int64_t c = 0; c < s.copies; ++c) {
    s.tables.push_back({TensorRef(s.indptr.data(), DType::I32, d, {batch + 1}),
                        TensorRef(s.indices_dev[c].data(), DType::I32, d, {per_copy}),
                        TensorRef(s.lpl.data(), DType::I32, d, {batch}), TensorRef()});
    AttentionStep st;
    st.table = s.tables.back();
    if (rope) st.q_positions = TensorRef(s.qpos.data(), DType::I32, d, {batch});
    s.steps.push_back(st);
  }
  s.q_ref = TensorRef(s.q.data(), DType::F32, d, {batch, kQHeads, kHeadDim});
  s.out_ref = TensorRef(s.out.data(), DType::F32, d, {batch, kQHeads, kHeadDim});
  return s;
}

}  // namespace kvcore::cli::llama8b
