// The kvcore command-line tool: info, demo, bench.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "kvcore/error.hpp"
#include "kvcore/runtime.hpp"
#include "tools/registry.hpp"

using namespace kvcore;

namespace {

Device parse_device(const std::string& s) {
  if (s == "auto") return default_device();
  if (s == "cpu") return Device::cpu();
  if (s == "cuda" || s.rfind("cuda:", 0) == 0) {
    const int idx = s.size() > 5 ? std::stoi(s.substr(5)) : 0;
    require(cuda_compiled(), ErrorCode::NotSupported, "--device ", s, ": this build has no CUDA backend");
    require(idx < cuda_device_count(), ErrorCode::InvalidArgument, "--device ", s, ": ", cuda_device_count(), " CUDA devices present");
    return Device::cuda(idx);
  }
  throw Error(ErrorCode::InvalidArgument, "--device must be auto, cpu, cuda or cuda:N, got '" + s + "'");
}

int run_info() {
  std::printf("kvcore %s\n", version());
  std::printf("backends: cpu%s\n", cuda_compiled() ? ", cuda" : "");
  std::printf("devices:\n  cpu\n");
  for (int i = 0; i < cuda_device_count(); ++i) std::printf("  cuda:%d  %s\n", i, device_name(Device::cuda(i)).c_str());
  if (cuda_compiled() && cuda_device_count() == 0) std::printf("  (CUDA backend built, no GPU present)\n");
  std::printf("demo sections:\n");
  for (auto& [order, s] : cli::demo_sections()) std::printf("  %-14s %s\n", s.name.c_str(), s.description.c_str());
  std::printf("benchmarks:\n");
  for (auto& [name, b] : cli::bench_entries()) std::printf("  %-14s %s\n", name.c_str(), b.description.c_str());
  return 0;
}

int run_demo(const std::string& device, bool quick, const std::vector<std::string>& only, uint64_t seed) {
  cli::DemoOptions o;
  o.device = parse_device(device);
  o.quick = quick;
  o.seed = seed;
  std::printf("kvcore %s demo on %s (%s)\n", version(), o.device.str().c_str(), device_name(o.device).c_str());
  int failures = 0;
  for (auto& [order, s] : cli::demo_sections()) {
    if (!only.empty() && std::find(only.begin(), only.end(), s.name) == only.end()) continue;
    std::printf("\n== %s: %s ==\n", s.name.c_str(), s.description.c_str());
    const int rc = s.run(o);
    if (rc != 0) {
      std::printf("!! section %s FAILED\n", s.name.c_str());
      ++failures;
    }
  }
  std::printf("\ndemo %s\n", failures ? "FAILED" : "finished: every check passed");
  return failures ? 1 : 0;
}

}  // namespace

namespace kvcore::cli {
int run_snapshot_inspect(const std::string& path);  // tools/snapshot_cmd.cpp
}

int main(int argc, char** argv) {
  CLI::App app{"kvcore: the KV-cache layer of LLM inference engines"};
  app.require_subcommand(1);

  app.add_subcommand("info", "version, backends, devices, demo sections and benchmarks");

  auto* demo = app.add_subcommand("demo", "walk through kvcore on a realistic layer, checking every step");
  std::string demo_device = "auto";
  bool demo_quick = false;
  std::vector<std::string> demo_only;
  uint64_t demo_seed = 1;
  demo->add_option("--device", demo_device, "auto (CUDA when a GPU is present), cpu, cuda, cuda:N");
  demo->add_flag("--quick", demo_quick, "smaller sizes");
  demo->add_option("--section", demo_only, "run only these sections");
  demo->add_option("--seed", demo_seed, "random seed");

  auto* bench = app.add_subcommand("bench", "named benchmarks (kvcore info lists them)");
  cli::BenchRequest breq;
  std::string bench_device = "auto";
  bench->add_option("names", breq.names, "benchmarks to run (all when none)");
  bench->add_option("--device", bench_device, "auto, cpu, cuda, cuda:N");
  bench->add_option("--json", breq.json_path, "append one JSON object per case to this file");
  bench->add_option("--reps", breq.reps, "timed repetitions per case")->check(CLI::Range(1, 100000));
  bench->add_option("--case", breq.cases, "only cases whose name contains one of these");
  bench->add_flag("--quick", breq.quick, "small sizes: a smoke run, not a measurement");
  bench->add_option("--trace-dir", breq.trace_dir, "decode_trace: write each case's raw per-warp stamps to DIR/<case>.csv");

  auto* snapshot = app.add_subcommand("snapshot", "snapshot files");
  snapshot->require_subcommand(1);
  auto* snapshot_inspect = snapshot->add_subcommand("inspect", "check a snapshot file and print what it holds");
  std::string snapshot_path;
  snapshot_inspect->add_option("file", snapshot_path, "the snapshot file")->required();

  CLI11_PARSE(app, argc, argv);
  try {
    if (app.got_subcommand("info")) return run_info();
    if (app.got_subcommand("snapshot")) return cli::run_snapshot_inspect(snapshot_path);
    if (app.got_subcommand("demo")) return run_demo(demo_device, demo_quick, demo_only, demo_seed);
    if (app.got_subcommand("bench")) {
      breq.device = parse_device(bench_device);
      require(static_cast<bool>(cli::bench_runner()), ErrorCode::NotSupported, "bench: this build has no benchmarks");
      cli::bench_runner()(breq);
      return 0;
    }
  } catch (const kvcore::Error& e) {
    std::fprintf(stderr, "kvcore: %s\n", e.what());
    return 2;
  }
  return 0;
}
