// Process-wide counters behind kiln.stats().
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln::bind {

struct Stats {
  long frames_captured = 0;
  long graphs_compiled = 0;
  long backward_graphs_compiled = 0;  // graphs compiled with a backward program (training)
  long recompiles = 0;
  long cache_hits_memory = 0;
  long cache_hits_disk = 0;
  long eager_fallbacks = 0;
  long graph_breaks = 0;
  long kernels_generated = 0;
  long cudagraph_recordings = 0;  // mode="reduce-overhead": CUDA graphs recorded
  long cudagraph_replays = 0;
  long prologue_runs = 0;          // prologues run (first calls, and after a parameter changed)
  long kernels_autotuned = 0;      // mode="max-autotune": kernels whose launch candidates were timed
  long autotune_cache_hits = 0;    // ... and those whose winner the disk cache held
  double capture_seconds = 0;
  double compile_seconds = 0;
  std::map<std::string, long> fallback_reasons;
  std::vector<std::string> recompile_reasons;  // "name: guard that failed", oldest first (last 64)
};

Stats& stats();

// What kiln.explain reports for each frame captured while it runs the function.
struct ExplainRecord {
  std::string name;
  bool eager = false;            // the frame runs eagerly (reason, location say why)
  bool has_graph = false;
  bool graph_break = false;      // the graph ends in a break (reason, location say where)
  std::string reason, location;
  std::string graph, captured, loop_ir, source, source_path, device;
  size_t op_count = 0;
  double compile_seconds = 0;
  struct Kernel {
    std::string name, source, launch;
  };
  std::vector<Kernel> kernels;
  std::string cudagraphs;        // mode="reduce-overhead": recorded, or why not
  // A graph with a backward (training): its graph, code, kernel names and saved values.
  std::string backward_graph, backward_source;
  std::vector<std::string> backward_kernels;
  size_t saved = 0;
  size_t backward_stages = 0;  // programs the backward is cut into (DDP's buckets), 1 when whole
  // What the graph computes from parameters alone, run once and kept (prologue.h).
  std::string prologue_graph;
  std::vector<std::string> prologue_kernels;
  std::vector<std::string> guards;
};

// Non-null while kiln.explain runs a function: every entry built is recorded there.
std::vector<ExplainRecord>*& explain_log();

}  // namespace kiln::bind
