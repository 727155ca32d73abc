/* What the C programs over the C API share: a failure counter with CHECK, and a compact
 * row-major host DLTensor over caller memory. C99, header-only (each program is one file). */
#ifndef KVCORE_TESTS_C_CHECK_H
#define KVCORE_TESTS_C_CHECK_H
#include <kvcore/kvcore.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, "\n");                              \
      ++failures;                                         \
    }                                                     \
  } while (0)

static DLTensor host_tensor(void* data, uint8_t code, uint8_t bits, int ndim, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = code;
  t.dtype.bits = bits;
  t.dtype.lanes = 1;
  t.shape = shape; /* strides NULL: compact row-major */
  return t;
}

#endif
