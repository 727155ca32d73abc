// The KV transfer protocol's messages (spec: include/kvcore/transfer/transfer.hpp) and the
// host-side control channel over a Transport.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcore/buffer.hpp"
#include "kvcore/error.hpp"
#include "kvcore/transfer/transfer.hpp"
#include "kvcore/transfer/transport.hpp"

namespace kvcore::xfer {

inline constexpr uint16_t kProtocolMajor = 1, kProtocolMinor = 0;
inline constexpr size_t kHeaderBytes = 64, kReplyBytes = 256;
inline constexpr uint32_t kKindPaged = 1, kKindDsv4 = 2;

// header: char magic[8] = "KVCXFER\0"; u16 major; u16 minor; u32 kind; u32 packing;
// u32 reserved = 0; u64 manifest_bytes; u64 payload_bytes; u64 chunk_bytes;
// u64 xxh3_64 of the layout fingerprint text; u64 xxh3_64 of bytes [0, 56)
struct Header {
  uint32_t kind = 0;
  TransferPacking packing = TransferPacking::Packed;
  uint64_t manifest_bytes = 0, payload_bytes = 0, chunk_bytes = 0, fingerprint_hash = 0;
};
std::vector<uint8_t> encode_header(const Header& h);
// Corrupt on a bad magic, checksum, packing or size; InvalidArgument on another major version.
Header decode_header(std::span<const uint8_t> bytes);

// reply: u32 status (0 accepted, else 1 + ErrorCode); u32 message length; message (at most 248 bytes)
struct Reply {
  bool ok = true;
  ErrorCode code = ErrorCode::InvalidArgument;
  std::string message;
};
std::vector<uint8_t> encode_reply(const Reply& r);
Reply decode_reply(std::span<const uint8_t> bytes);  // Corrupt when malformed

// The control channel: small host messages through a device buffer of the transport's device.
class Control {
 public:
  // `scratch`: the device buffer messages pass through (grown when too small).
  Control(Transport& t, Buffer& scratch) : t_(t), scratch_(scratch) {}
  // Posts sends of each message as one group and waits for it.
  void send(std::initializer_list<std::span<const uint8_t>> messages);
  std::vector<uint8_t> recv(size_t bytes);
  void send_reply(const Reply& r);
  Reply recv_reply();
  // What a receiver reads first: the sender's header, then the manifest it announces. A header
  // that fails its checks leaves the stream unreadable, so any failure aborts the transport.
  struct Opening {
    Header header;
    std::vector<uint8_t> manifest;
  };
  Opening recv_opening();

 private:
  Transport& t_;
  Buffer& scratch_;
};

// `b` itself when it holds at least `bytes` on `dev`, else a new buffer of that size there.
Buffer& grow(Buffer& b, size_t bytes, Device dev);

// What a refusal or a failure reports to the peer.
Reply reply_of(const std::exception& e);
// The sender's error for the receiver's refusal.
[[noreturn]] void throw_refused(const Reply& r, const char* what);

// Runs `f`; on any exception aborts the transport, then rethrows.
template <class F>
auto abort_on_failure(Transport& t, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (...) {
    t.abort();
    throw;
  }
}

void check_options(const TransferOptions& o, const char* what);

}  // namespace kvcore::xfer
