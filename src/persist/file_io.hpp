// Files for persistence: crash-safe replacement (temporary file, fsync, rename, fsync of the
// directory) and whole-file reads. Failures throw kvcore::Error naming the path and the
// system's reason: OutOfMemory when the disk is full (ENOSPC, EDQUOT), DeviceError otherwise.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvcore::persist {

// Writes the concatenation of `pieces` to `path` atomically. On failure `path` is untouched and
// the temporary file removed. durable false skips both fsyncs (a cache that may lose recent
// values on a power cut, but never holds a torn one).
void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> pieces, bool durable = true);
// The whole file; InvalidArgument when it cannot be opened.
std::vector<uint8_t> read_file(const std::string& path);

}  // namespace kvcore::persist
