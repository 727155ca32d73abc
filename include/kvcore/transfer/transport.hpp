// Transport: the byte mover under KV transfer (kvcore/transfer/transfer.hpp). One endpoint of a
// point-to-point link to one peer. The transfer protocol decides what moves; a transport only
// moves buffers of the device it was made for, in order.
//
// Semantics (what NCCL's grouped send/recv give, and what every implementation keeps):
//   - post(ops) starts one group of sends and receives and returns; the group's buffers must stay
//     untouched until it completes. Sends to the peer are matched with the peer's receives in the
//     order both sides posted them, one op to one op, and a matched pair must have equal sizes.
//   - A send's data must be complete when post() is called (the caller synchronizes its producer).
//   - wait(g) returns when group g and every group before it completed; their received bytes are
//     then readable on the transport's device (ordered before any later work the caller issues).
//   - Any failure -- the peer gone, a timeout, a size mismatch, a device error -- throws
//     kvcore::Error (DeviceError, or Corrupt for a size mismatch) and leaves the endpoint broken:
//     every later call throws. Nothing a failed group wrote may be trusted.
//
// Thread safety: one endpoint is driven by one thread at a time; the two ends of a link are
// usually driven by two threads or two processes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvcore/device.hpp"

namespace kvcore {

struct TransferOp {
  enum Kind : uint8_t { Send, Recv };
  Kind kind = Send;
  void* data = nullptr;  // on the transport's device; const for sends
  size_t bytes = 0;
  static TransferOp send(const void* p, size_t n) { return {Send, const_cast<void*>(p), n}; }
  static TransferOp recv(void* p, size_t n) { return {Recv, p, n}; }
};

class Transport {
 public:
  virtual ~Transport() = default;
  // The device every buffer passed to post() lives on.
  virtual Device device() const = 0;
  // Starts one group; returns its number (1, 2, ... in posting order). Empty groups are allowed.
  virtual uint64_t post(std::span<const TransferOp> ops) = 0;
  // Until groups 1..group completed (0: nothing). Throws on any failure (see above).
  virtual void wait(uint64_t group) = 0;
  // Every group posted so far.
  void wait_all() { wait(posted()); }
  virtual uint64_t posted() const = 0;
  // Give up: the endpoint is broken from now on and its peer's pending operations fail (or time
  // out). Safe to call from the thread that drives the endpoint after a failure; idempotent.
  virtual void abort() noexcept = 0;
};

}  // namespace kvcore
