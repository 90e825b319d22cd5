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

struct CudaSource {
  std::string source;                // the whole translation unit (for reading and dumps)
  std::vector<CudaLaunch> launches;  // one per kernel, in Program::kernels order
  std::string header;                // what every kernel needs: the prelude, the index type
  std::vector<std::string> kernels;  // each kernel's own text, in Program::kernels order
};

CudaSource generate_cuda(const loop::Program& p);

}  // namespace kiln::codegen
