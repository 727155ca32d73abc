// Umbrella header: the whole public API.
#pragma once
#include "kvcore/buffer.hpp"
#include "kvcore/device.hpp"
#include "kvcore/dtype.hpp"
#include "kvcore/error.hpp"
#include "kvcore/math/rope_spec.hpp"
#include "kvcore/runtime.hpp"
#include "kvcore/stream.hpp"
#include "kvcore/tensor.hpp"
