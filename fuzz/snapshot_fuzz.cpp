// The snapshot loader under attack: any byte string goes through snapshot_inspect() and then
// snapshot_decode() into three small caches (f16 rope-on-read, FP8 rope-stored, MLA's shared latent).
// Only kvcore::Error may come out, and a refused load must
// leave the cache as it was (checked with debug_state()).
//
// Built three ways:
//   - with libFuzzer (KVCORE_LIBFUZZER, scripts/fuzz-snapshot.sh): the fuzz target;
//   - as a normal program (ctest persist_fuzz_corpus_replay): replays every file of the corpus
//     directories given on the command line, so CI runs the corpus without clang;
//   - `--write-seeds DIR`: writes the small seed snapshots fuzz/corpus/snapshot/ holds.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kvcore/cache/paged_cache.hpp"
#include "kvcore/error.hpp"
#include "kvcore/persist/snapshot.hpp"

namespace {

using namespace kvcore;

// The layout every seed uses (small: the fuzzer mutates few payload bytes and many structure bytes).
PagedCacheConfig fuzz_config(RopeMode mode, KvFormat f) {
  PagedCacheConfig c;
  c.n_layers = 1;
  c.n_kv_heads = 1;
  c.head_dim = 64;
  c.v_head_dim = 64;
  c.block_size = 2;
  c.num_blocks = 12;
  c.k_format = f;
  c.v_format = f;
  c.rope = {RopeSpec::plain(64, 10000.0)};
  c.rope_mode = mode;
  return c;
}

// MLA's shared layout (v_from_k_latent): K rows of 128 dims, V their first 64, RoPE on the 64-dim tail
// (small rows, so not a geometry kvcore's attention reads: kvcore_attention off).
PagedCacheConfig fuzz_shared_config() {
  PagedCacheConfig c = fuzz_config(RopeMode::RopeStored, KvFormat::Fp8);
  c.head_dim = 128;
  c.kvcore_attention = false;
  c.v_from_k_latent = true;
  c.rope[0].slice = RopeSlice::Tail;
  return c;
}

constexpr const char* kModel = "fuzz-model";

// Appends n tokens of K (and V where the cache has V pools) to `seq`.
void append_tokens(PagedCache& c, SeqId seq, int32_t n, float k_of(size_t), float v_of(size_t)) {
  const PagedCacheConfig& cfg = c.config();
  const bool has_v = !cfg.v_from_k_latent;
  std::vector<float> k(static_cast<size_t>(cfg.head_dim) * n), v(static_cast<size_t>(cfg.v_head_dim) * n);
  for (size_t i = 0; i < k.size(); ++i) k[i] = k_of(i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = v_of(i);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = i;
  c.append(seq, pos, TensorRef(k.data(), DType::F32, Device::cpu(), {1, n, 1, cfg.head_dim}),
           has_v ? TensorRef(v.data(), DType::F32, Device::cpu(), {1, n, 1, cfg.v_head_dim}) : TensorRef{});
}

void load_one(const uint8_t* data, size_t size, const PagedCacheConfig& cfg) {
  PagedCache cache(cfg, Device::cpu());
  const SeqId keep = cache.create();  // something the failed loads must not disturb
  append_tokens(cache, keep, 3, [](size_t) { return 0.5f; }, [](size_t) { return -0.25f; });
  const std::string before = cache.debug_state();
  const int32_t delta = size > 0 ? static_cast<int32_t>(data[size - 1] % 5) - 2 : 0;
  try {
    const SnapshotLoaded got =
        snapshot_decode(cache, {data, size}, {kModel, cfg.rope_mode == RopeMode::RopeOnRead ? delta : 0});
    for (SeqId id : got.ids) {  // what was loaded must be readable and editable
      cache.read(id, 0);
      cache.truncate(id, 0);
    }
  } catch (const Error&) {
    if (cache.debug_state() != before) {
      std::fprintf(stderr, "a refused load changed the cache\n");
      std::abort();
    }
  }
}

void write_seeds(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<PagedCacheConfig> configs;
  for (RopeMode mode : {RopeMode::RopeStored, RopeMode::RopeOnRead})
    for (KvFormat f : {KvFormat::F16, KvFormat::Fp8}) configs.push_back(fuzz_config(mode, f));
  configs.push_back(fuzz_shared_config());
  int n = 0;
  for (const PagedCacheConfig& cfg : configs) {
    PagedCache c(cfg, Device::cpu());
    const SeqId a = c.create();
    append_tokens(c, a, 5, [](size_t i) { return static_cast<float>(i % 7) - 3.0f; },
                  [](size_t i) { return static_cast<float>(i % 5) * 0.5f; });
    const SeqId b = c.fork(a);
    c.truncate(b, 3);
    c.shift(a, 1, 2);
    const std::string path = dir + "/seed-" + std::to_string(n++) + ".kvcs";
    snapshot_save(c, path, kModel);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    snapshot_inspect({data, size});
  } catch (const Error&) {
  }
  static const PagedCacheConfig targets[] = {fuzz_config(RopeMode::RopeOnRead, KvFormat::F16),
                                             fuzz_config(RopeMode::RopeStored, KvFormat::Fp8), fuzz_shared_config()};
  for (const PagedCacheConfig& cfg : targets) load_one(data, size, cfg);
  return 0;
}

#ifndef KVCORE_LIBFUZZER
int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--write-seeds") {
    write_seeds(argv[2]);
    return 0;
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE... | --write-seeds DIR\n", argv[0]);
    return 2;
  }
  size_t files = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<std::filesystem::path> paths;
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::directory_iterator(argv[i]))
        if (e.is_regular_file()) paths.push_back(e.path());
    } else {
      paths.push_back(argv[i]);
    }
    for (const auto& p : paths) {
      const std::vector<uint8_t> bytes = read_file_bytes(p.string());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++files;
    }
  }
  std::printf("replayed %zu files\n", files);
  return files > 0 ? 0 : 1;
}
#endif
