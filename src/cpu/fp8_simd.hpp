// SIMD paths of the fp8 pack / unpack / round-trip row codecs on the CPU (Highway, every
// target of simd_config.hpp): the scalar kernels' bytes. They serve rows whose
// values, codes and tails are contiguous (column stride 1).
#pragma once
#include "ops/fp8_params.hpp"

namespace kvcore::ops::cpu {
bool fp8_simd_serves(const Fp8PackParams& p);
bool fp8_simd_serves(const Fp8UnpackParams& p);
void fp8_pack_rows_simd(const Fp8PackParams& p);
void fp8_unpack_rows_simd(const Fp8UnpackParams& p);
bool fp8_simd_serves(const Fp8RoundTripParams& p);
void fp8_round_trip_rows_simd(const Fp8RoundTripParams& p);
}  // namespace kvcore::ops::cpu
