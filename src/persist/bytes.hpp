// Little-endian byte writing and bounds-checked reading. The reader never reads past its span:
// every shortfall throws Corrupt naming what was being read (files are untrusted input).
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcore/error.hpp"

namespace kvcore::persist {

static_assert(std::endian::native == std::endian::little, "kvcore's persistent formats assume a little-endian host");

struct ByteWriter {
  std::vector<uint8_t> out;
  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t n = out.size();
    out.resize(n + sizeof(T));
    std::memcpy(out.data() + n, &v, sizeof(T));
  }
  void bytes(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  template <class T>
  void array(const std::vector<T>& v) {
    bytes(v.data(), v.size() * sizeof(T));
  }
};

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> s, const char* what) : s_(s), what_(what) {}
  template <class T>
  T get(const char* field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, s_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> array(size_t n, const char* field) {
    require(n <= remaining() / sizeof(T), ErrorCode::Corrupt, "snapshot: ", what_, " ", field, ": ", n,
            " entries do not fit in the ", remaining(), " bytes left");
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), s_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return v;
  }
  std::span<const uint8_t> take(size_t n, const char* field) {
    need(n, field);
    auto r = s_.subspan(at_, n);
    at_ += n;
    return r;
  }
  size_t remaining() const { return s_.size() - at_; }
  size_t offset() const { return at_; }
  void expect_end() const {
    require(remaining() == 0, ErrorCode::Corrupt, "snapshot: ", what_, " has ", remaining(), " trailing bytes");
  }

 private:
  void need(size_t n, const char* field) const {
    require(n <= remaining(), ErrorCode::Corrupt, "snapshot: ", what_, " ends before ", field, " (", n, " bytes needed, ",
            remaining(), " left)");
  }
  std::span<const uint8_t> s_;
  const char* what_;
  size_t at_ = 0;
};

}  // namespace kvcore::persist
