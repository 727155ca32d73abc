// Benchmark harness: timing (CUDA events on a GPU, steady clock on the CPU),
// the bandwidth ceilings measured in the same run, and result records
// (BENCHMARKING.md): a human table on stdout and JSON lines with --json.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kvcore/device.hpp"
#include "kvcore/stream.hpp"

namespace kvcore::cli {

struct Timing {
  double median_us = 0, min_us = 0;
  int reps = 0;
};

// Ceilings of this device, measured once per process on buffers far larger than L2.
struct Ceilings {
  double copy_gbps = 0;  // bytes read + written per second by a plain copy kernel
  double read_gbps = 0;  // bytes read per second by a read-only (reduction) kernel
};

enum class Traffic { Copy, Read };  // which ceiling a result is compared with

struct BenchRecord {
  std::string bench, case_name;
  double bytes = 0;              // the fewest bytes the operation must move
  Timing t;
  Traffic traffic = Traffic::Copy;
  std::string baseline;          // empty: no baseline for this case
  std::optional<Timing> baseline_t;
};

struct BenchOptions {
  Device device = Device::cpu();
  int reps = 20;
  int warmup = 3;
  bool quick = false;              // small sizes: a smoke run, not a measurement
  std::string json_path;           // append JSON lines here when not empty
  std::vector<std::string> cases;  // optional filter on case names (substring match)
  std::string trace_dir;           // decode_trace: write raw per-warp stamps here when not empty
  bool wants(const std::string& case_name) const;

  // Time fn(rep) `reps` times after `warmup` calls; fn may rotate among inputs by rep.
  Timing time(const std::function<void(int rep)>& fn) const;
  const Ceilings& ceilings();      // measured lazily, once
  void report(const BenchRecord& r);  // prints a row and appends a JSON line
  void note(const std::string& line) const;  // progress / context line on stderr

 private:
  std::optional<Ceilings> ceilings_;
  bool header_printed_ = false;
};

// Backend hooks (bench/harness_cuda.cu when CUDA is built).
Timing time_cuda(int device, int reps, int warmup, const std::function<void(int)>& fn);
// Records record(stream) once into a CUDA graph (on a fresh stream, or on `capture` when given:
// a cache records on the stream of its config), then times `reps` replays (after `warmup`) with
// CUDA events: device time without host launch overhead.
Timing time_graph(int device, int reps, int warmup, const std::function<void(Stream)>& record, Stream capture = {});
// A stream that synchronizes with the legacy default stream (so time_cuda's events on it
// time work on this one too), for caches whose work a CUDA graph must capture; destroyed by
// destroy_stream().
Stream make_blocking_stream(int device);
void destroy_stream(Stream s);
// Host time of one call (validation, planning, enqueue): the median of 5 calls, each made on
// an idle device. Event timings of a call include it up to its first launch.
double host_time_us(int device, const std::function<void()>& call);
Ceilings measure_cuda_ceilings(int device);
Ceilings measure_cpu_ceilings();
std::string git_commit();

}  // namespace kvcore::cli
