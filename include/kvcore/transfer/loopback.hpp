// LoopbackTransport: both ends of a link inside one process, for tests and for moving sequences
// between two caches on one device. Rendezvous like NCCL: a send completes when the peer's
// matching receive is posted (the bytes are copied then, with copy_bytes on the link's device);
// the two ends must therefore be driven by two threads. A wait that cannot complete throws
// DeviceError after `timeout_ms`, or at once when the peer aborted or died.
//
// Fault injection, on one end's sends (the n-th send op it posts, counted from 0):
//   DieAtSend     this send and every later one never arrive; the end behaves as a process that
//                 died there (its own waits throw, the peer's pending receives fail)
//   TruncateSend  this send delivers only half its bytes: the receive sees a size mismatch
//   FlipByte      this send arrives with byte `byte` inverted
#pragma once
#include <cstdint>
#include <memory>
#include <utility>

#include "kvcore/transfer/transport.hpp"

namespace kvcore {

struct LoopbackFault {
  enum Kind : uint8_t { None, DieAtSend, TruncateSend, FlipByte };
  Kind kind = None;
  int64_t send_index = 0;
  size_t byte = 0;
};

struct LoopbackLink;  // the shared state of the two ends

class LoopbackTransport final : public Transport {
 public:
  // Two connected ends on `device` (CPU or one CUDA device). Waits give up after timeout_ms.
  static std::pair<std::unique_ptr<LoopbackTransport>, std::unique_ptr<LoopbackTransport>> pair(
      Device device, int64_t timeout_ms = 10000);
  ~LoopbackTransport() override;

  Device device() const override;
  uint64_t post(std::span<const TransferOp> ops) override;
  void wait(uint64_t group) override;
  uint64_t posted() const override;
  void abort() noexcept override;

  void inject(const LoopbackFault& fault);  // before the first post
  int64_t sends_posted() const;             // send ops posted so far (to aim a fault)

 private:
  LoopbackTransport(std::shared_ptr<LoopbackLink> link, int side);
  std::shared_ptr<LoopbackLink> link_;
  int side_;
};

}  // namespace kvcore
