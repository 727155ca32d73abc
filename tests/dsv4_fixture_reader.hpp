// Reader of the KVF1 fixture files written by tests/fixtures/make_dsv4_fixtures.py:
// records of (name, dtype f32 | i32, shape, little-endian data).
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvcore::testing {

struct FixtureArray {
  bool is_int = false;
  std::vector<int64_t> shape;
  std::vector<float> f;
  std::vector<int32_t> i;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  int64_t dim(int d) const { return shape.at(static_cast<size_t>(d)); }
};

class Fixture {
 public:
  explicit Fixture(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open fixture " + path);
    char magic[4];
    in.read(magic, 4);
    if (!in || std::memcmp(magic, "KVF1", 4) != 0) throw std::runtime_error("bad fixture magic in " + path);
    for (;;) {
      uint32_t name_len;
      if (!in.read(reinterpret_cast<char*>(&name_len), 4)) break;
      std::string name(name_len, '\0');
      in.read(name.data(), name_len);
      uint8_t code;
      uint32_t ndim;
      in.read(reinterpret_cast<char*>(&code), 1);
      in.read(reinterpret_cast<char*>(&ndim), 4);
      FixtureArray a;
      a.is_int = code == 1;
      a.shape.resize(ndim);
      in.read(reinterpret_cast<char*>(a.shape.data()), 8 * ndim);
      const int64_t n = a.numel();
      if (a.is_int) {
        a.i.resize(static_cast<size_t>(n));
        in.read(reinterpret_cast<char*>(a.i.data()), 4 * n);
      } else {
        a.f.resize(static_cast<size_t>(n));
        in.read(reinterpret_cast<char*>(a.f.data()), 4 * n);
      }
      if (!in) throw std::runtime_error("truncated fixture " + path + " at " + name);
      arrays_.emplace(name, std::move(a));
    }
  }
  bool has(const std::string& name) const { return arrays_.count(name) != 0; }
  const FixtureArray& at(const std::string& name) const {
    auto it = arrays_.find(name);
    if (it == arrays_.end()) throw std::runtime_error("fixture has no record " + name);
    return it->second;
  }

 private:
  std::map<std::string, FixtureArray> arrays_;
};

}  // namespace kvcore::testing
