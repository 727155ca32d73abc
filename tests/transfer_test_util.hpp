// Shared by the KV transfer tests (CPU and CUDA): run both ends of a transfer on two threads,
// compare sequences bit for bit and through attention, capture what a failed receive must keep.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "cache/paged_export.hpp"
#include "kvcore/buffer.hpp"
#include "kvcore/error.hpp"
#include "kvcore/ops/attention.hpp"
#include "kvcore/transfer/transfer.hpp"
#include "paged_model.hpp"

namespace transfer_test {

using namespace kvcore;

inline std::vector<int32_t> iota_from(int32_t first, int32_t n) {
  std::vector<int32_t> p(n);
  for (int32_t i = 0; i < n; ++i) p[i] = first + i;
  return p;
}

inline void append_random(PagedCache& c, SeqId id, int32_t n, std::mt19937_64& rng) {
  const PagedCacheConfig& cfg = c.config();
  const int32_t first = c.info(id).last_position + 1;
  paged_test::Source k = paged_test::make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.head_dim, DType::F32, c.device(), false);
  paged_test::Source v = cfg.v_head_dim ? paged_test::make_source(rng, cfg.n_layers, n, cfg.n_kv_heads, cfg.v_head_dim,
                                                                  DType::F32, c.device(), false)
                                        : paged_test::Source{};
  c.append(id, iota_from(first, n), k.tensor, v.tensor);
}

// A plain sequence, a fork of it extended (shares its full blocks), a shifted one, and a
// truncated one (stale bytes past its span on the sender).
inline std::vector<SeqId> fill(PagedCache& c, std::mt19937_64& rng) {
  const SeqId a = c.create();
  append_random(c, a, 21, rng);
  const SeqId f = c.fork(a);
  append_random(c, f, 5, rng);
  const SeqId s = c.create();
  append_random(c, s, 30, rng);
  c.shift(s, 3, 9);
  const SeqId t = c.create();
  append_random(c, t, 19, rng);
  c.truncate(t, 11);
  return {a, f, s, t};
}

// Runs `send` on a second thread and `receive` here; returns the exceptions each threw.
struct BothEnds {
  std::exception_ptr send_error, receive_error;
};
inline BothEnds run_both(const std::function<void()>& send, const std::function<void()>& receive) {
  BothEnds r;
  std::thread t([&] {
    try {
      send();
    } catch (...) {
      r.send_error = std::current_exception();
    }
  });
  try {
    receive();
  } catch (...) {
    r.receive_error = std::current_exception();
  }
  t.join();
  return r;
}

inline std::optional<ErrorCode> code_of(const std::exception_ptr& e) {
  if (!e) return std::nullopt;
  try {
    std::rethrow_exception(e);
  } catch (const Error& k) {
    return k.code();
  } catch (...) {
    return ErrorCode::DeviceError;  // not a kvcore::Error: counted as a failure all the same
  }
}

inline std::string message_of(const std::exception_ptr& e) {
  if (!e) return "(none)";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& k) {
    return k.what();
  }
}

// Everything a failed receive must leave as it was: host metadata, and every pool byte, cell
// position and validity of every used block (free blocks' bytes are not part of the state).
struct UsedState {
  std::string meta;
  std::vector<uint8_t> payload;
  std::vector<int32_t> positions;
  std::vector<uint8_t> valid;
  bool operator==(const UsedState&) const = default;
};
inline UsedState used_state(PagedCache& c) {
  UsedState s;
  s.meta = c.debug_state();
  const std::vector<SeqId> all = c.sequences();
  const PagedExport ex = paged_export(c, all);
  s.payload = ex.payload;
  s.positions = ex.positions;
  s.valid = ex.valid;
  return s;
}

// One sequence's export (payload bytes, positions, validity, spans): equal for a sequence and its
// received copy, whatever block ids each cache gave it.
inline ::testing::AssertionResult same_sequence_bytes(PagedCache& a, SeqId sa, PagedCache& b, SeqId sb) {
  const SeqId ia[1] = {sa}, ib[1] = {sb};
  const PagedExport x = paged_export(a, ia), y = paged_export(b, ib);
  if (x.seqs[0].n_cells != y.seqs[0].n_cells || x.seqs[0].n_live != y.seqs[0].n_live)
    return ::testing::AssertionFailure() << "cell counts differ";
  if (x.seqs[0].blocks != y.seqs[0].blocks) return ::testing::AssertionFailure() << "block structure differs";
  if (x.positions != y.positions) return ::testing::AssertionFailure() << "positions differ";
  if (x.valid != y.valid) return ::testing::AssertionFailure() << "validity differs";
  if (x.payload != y.payload) return ::testing::AssertionFailure() << "pool bytes differ";
  return ::testing::AssertionSuccess();
}

// Decode attention of one query row over every layer of `seq`: f32 [layers][n_q_heads * head_dim].
inline std::vector<std::vector<float>> attention_over(PagedCache& c, SeqId seq, int32_t n_q_heads, uint64_t seed) {
  const PagedCacheConfig& cfg = c.config();
  const Device dev = c.device();
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(n_q_heads) * cfg.head_dim);
  for (float& x : q) x = nd(rng);
  const Buffer qb = Buffer::from_host(q, dev);
  Buffer out(q.size() * sizeof(float), dev), tables;
  const std::vector<int32_t> pos = {c.info(seq).last_position + 1};
  const Buffer pb = Buffer::from_host(pos, dev);
  AttentionStep st;
  st.table = c.block_tables({&seq, 1}, tables);
  st.q_positions = TensorRef(pb.data(), DType::I32, dev, {1});
  const AttentionPlan plan = AttentionPlan::decode(c.paged_kv(0), n_q_heads, st);
  std::vector<std::vector<float>> outs;
  for (int32_t l = 0; l < cfg.n_layers; ++l) {
    plan.run(TensorRef(qb.data(), DType::F32, dev, {1, n_q_heads, cfg.head_dim}), c.paged_kv(l),
             TensorRef(out.data(), DType::F32, dev, {1, n_q_heads, cfg.head_dim}));
    outs.push_back(out.to_host<float>());
  }
  return outs;
}

}  // namespace transfer_test
