// KV transfer protocol messages and control channel (protocol.hpp).
#include "transfer/protocol.hpp"

#include <algorithm>
#include <cstring>

#include "kvcore/buffer.hpp"
#include "kvcore/runtime.hpp"
#include "persist/bytes.hpp"
#include "persist/checksum.hpp"

namespace kvcore::xfer {

namespace {
constexpr char kMagic[8] = {'K', 'V', 'C', 'X', 'F', 'E', 'R', '\0'};
constexpr size_t kReplyMessageBytes = kReplyBytes - 8;
}  // namespace

std::vector<uint8_t> encode_header(const Header& h) {
  persist::ByteWriter w;
  w.out.reserve(kHeaderBytes);
  w.bytes(kMagic, 8);
  w.put(kProtocolMajor);
  w.put(kProtocolMinor);
  w.put(h.kind);
  w.put(static_cast<uint32_t>(h.packing));
  w.put(uint32_t{0});
  w.put(h.manifest_bytes);
  w.put(h.payload_bytes);
  w.put(h.chunk_bytes);
  w.put(h.fingerprint_hash);
  w.put(persist::xxh3_64(w.out.data(), w.out.size()));
  return std::move(w.out);
}

Header decode_header(std::span<const uint8_t> bytes) {
  require(bytes.size() == kHeaderBytes, ErrorCode::Corrupt, "transfer: header of ", bytes.size(), " bytes, expected ",
          kHeaderBytes);
  persist::ByteReader r(bytes, "transfer header");
  const auto magic = r.take(8, "magic");
  require(std::memcmp(magic.data(), kMagic, 8) == 0, ErrorCode::Corrupt, "transfer: not a kvcore transfer header (bad magic)");
  const uint16_t major = r.get<uint16_t>("major"), minor = r.get<uint16_t>("minor");
  Header h;
  h.kind = r.get<uint32_t>("kind");
  const uint32_t packing = r.get<uint32_t>("packing");
  r.get<uint32_t>("reserved");
  h.manifest_bytes = r.get<uint64_t>("manifest_bytes");
  h.payload_bytes = r.get<uint64_t>("payload_bytes");
  h.chunk_bytes = r.get<uint64_t>("chunk_bytes");
  h.fingerprint_hash = r.get<uint64_t>("fingerprint_hash");
  const uint64_t sum = r.get<uint64_t>("checksum");
  require(persist::xxh3_64(bytes.data(), kHeaderBytes - 8) == sum, ErrorCode::Corrupt, "transfer: header checksum mismatch");
  require_arg(major == kProtocolMajor, "transfer: protocol version ", major, ".", minor, " is not spoken by this kvcore (",
              kProtocolMajor, ".", kProtocolMinor, ")");
  require(h.kind == kKindPaged || h.kind == kKindDsv4, ErrorCode::Corrupt, "transfer: header kind ", h.kind, " is unknown");
  require(packing <= 1, ErrorCode::Corrupt, "transfer: header packing ", packing, " is unknown");
  h.packing = static_cast<TransferPacking>(packing);
  require(h.manifest_bytes > 0 && h.manifest_bytes <= (uint64_t{1} << 30), ErrorCode::Corrupt, "transfer: manifest of ",
          h.manifest_bytes, " bytes is out of range");
  require(h.chunk_bytes > 0, ErrorCode::Corrupt, "transfer: chunk_bytes is 0");
  return h;
}

std::vector<uint8_t> encode_reply(const Reply& rep) {
  std::vector<uint8_t> out(kReplyBytes, 0);
  const uint32_t status = rep.ok ? 0 : 1 + static_cast<uint32_t>(rep.code);
  const uint32_t n = static_cast<uint32_t>(std::min(rep.message.size(), kReplyMessageBytes));
  std::memcpy(out.data(), &status, 4);
  std::memcpy(out.data() + 4, &n, 4);
  if (n) std::memcpy(out.data() + 8, rep.message.data(), n);
  return out;
}

Reply decode_reply(std::span<const uint8_t> bytes) {
  persist::ByteReader r(bytes, "transfer reply");
  const uint32_t status = r.get<uint32_t>("status");
  const uint32_t n = r.get<uint32_t>("message length");
  require(status <= 1 + static_cast<uint32_t>(ErrorCode::DeviceError) && n <= kReplyMessageBytes, ErrorCode::Corrupt,
          "transfer: malformed reply (status ", status, ", message length ", n, ")");
  const auto msg = r.take(n, "message");
  Reply rep;
  rep.ok = status == 0;
  if (!rep.ok) rep.code = static_cast<ErrorCode>(status - 1);
  rep.message.assign(msg.begin(), msg.end());
  return rep;
}

void Control::send(std::initializer_list<std::span<const uint8_t>> messages) {
  size_t total = 0;
  for (auto m : messages) total += m.size();
  std::vector<uint8_t> host;
  host.reserve(total);
  for (auto m : messages) host.insert(host.end(), m.begin(), m.end());
  Buffer& dev = grow(scratch_, std::max<size_t>(total, 1), t_.device());
  copy_bytes(dev.data(), t_.device(), host.data(), Device::cpu(), total);
  std::vector<TransferOp> ops;
  size_t at = 0;
  for (auto m : messages) {
    ops.push_back(TransferOp::send(dev.as<uint8_t>() + at, m.size()));
    at += m.size();
  }
  xfer::abort_on_failure(t_, [&] { t_.wait(t_.post(ops)); });
}

std::vector<uint8_t> Control::recv(size_t bytes) {
  Buffer& dev = grow(scratch_, std::max<size_t>(bytes, 1), t_.device());
  const TransferOp op = TransferOp::recv(dev.data(), bytes);
  xfer::abort_on_failure(t_, [&] { t_.wait(t_.post({&op, 1})); });
  std::vector<uint8_t> host(bytes);
  copy_bytes(host.data(), Device::cpu(), dev.data(), t_.device(), bytes);
  return host;
}

void Control::send_reply(const Reply& r) {
  const std::vector<uint8_t> b = encode_reply(r);
  send({b});
}

Reply Control::recv_reply() { return decode_reply(recv(kReplyBytes)); }

Control::Opening Control::recv_opening() {
  return abort_on_failure(t_, [&] {
    Opening o;
    o.header = decode_header(recv(kHeaderBytes));
    o.manifest = recv(o.header.manifest_bytes);
    return o;
  });
}

Reply reply_of(const std::exception& e) {
  Reply r;
  r.ok = false;
  r.code = ErrorCode::DeviceError;
  if (const Error* k = dynamic_cast<const Error*>(&e)) r.code = k->code();
  r.message = e.what();
  return r;
}

void throw_refused(const Reply& r, const char* what) {
  throw Error(r.code, detail::concat(what, ": the receiver refused: ", r.message));
}

Buffer& grow(Buffer& b, size_t bytes, Device dev) {
  if (b.size() < bytes || b.device() != dev) {
    b = Buffer();  // the old one first: the pool may not hold both
    b = Buffer(bytes, dev);
  }
  return b;
}

void check_options(const TransferOptions& o, const char* what) {
  require_arg(o.packing == TransferPacking::Packed || o.packing == TransferPacking::InPlace, what, ": packing ",
              static_cast<uint32_t>(o.packing), " is not Packed or InPlace");
  require_arg(o.chunk_bytes > 0, what, ": chunk_bytes is 0");
  require_arg(o.ops_per_group > 0, what, ": ops_per_group ", o.ops_per_group, " must be positive");
}

}  // namespace kvcore::xfer
