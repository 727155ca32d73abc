#include <cstdio>
#include <kvcore/kvcore.hpp>
#include <kvcore/math/fp8.hpp>

int main() {
  const auto freqs = kvcore::rope_frequencies(kvcore::RopeSpec::llama3_8b());
  const float q = kvcore::math::e4m3_decode(kvcore::math::e4m3_encode(3.3f));
  std::printf("kvcore %s: %zu frequencies, e4m3(3.3) = %g\n", kvcore::version(), freqs.size(), q);
  return (freqs.size() == 64 && q == 3.25f) ? 0 : 1;
}
