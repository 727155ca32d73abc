// Stream: an opaque CUDA stream handle (a cudaStream_t stored as void*), so
// the public API carries streams without pulling CUDA headers into CPU-only
// users. The default-constructed stream is CUDA's default stream; CPU ops
// ignore it.
//
// Thread safety: a plain handle; ordering work on one stream from several threads is
// the caller's business, as with CUDA streams.
#pragma once

namespace kvcore {

struct Stream {
  void* handle = nullptr;
  static Stream from_native(void* cuda_stream) { return Stream{cuda_stream}; }
};

}  // namespace kvcore
