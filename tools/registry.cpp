#include "tools/registry.hpp"

namespace kvcore::cli {

std::map<int, DemoSection>& demo_sections() {
  static std::map<int, DemoSection> sections;
  return sections;
}

std::map<std::string, BenchEntry>& bench_entries() {
  static std::map<std::string, BenchEntry> entries;
  return entries;
}

std::function<void(const BenchRequest&)>& bench_runner() {
  static std::function<void(const BenchRequest&)> runner;
  return runner;
}

}  // namespace kvcore::cli
