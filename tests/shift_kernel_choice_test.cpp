// The rule that picks shift_dense's CUDA kernel (src/cuda/shift/shift_kernel_choice.hpp).
#include <gtest/gtest.h>

#include "cuda/shift/shift_kernel_choice.hpp"

using namespace kvcore::cuda;

TEST(ShiftKernelChoice, EnvironmentValuesParse) {
  EXPECT_EQ(parse_shift_kernel("flat"), ShiftKernel::Flat);
  EXPECT_EQ(parse_shift_kernel("chain"), ShiftKernel::Chain);
  EXPECT_EQ(parse_shift_kernel("single"), ShiftKernel::Single);
  EXPECT_EQ(parse_shift_kernel("pipelined"), ShiftKernel::Pipelined);
  EXPECT_EQ(parse_shift_kernel("sweep"), ShiftKernel::Sweep);
  EXPECT_EQ(parse_shift_kernel("sweep_dyn"), ShiftKernel::SweepDyn);
  EXPECT_FALSE(parse_shift_kernel("sweep_cs").has_value());  // measured, dropped (run B)
  EXPECT_FALSE(parse_shift_kernel(nullptr).has_value());
  EXPECT_FALSE(parse_shift_kernel("").has_value());
  EXPECT_FALSE(parse_shift_kernel("Chain").has_value());
}

TEST(ShiftKernelChoice, MeasuredRuleWithoutForcing) {
  for (bool overlap : {false, true})
    for (bool dsv4 : {false, true})
      EXPECT_EQ(choose_shift_kernel(std::nullopt, {.any_fp8_keys = true, .overlap = overlap, .any_dsv4_rows = dsv4}),
                ShiftKernel::Chain);
  EXPECT_EQ(choose_shift_kernel(std::nullopt, {.any_fp8_keys = false, .overlap = true}), ShiftKernel::Single);
  EXPECT_EQ(choose_shift_kernel(std::nullopt, {.any_fp8_keys = false, .overlap = false, .any_dsv4_rows = true}),
            ShiftKernel::Single);
  EXPECT_EQ(choose_shift_kernel(std::nullopt, {.any_fp8_keys = false, .overlap = true, .any_dsv4_rows = true}),
            ShiftKernel::Single);
  EXPECT_EQ(choose_shift_kernel(std::nullopt, {.any_fp8_keys = false, .overlap = false}), ShiftKernel::SweepDyn);
}

TEST(ShiftKernelChoice, ForcingWinsEverywhere) {
  for (bool fp8 : {false, true})
    for (bool overlap : {false, true})
      for (ShiftKernel k : {ShiftKernel::Flat, ShiftKernel::Chain, ShiftKernel::Single, ShiftKernel::Pipelined,
                            ShiftKernel::Sweep, ShiftKernel::SweepDyn})
        EXPECT_EQ(choose_shift_kernel(k, {.any_fp8_keys = fp8, .overlap = overlap}), k);
}
