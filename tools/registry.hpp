// Registries that let each feature add its own demo section and benchmark
// without touching the CLI's main: a file defines KVCORE_DEMO_SECTION(...) or
// KVCORE_BENCH(...) and is compiled into the kvcore executable.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kvcore/device.hpp"

namespace kvcore::cli {

struct DemoOptions {
  Device device = Device::cpu();
  bool quick = false;   // smaller sizes (tests and CI)
  uint64_t seed = 1;
};

struct BenchOptions;  // bench/harness.hpp

// What `kvcore bench` was asked for, as plain data. The bench layer (bench/harness.cpp) turns
// it into its BenchOptions and runs the benchmarks, so the CLI includes no bench header.
struct BenchRequest {
  std::vector<std::string> names;  // benchmarks to run, in order (empty: all)
  Device device = Device::cpu();
  int reps = 20;                   // timed repetitions per case
  bool quick = false;              // small sizes: a smoke run, not a measurement
  std::string json_path;           // append JSON lines here when not empty
  std::vector<std::string> cases;  // optional filter on case names (substring match)
  std::string trace_dir;           // decode_trace: write raw per-warp stamps here when not empty
};

struct DemoSection {
  std::string name, description;
  std::function<int(const DemoOptions&)> run;  // returns 0 on success; non-zero fails the demo
};
struct BenchEntry {
  std::string name, description;
  std::function<void(BenchOptions&)> run;
};

// Sections run in the order of their keys.
std::map<int, DemoSection>& demo_sections();
std::map<std::string, BenchEntry>& bench_entries();
// Runs a BenchRequest; set by the bench layer at start-up (empty when no bench is linked).
std::function<void(const BenchRequest&)>& bench_runner();

inline bool register_demo(int order, DemoSection s) { return demo_sections().emplace(order, std::move(s)).second; }
inline bool register_bench(BenchEntry e) { return bench_entries().emplace(e.name, std::move(e)).second; }

}  // namespace kvcore::cli

#define KVCORE_CLI_CAT2(a, b) a##b
#define KVCORE_CLI_CAT(a, b) KVCORE_CLI_CAT2(a, b)

// KVCORE_DEMO_SECTION(20, "rope", "what it shows") { ...; return 0; }
#define KVCORE_DEMO_SECTION(order, name, description)                                                 \
  static int KVCORE_CLI_CAT(kvcore_demo_fn_, order)(const ::kvcore::cli::DemoOptions&);              \
  [[maybe_unused]] static const bool KVCORE_CLI_CAT(kvcore_demo_reg_, order) =                       \
      ::kvcore::cli::register_demo(order, {name, description, &KVCORE_CLI_CAT(kvcore_demo_fn_, order)}); \
  static int KVCORE_CLI_CAT(kvcore_demo_fn_, order)([[maybe_unused]] const ::kvcore::cli::DemoOptions& opt)

// KVCORE_BENCH(shift, "what it measures") { ... uses `opt` (BenchOptions&) ... }
#define KVCORE_BENCH(id, description)                                                                 \
  static void kvcore_bench_fn_##id(::kvcore::cli::BenchOptions&);                                   \
  [[maybe_unused]] static const bool kvcore_bench_reg_##id =                                         \
      ::kvcore::cli::register_bench({#id, description, &kvcore_bench_fn_##id});                      \
  static void kvcore_bench_fn_##id([[maybe_unused]] ::kvcore::cli::BenchOptions& opt)
