// Process-wide counters behind kiln.stats().
#pragma once
#include <map>
#include <string>

namespace kiln::bind {

struct Stats {
  long frames_captured = 0;
  long graphs_compiled = 0;
  long recompiles = 0;
  long cache_hits_memory = 0;
  long cache_hits_disk = 0;
  long eager_fallbacks = 0;
  long kernels_generated = 0;
  double capture_seconds = 0;
  double compile_seconds = 0;
  std::map<std::string, long> fallback_reasons;
};

Stats& stats();

}  // namespace kiln::bind
