// `kvcore bench ceilings`: the two bandwidth ceilings every other result is compared with.
#include <cstdio>

#include "bench/harness.hpp"
#include "tools/registry.hpp"

KVCORE_BENCH(ceilings, "copy (read+write) and read-only bandwidth of this device") {
  const auto& c = opt.ceilings();
  std::printf("ceilings: copy %.1f GB/s (read+write), read-only %.1f GB/s\n", c.copy_gbps, c.read_gbps);
}
