// The backend pipeline, as a straight line: graph passes -> lowering -> scheduling ->
// code generation -> native compilation. Each step can be dumped (KILN_DEBUG).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/compile/cpu_compiler.h"
#include "core/compile/cuda_driver.h"
#include "core/ir/graph.h"
#include "core/loop/program.h"
#include "core/passes/passes.h"

namespace kiln::pipeline {

struct CompileOptions {
  std::string mode = "default";
  // max-autotune and max-autotune-no-cudagraphs: launches and GEMM variants are timed.
  bool autotunes() const { return mode == "max-autotune" || mode == "max-autotune-no-cudagraphs"; }
  std::string name = "graph";   // prefix of debug dump files
  // Asked while the C++ compiler runs (see compile_cpp); true stops the compile, which then
  // fails with `CompiledGraph::cancelled` set.
  std::function<bool()> cancel;
  // How torch's own CPU kernels round, where kiln follows them.
  loop::TorchNumerics torch;
  // max-autotune: times torch's GEMM kernels (the binding runs them); unset, nothing is timed.
  passes::ExternTiming time_extern;
};

struct CompiledKernel {
  std::string name;
  std::string source;            // this kernel's code, for explain
  void (*cpu_fn)(void* const*) = nullptr;
  void* cuda_fn = nullptr;       // CUfunction
  unsigned grid = 1, block = 1;
  // max-autotune: "timed" (its launch candidates were timed in this compile), "disk" (the
  // disk cache held the winner), "" (heuristic launch: not tuned, or nothing to choose).
  std::string tuned;
  // Shape-generic kernels: the grid as an expression of the size symbols, evaluated at launch.
  sym::Expr grid_expr;
};

struct CompiledGraph {
  loop::Program program;
  std::string graph_text;        // the graph after decomposition and cleanup
  std::string loop_text;         // the loop IR after scheduling
  std::string source;            // the whole generated translation unit
  std::string source_path;       // where it lies on disk
  std::vector<CompiledKernel> kernels;
  std::vector<CompiledKernel> foreach;  // one per Program::foreach_groups entry (its members have no cuda_fn)
  int (*take_error)() = nullptr;  // CPU programs that may raise (Program::may_raise): reports and clears the flag
  std::shared_ptr<compile::SharedLibrary> library;
  std::vector<std::shared_ptr<compile::CudaModule>> cuda_modules;  // one per distinct kernel
  bool disk_cache_hit = false;
  // max-autotune: kernels and GEMMs timed, and choices read from the disk cache instead.
  int tuned_kernels = 0, tuned_from_disk = 0;
  bool cancelled = false;        // CompileOptions::cancel stopped the compile
  double compile_seconds = 0;
  size_t op_count = 0;
  // What the graph computes from its stable inputs alone (ir::Graph::stable_inputs), split off
  // and compiled on its own (passes::split_prologue): `program` reads its outputs as inputs
  // after the captured ones. `prologue_inputs`: the captured input each of its inputs is.
  std::unique_ptr<CompiledGraph> prologue;
  std::vector<int> prologue_inputs;
};

// Compiles `g` (which it rewrites in place). On failure returns false with a reason; the
// caller runs the code eagerly.
bool compile_graph(ir::Graph& g, const CompileOptions& options, CompiledGraph& out, std::string& error);

// Graph passes only (decompose, DCE, CSE): used by compile_graph and by tests.
void run_graph_passes(ir::Graph& g, const std::string& dump_name = "", passes::ExternTiming* timing = nullptr);

}  // namespace kiln::pipeline
