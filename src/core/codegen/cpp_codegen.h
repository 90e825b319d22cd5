// C++/OpenMP code generation for CPU kernels.
#pragma once
#include <string>

#include "core/loop/program.h"

namespace kiln::codegen {

// One translation unit holding every kernel of the program, each an
// `extern "C" void <name>(void* const* args)` taking its buffers in Kernel::buffers order.
std::string generate_cpp(const loop::Program& p);

}  // namespace kiln::codegen
