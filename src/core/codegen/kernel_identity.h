// When two generated kernels are the same code. A model's repeated layers fuse the same ops over
// the same layouts into kernels that differ only in the names codegen gave them: the kernel's own,
// its buffers' (another layer's weights), its accumulators' (numbered across the program). Renamed
// to names that depend only on the kernel's shape, such kernels are the same text: the CUDA
// backend compiles each text once (pipeline/cuda_units.h), the C++ backend defines it once and
// makes the others aliases of it (cpp_codegen.cpp).
#pragma once
#include <string>

#include "core/loop/program.h"

namespace kiln::codegen {

// Kernel `k`'s code (`text`, as codegen wrote it) with the kernel named `kernel_name` and its
// buffers and accumulators named by position (kiln_arg0..., kiln_acc0...).
std::string canonical_kernel_text(std::string text, const loop::Program& p, const loop::Kernel& k,
                                  const std::string& kernel_name);

}  // namespace kiln::codegen
