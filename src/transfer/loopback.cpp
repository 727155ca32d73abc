// LoopbackTransport (kvcore/transfer/loopback.hpp): two queues of posted ops per direction,
// matched in order under one mutex by whichever end posts last.
#include "kvcore/transfer/loopback.hpp"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "kvcore/error.hpp"
#include "kvcore/runtime.hpp"

namespace kvcore {

namespace {
struct PendingOp {
  TransferOp op;
  uint64_t group;
  LoopbackFault::Kind fault = LoopbackFault::None;  // sends only
  size_t flip_byte = 0;
};
}  // namespace

struct LoopbackLink {
  Device device;
  int64_t timeout_ms;
  std::mutex mu;
  std::condition_variable cv;
  struct End {
    std::deque<PendingOp> sends, recvs;  // posted by this end, not matched yet
    std::vector<int64_t> open_ops;       // per group (index group - 1): ops not completed
    uint64_t groups = 0;
    int64_t sends_posted = 0;
    LoopbackFault fault;
    bool broken = false;                 // aborted, died or failed
    std::string why;
  } end[2];

  void fail(int side, const std::string& why) {
    if (end[side].broken) return;
    end[side].broken = true;
    end[side].why = why;
  }
  void complete(int side, uint64_t group) { --end[side].open_ops[group - 1]; }

  // Matches the head sends of `from` with the head receives of its peer while both exist.
  void match(int from) {
    End& s = end[from];
    End& r = end[1 - from];
    while (!s.sends.empty() && !r.recvs.empty() && !s.broken && !r.broken) {
      const PendingOp snd = s.sends.front();
      const PendingOp rcv = r.recvs.front();
      s.sends.pop_front();
      r.recvs.pop_front();
      size_t n = snd.op.bytes;
      if (snd.fault == LoopbackFault::TruncateSend) n /= 2;
      if (n != rcv.op.bytes) {
        const std::string why = "loopback transport: a send of " + std::to_string(n) + " bytes met a receive of " +
                                 std::to_string(rcv.op.bytes) + " bytes (truncated or mismatched message)";
        fail(from, why);
        fail(1 - from, why);
        return;
      }
      if (n) copy_bytes(rcv.op.data, device, snd.op.data, device, n);
      if (snd.fault == LoopbackFault::FlipByte && snd.flip_byte < n) {
        uint8_t b = 0;
        uint8_t* p = static_cast<uint8_t*>(rcv.op.data) + snd.flip_byte;
        copy_bytes(&b, Device::cpu(), p, device, 1);
        b = static_cast<uint8_t>(~b);
        copy_bytes(p, device, &b, Device::cpu(), 1);
      }
      if (device.is_cuda()) synchronize(device);
      complete(from, snd.group);
      complete(1 - from, rcv.group);
    }
  }
};

std::pair<std::unique_ptr<LoopbackTransport>, std::unique_ptr<LoopbackTransport>> LoopbackTransport::pair(
    Device device, int64_t timeout_ms) {
  require_arg(timeout_ms > 0, "LoopbackTransport::pair: timeout_ms ", timeout_ms, " must be positive");
  auto link = std::make_shared<LoopbackLink>();
  link->device = device;
  link->timeout_ms = timeout_ms;
  return {std::unique_ptr<LoopbackTransport>(new LoopbackTransport(link, 0)),
          std::unique_ptr<LoopbackTransport>(new LoopbackTransport(link, 1))};
}

LoopbackTransport::LoopbackTransport(std::shared_ptr<LoopbackLink> link, int side) : link_(std::move(link)), side_(side) {}

LoopbackTransport::~LoopbackTransport() { abort(); }

Device LoopbackTransport::device() const { return link_->device; }

void LoopbackTransport::inject(const LoopbackFault& fault) {
  std::lock_guard<std::mutex> g(link_->mu);
  require_arg(link_->end[side_].groups == 0, "LoopbackTransport::inject: faults must be set before the first post");
  require_arg(fault.send_index >= 0, "LoopbackTransport::inject: send_index ", fault.send_index, " is negative");
  link_->end[side_].fault = fault;
}

int64_t LoopbackTransport::sends_posted() const {
  std::lock_guard<std::mutex> g(link_->mu);
  return link_->end[side_].sends_posted;
}

uint64_t LoopbackTransport::posted() const {
  std::lock_guard<std::mutex> g(link_->mu);
  return link_->end[side_].groups;
}

uint64_t LoopbackTransport::post(std::span<const TransferOp> ops) {
  std::unique_lock<std::mutex> g(link_->mu);
  LoopbackLink::End& me = link_->end[side_];
  require(!me.broken, ErrorCode::DeviceError, "loopback transport: the endpoint is broken (", me.why, ")");
  for (const TransferOp& op : ops)
    require_arg(op.bytes == 0 || op.data != nullptr, "loopback transport: an op of ", op.bytes, " bytes has no buffer");
  const uint64_t group = ++me.groups;
  me.open_ops.push_back(static_cast<int64_t>(ops.size()));
  for (const TransferOp& op : ops) {
    PendingOp p{op, group};
    if (op.kind == TransferOp::Send) {
      const int64_t index = me.sends_posted++;
      const LoopbackFault& f = me.fault;
      if (f.kind == LoopbackFault::DieAtSend && index >= f.send_index) {
        link_->fail(side_, "injected fault: the endpoint died at send " + std::to_string(index));
        break;
      }
      if (f.kind != LoopbackFault::None && index == f.send_index) {
        p.fault = f.kind;
        p.flip_byte = f.byte;
      }
      me.sends.push_back(p);
    } else {
      me.recvs.push_back(p);
    }
  }
  try {
    link_->match(side_);
    link_->match(1 - side_);
  } catch (const Error& e) {  // a device copy failed: both ends are broken
    link_->fail(0, e.what());
    link_->fail(1, e.what());
  }
  link_->cv.notify_all();
  return group;
}

void LoopbackTransport::wait(uint64_t group) {
  std::unique_lock<std::mutex> g(link_->mu);
  LoopbackLink::End& me = link_->end[side_];
  const LoopbackLink::End& peer = link_->end[1 - side_];
  require_arg(group <= me.groups, "loopback transport: wait(", group, ") but only ", me.groups, " groups were posted");
  auto done = [&] {
    for (uint64_t i = 0; i < group; ++i)
      if (me.open_ops[i] != 0) return false;
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(link_->timeout_ms);
  while (!done()) {
    require(!me.broken, ErrorCode::DeviceError, "loopback transport: ", me.why);
    if (peer.broken) {
      link_->fail(side_, "the peer is gone (" + peer.why + ")");
      continue;
    }
    if (link_->cv.wait_until(g, deadline) == std::cv_status::timeout && !done()) {
      link_->fail(side_, "timed out after " + std::to_string(link_->timeout_ms) + " ms waiting for the peer");
    }
  }
  require(!me.broken, ErrorCode::DeviceError, "loopback transport: ", me.why);
}

void LoopbackTransport::abort() noexcept {
  if (!link_) return;
  std::lock_guard<std::mutex> g(link_->mu);
  link_->fail(side_, "aborted");
  link_->cv.notify_all();
}

}  // namespace kvcore
