// The rule that picks shift_dense's CUDA kernel (src/cuda/shift/shift_kernel_choice.hpp).
#include <gtest/gtest.h>

#include "cuda/shift/shift_kernel_choice.hpp"

using namespace kvcore::ops::cuda;

TEST(ShiftKernelChoice, RuleWithoutForcing) {
  for (bool overlap : {false, true})
    for (bool dsv4 : {false, true})
      EXPECT_EQ(choose_shift_kernel(ShiftKernel::Auto, {.any_fp8_keys = true, .overlap = overlap, .any_dsv4_rows = dsv4}),
                ShiftKernel::Chain);
  EXPECT_EQ(choose_shift_kernel(ShiftKernel::Auto, {.any_fp8_keys = false, .overlap = true}), ShiftKernel::Single);
  EXPECT_EQ(choose_shift_kernel(ShiftKernel::Auto, {.any_fp8_keys = false, .overlap = false, .any_dsv4_rows = true}),
            ShiftKernel::Single);
  EXPECT_EQ(choose_shift_kernel(ShiftKernel::Auto, {.any_fp8_keys = false, .overlap = true, .any_dsv4_rows = true}),
            ShiftKernel::Single);
  EXPECT_EQ(choose_shift_kernel(ShiftKernel::Auto, {.any_fp8_keys = false, .overlap = false}), ShiftKernel::Sweep);
}

TEST(ShiftKernelChoice, ForcingWinsEverywhere) {
  for (bool fp8 : {false, true})
    for (bool overlap : {false, true})
      for (ShiftKernel k : {ShiftKernel::Chain, ShiftKernel::Single, ShiftKernel::Sweep})
        EXPECT_EQ(choose_shift_kernel(k, {.any_fp8_keys = fp8, .overlap = overlap}), k);
}
