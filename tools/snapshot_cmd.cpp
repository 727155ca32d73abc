// `kvcore snapshot inspect FILE`: what a snapshot holds, after checking every checksum.
#include <cstdio>
#include <string>

#include "kvcore/error.hpp"
#include "kvcore/persist/snapshot.hpp"

namespace kvcore::cli {

int run_snapshot_inspect(const std::string& path) {
  const SnapshotSummary s = snapshot_inspect(read_file_bytes(path));
  std::printf("%s: %s", path.c_str(), snapshot_describe(s).c_str());
  return 0;
}

}  // namespace kvcore::cli
