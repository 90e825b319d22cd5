// max-autotune for kiln's own CUDA kernels: each kernel's launch candidates
// (codegen::launch_candidates) are compiled, timed on zero-filled scratch buffers of the
// kernel's sizes, and the fastest kept. The winner is stored in the disk cache under the
// kernel's canonical unit text (its code, sizes and layouts) and the GPU's architecture, so a
// later compile of the same kernel, in this process or another, reads it instead of timing.
#pragma once
#include <string>
#include <vector>

#include "core/codegen/cuda_codegen.h"
#include "core/loop/program.h"

namespace kiln::pipeline {

struct LaunchTuning {
  std::vector<codegen::LaunchChoice> choices;  // per kernel, Program::kernels order
  // Per kernel: "timed", "disk" (the cache held the winner), or "" (nothing to choose).
  std::vector<std::string> how;
  int timed = 0, from_disk = 0;
  double seconds = 0;
};

// Never fails the compile: a candidate that does not compile or run is skipped, and a kernel
// whose timing fails keeps the heuristics' launch (logged under "autotune").
LaunchTuning tune_launches(const loop::Program& p, const std::string& header, const std::string& arch, int device,
                           const std::string& name_hint);

}  // namespace kiln::pipeline
