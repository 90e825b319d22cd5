// CUDA C++ code generation (compiled at run time by NVRTC) from the same loop IR as the CPU.
//
// Kernels whose stages all run at outer points map one thread to one outer point (grid-stride
// loop over the flattened outer space). Kernels with inner loops map one block to one outer
// point: threads stride over the inner space, reductions finish with warp shuffles and a
// shared-memory pass, and every thread sees the result, so later stages of the same row (the
// normalisation of a softmax) run in the same launch.
#pragma once
#include <string>
#include <vector>

#include "core/loop/program.h"

namespace kiln::codegen {

struct CudaLaunch {
  std::string name;
  unsigned grid = 1, block = 1;
  // Shape-generic kernels: the grid as an expression of the size symbols (evaluated at each
  // launch); their values follow the buffers as int64 arguments.
  sym::Expr grid_expr;
};

// A kernel's launch shape where the heuristics are overridden: max-autotune times a kernel's
// candidates (launch_candidates) and keeps the fastest. Plain data, emitted by the writer.
struct LaunchChoice {
  unsigned block = 0;      // threads a block; 0: the heuristic's
  int warp_rows = -1;      // row kernels: 1 a row per warp, 0 a row per block, -1 the heuristic's
  bool vectorize = true;   // pointwise kernels: 16-byte groups where the accesses allow them
  bool operator==(const LaunchChoice&) const = default;
  std::string str() const;                                   // "block=256 warp_rows=-1 vectorize=1"
  static bool parse(const std::string& text, LaunchChoice& out);
};

struct CudaSource {
  std::string source;                // the whole translation unit (for reading and dumps)
  std::vector<CudaLaunch> launches;  // one per kernel, in Program::kernels order
  // One per Program::foreach_groups entry: its kernel's text and launch (block; grid: the
  // members' blocks). Its one parameter is the table ForeachTable describes.
  std::vector<std::string> foreach_kernels;
  std::vector<CudaLaunch> foreach_launches;
  std::string header;                // what every kernel needs: the prelude, the index type
  std::vector<std::string> kernels;  // each kernel's own text, in Program::kernels order
};

// A foreach group's kernel reads one parameter, a table of 8-byte slots: per member its buffers'
// addresses, then per member its scalar arguments (doubles), then per member its flat extent,
// then per member its variant, then the first block of each member and the total (int64).
// `buffers` and `args` are the most any member has.
struct ForeachTable {
  size_t members = 0, buffers = 0, args = 0;
  std::vector<int64_t> block_start;  // members + 1 entries
  size_t slots() const { return members * (buffers + args + 3) + 1; }
  size_t buffer_slot(size_t m, size_t j) const { return m * buffers + j; }
  size_t arg_slot(size_t m, size_t j) const { return members * buffers + m * args + j; }
  size_t points_slot(size_t m) const { return members * (buffers + args) + m; }
  size_t variant_slot(size_t m) const { return members * (buffers + args + 1) + m; }
  size_t start_slot(size_t m) const { return members * (buffers + args + 2) + m; }
};
ForeachTable foreach_table(const loop::ForeachGroup& g);

// `choices`: per kernel (Program::kernels order), or empty for the heuristics' launches.
CudaSource generate_cuda(const loop::Program& p, const std::vector<LaunchChoice>& choices = {});

// One kernel's text (as CudaSource::kernels holds it) under `choice`, and its launch.
std::string generate_cuda_kernel(const loop::Program& p, const loop::Kernel& k, const LaunchChoice& choice,
                                 CudaLaunch& launch);

// The launch shapes worth timing for `k`, the heuristics' own ({}) first; just that one when
// there is nothing to choose (a launch-bound kernel, sizes known only at run time).
std::vector<LaunchChoice> launch_candidates(const loop::Program& p, const loop::Kernel& k);

}  // namespace kiln::codegen
