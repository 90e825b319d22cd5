// How kiln's CUDA kernels become NVRTC translation units: each kernel alone, under one name and
// with its buffers named by argument position, so that kernels fusing the same ops over the same
// layouts (a model's repeated layers) are the same text, compiled once and shared through
// NVRTC's disk cache by every graph that has them; distinct units compile on parallel threads.
#pragma once
#include <string>
#include <vector>

#include "core/compile/nvrtc.h"
#include "core/loop/program.h"

namespace kiln::pipeline {

// The name every unit's kernel has.
inline constexpr const char* kUnitKernelName = "kiln_kernel";

// `header` (the prelude) and `kernel_text` (kernel `k`'s code as codegen wrote it), renamed to
// the unit's canonical names.
std::string canonical_unit(const std::string& header, std::string kernel_text, const loop::Program& p,
                           const loop::Kernel& k);

// Compiles `units` with NVRTC for `arch` on up to one thread a core; results in `units` order.
std::vector<compile::NvrtcResult> compile_units(const std::vector<std::string>& units, const std::string& arch,
                                                const std::string& name_hint, size_t* threads_used = nullptr);

}  // namespace kiln::pipeline
