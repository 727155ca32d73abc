// NcclTransport (kvcore/transfer/nccl_transport.hpp): non-blocking NCCL communicators, one CUDA
// event per posted group, every wait a poll of the event and of ncclCommGetAsyncError under a
// deadline; a failure or the deadline aborts the communicator before throwing, so no transfer
// kernel outlives the error (buffers can then be freed without waiting on a stuck peer).
#include "kvcore/transfer/nccl_transport.hpp"

#include "kvcore/error.hpp"

#if KVCORE_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#endif

namespace kvcore {

#if KVCORE_WITH_NCCL

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void throw_nccl(ncclResult_t r, const char* what, ncclComm_t comm) {
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  throw Error(ErrorCode::DeviceError, detail::concat("nccl transport: ", what, " failed: ", ncclGetErrorString(r),
                                                     last && *last ? std::string(" (") + last + ")" : std::string()));
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::DeviceError, detail::concat("nccl transport: ", what, " failed: ", cudaGetErrorString(e)));
}

// NVLink SHARP stays off: point-to-point needs no multicast objects, and none may be made.
void nvls_off() { setenv("NCCL_NVLS_ENABLE", "0", 1); }

ncclConfig_t nonblocking_config() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  return c;
}

}  // namespace

struct NcclTransport::Impl {
  ncclComm_t comm = nullptr;
  Device device;
  int peer = 0;
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  double timeout_s = 60;
  std::deque<cudaEvent_t> events;  // events[i]: group completed + i + 1
  uint64_t posted = 0, completed = 0;
  bool broken = false;
  std::string why;

  void fail(const std::string& w) {
    if (!broken) {
      broken = true;
      why = w;
      if (comm) ncclCommAbort(comm);
      comm = nullptr;
    }
  }
  void check_usable() const {
    require(!broken, ErrorCode::DeviceError, "nccl transport: the endpoint is broken (", why, ")");
  }
  // Polls the communicator's state until it leaves ncclInProgress; fails on error or deadline.
  void settle(const char* what, Clock::time_point deadline) {
    while (true) {
      ncclResult_t st = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &st);
      if (r != ncclSuccess) st = r;
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        const std::string msg = detail::concat(what, ": ", ncclGetErrorString(st));
        fail(msg);
        throw Error(ErrorCode::DeviceError, "nccl transport: " + msg);
      }
      if (Clock::now() > deadline) {
        const std::string msg = detail::concat(what, " timed out after ", timeout_s, " s");
        fail(msg);
        throw Error(ErrorCode::DeviceError, "nccl transport: " + msg);
      }
      std::this_thread::yield();
    }
  }
  Clock::time_point deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  }
  ~Impl() {
    if (comm) {
      if (broken) {
        ncclCommAbort(comm);
      } else {
        ncclResult_t st = ncclCommFinalize(comm);  // flushes, then ncclInProgress until done
        const auto end = deadline();
        while (st == ncclInProgress && Clock::now() < end) {
          if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) break;
          std::this_thread::yield();
        }
        if (st == ncclSuccess) ncclCommDestroy(comm);
        else ncclCommAbort(comm);
      }
    }
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (own_stream && stream) cudaStreamDestroy(stream);
  }
};

bool nccl_compiled() { return true; }

NcclId nccl_unique_id() {
  nvls_off();
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) throw_nccl(r, "ncclGetUniqueId", nullptr);
  NcclId out;
  static_assert(sizeof(id.internal) == sizeof(out.bytes));
  std::memcpy(out.bytes.data(), id.internal, sizeof(id.internal));
  return out;
}

namespace {

std::unique_ptr<NcclTransport::Impl> make_impl(Device device, int rank, const NcclTransportOptions& o) {
  require_arg(device.is_cuda(), "NcclTransport: device ", device.str(), " is not a CUDA device");
  require_arg(rank == 0 || rank == 1, "NcclTransport: rank ", rank, " is not 0 or 1");
  require_arg(o.timeout_s > 0, "NcclTransport: timeout_s ", o.timeout_s, " must be positive");
  auto m = std::make_unique<NcclTransport::Impl>();
  m->device = device;
  m->peer = 1 - rank;
  m->timeout_s = o.timeout_s;
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  if (o.stream.handle) {
    m->stream = static_cast<cudaStream_t>(o.stream.handle);
  } else {
    check_cuda(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    m->own_stream = true;
  }
  return m;
}

}  // namespace

std::unique_ptr<NcclTransport> NcclTransport::connect(const NcclId& id, int rank, Device device,
                                                      const NcclTransportOptions& options) {
  std::unique_ptr<Impl> m = make_impl(device, rank, options);
  nvls_off();
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.bytes.data(), sizeof(uid.internal));
  ncclConfig_t cfg = nonblocking_config();
  const ncclResult_t r = ncclCommInitRankConfig(&m->comm, 2, uid, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) throw_nccl(r, "ncclCommInitRankConfig", nullptr);
  m->settle("ncclCommInitRankConfig", m->deadline());
  return std::unique_ptr<NcclTransport>(new NcclTransport(std::move(m)));
}

std::pair<std::unique_ptr<NcclTransport>, std::unique_ptr<NcclTransport>> NcclTransport::connect_local(
    Device a, Device b, const NcclTransportOptions& options) {
  require_arg(a.is_cuda() && b.is_cuda() && a.index != b.index, "NcclTransport::connect_local: devices ", a.str(), " and ",
              b.str(), " must be two distinct CUDA devices");
  std::unique_ptr<Impl> m0 = make_impl(a, 0, options), m1 = make_impl(b, 1, options);
  nvls_off();
  const NcclId id = nccl_unique_id();
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.bytes.data(), sizeof(uid.internal));
  ncclConfig_t cfg = nonblocking_config();
  // Two ranks from one thread: both inits in one group.
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) throw_nccl(r, "ncclGroupStart", nullptr);
  check_cuda(cudaSetDevice(a.index), "cudaSetDevice");
  r = ncclCommInitRankConfig(&m0->comm, 2, uid, 0, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) throw_nccl(r, "ncclCommInitRankConfig (rank 0)", nullptr);
  check_cuda(cudaSetDevice(b.index), "cudaSetDevice");
  r = ncclCommInitRankConfig(&m1->comm, 2, uid, 1, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) throw_nccl(r, "ncclCommInitRankConfig (rank 1)", nullptr);
  r = ncclGroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) throw_nccl(r, "ncclGroupEnd (init)", nullptr);
  m0->settle("ncclCommInitRankConfig (rank 0)", m0->deadline());
  m1->settle("ncclCommInitRankConfig (rank 1)", m1->deadline());
  return {std::unique_ptr<NcclTransport>(new NcclTransport(std::move(m0))),
          std::unique_ptr<NcclTransport>(new NcclTransport(std::move(m1)))};
}

NcclTransport::NcclTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclTransport::~NcclTransport() = default;

Device NcclTransport::device() const { return impl_->device; }
uint64_t NcclTransport::posted() const { return impl_->posted; }

uint64_t NcclTransport::post(std::span<const TransferOp> ops) {
  Impl& m = *impl_;
  m.check_usable();
  for (const TransferOp& op : ops)
    require_arg(op.bytes == 0 || op.data != nullptr, "nccl transport: an op of ", op.bytes, " bytes has no buffer");
  check_cuda(cudaSetDevice(m.device.index), "cudaSetDevice");
  cudaEvent_t ev = nullptr;
  check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  try {
    const auto end = m.deadline();
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) throw_nccl(r, "ncclGroupStart", m.comm);
    for (const TransferOp& op : ops) {
      if (op.bytes == 0) continue;
      r = op.kind == TransferOp::Send ? ncclSend(op.data, op.bytes, ncclUint8, m.peer, m.comm, m.stream)
                                      : ncclRecv(op.data, op.bytes, ncclUint8, m.peer, m.comm, m.stream);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();
        m.fail(ncclGetErrorString(r));
        throw_nccl(r, op.kind == TransferOp::Send ? "ncclSend" : "ncclRecv", nullptr);
      }
    }
    r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
      m.fail(ncclGetErrorString(r));
      throw_nccl(r, "ncclGroupEnd", nullptr);
    }
    m.settle("ncclGroupEnd", end);
    check_cuda(cudaEventRecord(ev, m.stream), "cudaEventRecord");
  } catch (...) {
    cudaEventDestroy(ev);
    throw;
  }
  m.events.push_back(ev);
  return ++m.posted;
}

void NcclTransport::wait(uint64_t group) {
  Impl& m = *impl_;
  require_arg(group <= m.posted, "nccl transport: wait(", group, ") but only ", m.posted, " groups were posted");
  m.check_usable();
  const auto end = m.deadline();
  while (m.completed < group) {
    const cudaError_t e = cudaEventQuery(m.events.front());
    if (e == cudaSuccess) {
      cudaEventDestroy(m.events.front());
      m.events.pop_front();
      ++m.completed;
      continue;
    }
    if (e != cudaErrorNotReady) {
      m.fail(cudaGetErrorString(e));
      check_cuda(e, "cudaEventQuery");
    }
    ncclResult_t st = ncclSuccess;
    ncclCommGetAsyncError(m.comm, &st);
    if (st != ncclSuccess && st != ncclInProgress) {
      const std::string msg = detail::concat("a transfer failed: ", ncclGetErrorString(st));
      m.fail(msg);
      throw Error(ErrorCode::DeviceError, "nccl transport: " + msg);
    }
    if (Clock::now() > end) {
      const std::string msg = detail::concat("a transfer did not complete in ", m.timeout_s, " s (the peer is gone or stuck)");
      m.fail(msg);
      throw Error(ErrorCode::DeviceError, "nccl transport: " + msg);
    }
    std::this_thread::yield();
  }
}

void NcclTransport::abort() noexcept { impl_->fail("aborted"); }

#else  // built without NCCL

struct NcclTransport::Impl {};

namespace {
[[noreturn]] void no_nccl() {
  throw Error(ErrorCode::NotSupported, "NcclTransport: this kvcore was built without NCCL (KVCORE_NCCL)");
}
}  // namespace

bool nccl_compiled() { return false; }
NcclId nccl_unique_id() { no_nccl(); }
std::unique_ptr<NcclTransport> NcclTransport::connect(const NcclId&, int, Device, const NcclTransportOptions&) { no_nccl(); }
std::pair<std::unique_ptr<NcclTransport>, std::unique_ptr<NcclTransport>> NcclTransport::connect_local(
    Device, Device, const NcclTransportOptions&) {
  no_nccl();
}
NcclTransport::NcclTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclTransport::~NcclTransport() = default;
Device NcclTransport::device() const { no_nccl(); }
uint64_t NcclTransport::post(std::span<const TransferOp>) { no_nccl(); }
void NcclTransport::wait(uint64_t) { no_nccl(); }
uint64_t NcclTransport::posted() const { no_nccl(); }
void NcclTransport::abort() noexcept {}

#endif

}  // namespace kvcore
