// NcclTransport: a Transport over NCCL point-to-point (grouped ncclSend / ncclRecv) between two
// GPUs, in two processes (each calls connect() with the id one of them made) or in one
// (connect_local()). Built when CMake finds NCCL beside CUDA (KVCORE_NCCL); otherwise every
// factory throws NotSupported and nccl_compiled() is false.
//
// NVLink SHARP (NVLS) is kept off: connect() sets NCCL_NVLS_ENABLE=0 in the environment before
// the communicator is made (point-to-point never needs multicast objects, and none are made).
// Communicators are non-blocking: every NCCL call and every wait polls ncclCommGetAsyncError and
// the group's CUDA event, and after timeout_s without completion (a dead or stuck peer) aborts
// the communicator (ncclCommAbort) and throws DeviceError; the endpoint is then broken.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <utility>

#include "kvcore/stream.hpp"
#include "kvcore/transfer/transport.hpp"

namespace kvcore {

bool nccl_compiled();

// ncclUniqueId as bytes: made by one process (nccl_unique_id()), passed to the other by the engine.
struct NcclId {
  std::array<uint8_t, 128> bytes{};
};
NcclId nccl_unique_id();

struct NcclTransportOptions {
  double timeout_s = 60.0;  // connect and every wait
  Stream stream;            // the stream the sends and receives run on; default: one made per endpoint
};

class NcclTransport final : public Transport {
 public:
  // This process's end of a two-rank communicator: rank 0 or 1, its peer is the other rank.
  static std::unique_ptr<NcclTransport> connect(const NcclId& id, int rank, Device device,
                                                const NcclTransportOptions& options = {});
  // Both ends in this process, rank 0 on `a`, rank 1 on `b` (distinct CUDA devices); drive them
  // from two threads.
  static std::pair<std::unique_ptr<NcclTransport>, std::unique_ptr<NcclTransport>> connect_local(
      Device a, Device b, const NcclTransportOptions& options = {});
  ~NcclTransport() override;  // aborts a broken communicator, else finalizes and destroys it

  Device device() const override;
  uint64_t post(std::span<const TransferOp> ops) override;
  void wait(uint64_t group) override;
  uint64_t posted() const override;
  void abort() noexcept override;

  struct Impl;

 private:
  explicit NcclTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcore
