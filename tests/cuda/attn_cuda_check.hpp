// The check every CUDA paged-attention case makes (tests/cuda/attn_decode_test.cu,
// attn_head_dims_cuda_test.cpp): the CPU op against the float64 reference, then the CUDA op
// with the automatic kernel at each split count and each forced kernel variant (the two SIMT
// kernels; for prefill rows also the tensor-core prefill kernel), against both.
// Tolerances (relative to max(1, max |ref|)): f32 outputs 3e-5 (rope-on-read 2e-4: f32 sincos of
// angles up to ~1e3 rad on both sides), f16 outputs 1e-3, bf16 outputs 8e-3 (one output rounding).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "attention_test_util.hpp"

namespace attn_test {

inline double cuda_tol(const CaseSpec& s) {
  if (s.out == DType::BF16) return 8e-3;
  if (s.out == DType::F16) return 1e-3;
  return s.rope_on_read ? 2e-4 : 3e-5;
}

// Runs the case; `worst` takes the largest relative error against float64 seen.
inline void check_cuda_case(const CaseSpec& s, const std::vector<int>& splits, double& worst) {
  const HostCase c = make_case(s);
  const std::vector<float> cpu = run_op(c, Device::cpu());
  const std::vector<double> ref = reference(c);
  EXPECT_LE(max_rel_err(cpu, ref), cuda_tol(s));
  const int n_split_runs = static_cast<int>(splits.size());
  const std::vector<int> variants = s.q_tokens.empty() ? std::vector<int>{1, 2} : std::vector<int>{1, 2, 4};
  for (int run = 0; run < n_split_runs + static_cast<int>(variants.size()); ++run) {
    const int sp = run < n_split_runs ? splits[run] : 0;
    const int variant = run < n_split_runs ? 0 : variants[run - n_split_runs];
    const std::vector<float> gpu = run_op(c, Device::cuda(0), sp, nullptr, variant);
    const double e_cpu = max_rel_err(gpu, cpu), e_ref = max_rel_err(gpu, ref);
    worst = std::max(worst, e_ref);
    EXPECT_LE(e_cpu, cuda_tol(s)) << "vs CPU: kv " << dtype_name(s.kv) << " D " << s.head_dim << " DV " << s.dv() << " heads "
                                  << s.n_q_heads << "/" << s.n_kv_heads << " splits " << sp << " variant " << variant;
    EXPECT_LE(e_ref, cuda_tol(s)) << "vs f64: kv " << dtype_name(s.kv) << " D " << s.head_dim << " DV " << s.dv()
                                  << " splits " << sp << " variant " << variant;
  }
}

}  // namespace attn_test
