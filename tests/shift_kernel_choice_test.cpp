// The rule that picks shift_dense's CUDA kernel (src/cuda/shift_kernel_choice.hpp).
#include <gtest/gtest.h>

#include "cuda/shift_kernel_choice.hpp"

using namespace kvcore::cuda;

TEST(ShiftKernelChoice, EnvironmentValuesParse) {
  EXPECT_EQ(parse_shift_kernel("flat"), ShiftKernel::Flat);
  EXPECT_EQ(parse_shift_kernel("chain"), ShiftKernel::Chain);
  EXPECT_EQ(parse_shift_kernel("single"), ShiftKernel::Single);
  EXPECT_EQ(parse_shift_kernel("pipelined"), ShiftKernel::Pipelined);
  EXPECT_EQ(parse_shift_kernel("sweep"), ShiftKernel::Sweep);
  EXPECT_EQ(parse_shift_kernel("sweep_cs"), ShiftKernel::SweepCs);
  EXPECT_EQ(parse_shift_kernel("sweep_b8"), ShiftKernel::SweepB8);
  EXPECT_EQ(parse_shift_kernel("sweep_dyn"), ShiftKernel::SweepDyn);
  EXPECT_EQ(sweep_variant(ShiftKernel::Sweep), 0);
  EXPECT_EQ(sweep_variant(ShiftKernel::SweepDyn), 3);
  EXPECT_FALSE(parse_shift_kernel(nullptr).has_value());
  EXPECT_FALSE(parse_shift_kernel("").has_value());
  EXPECT_FALSE(parse_shift_kernel("Chain").has_value());
}

TEST(ShiftKernelChoice, MeasuredRuleWithoutForcing) {
  EXPECT_EQ(choose_shift_kernel(std::nullopt, {.any_fp8_keys = true, .overlap = false}), ShiftKernel::Chain);
  EXPECT_EQ(choose_shift_kernel(std::nullopt, {.any_fp8_keys = true, .overlap = true}), ShiftKernel::Chain);
  EXPECT_EQ(choose_shift_kernel(std::nullopt, {.any_fp8_keys = false, .overlap = true}), ShiftKernel::Single);
  EXPECT_EQ(choose_shift_kernel(std::nullopt, {.any_fp8_keys = false, .overlap = false}), ShiftKernel::Single);
}

TEST(ShiftKernelChoice, ForcingWinsEverywhere) {
  for (bool fp8 : {false, true})
    for (bool overlap : {false, true})
      for (ShiftKernel k : {ShiftKernel::Flat, ShiftKernel::Chain, ShiftKernel::Single, ShiftKernel::Pipelined,
                            ShiftKernel::Sweep, ShiftKernel::SweepCs, ShiftKernel::SweepB8, ShiftKernel::SweepDyn})
        EXPECT_EQ(choose_shift_kernel(k, {.any_fp8_keys = fp8, .overlap = overlap}), k);
}
