// A planned attention run allocates nothing on the host: its checks and Params fill
// (ops::attn::run_params) are counted here with a replaced global operator new, which is why
// this test is its own executable. (The CPU kernel's own scratch is the backend's business;
// on CUDA the run's launches use the plan's workspace.)
// GCC pairs the replaced operators by name once they are inlined and warns that free() meets
// operator new: here both are ours and use malloc / free.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "attention_test_util.hpp"

namespace {
std::atomic<long> g_news{0};
}  // namespace

void* operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

using namespace attn_test;

TEST(AttentionRunAllocs, ARunsChecksAndParamsAllocateNothing) {
  for (bool rope : {false, true})
    for (bool prefill : {false, true}) {
      CaseSpec s;
      s.kv = DType::E4M3;
      s.seq_cells = {40, 70};
      s.sinks = true;
      s.window = 20;
      s.rope_on_read = rope;
      if (prefill) s.q_tokens = {5, 9};
      const HostCase c = make_case(s);
      DeviceCase g;
      make_device_case(c, Device::cpu(), g);
      const AttentionPlan plan = g.plan();
      std::vector<float> out(static_cast<size_t>(c.rows) * s.n_q_heads * s.head_dim);
      const TensorRef o(out.data(), DType::F32, Device::cpu(), {c.rows, s.n_q_heads, s.head_dim});
      ops::PagedAttentionParams p{};
      const long before = g_news.load();
      for (int i = 0; i < 10; ++i) ops::attn::run_params(plan, g.q_ref, g.kv, o, g.layer, {}, p);
      EXPECT_EQ(g_news.load() - before, 0) << "rope " << rope << " prefill " << prefill;
      // The counter works: planning allocates (its Impl and workspace).
      const long at_plan = g_news.load();
      (void)g.plan();
      EXPECT_GT(g_news.load() - at_plan, 0);
    }
}
