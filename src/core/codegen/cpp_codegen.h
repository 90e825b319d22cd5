// C++/OpenMP code generation for CPU kernels.
#pragma once
#include <string>
#include <vector>

#include "core/loop/program.h"

namespace kiln::codegen {

// One translation unit holding every kernel of the program, each an
// `extern "C" void <name>(void* const* args)` taking its buffers in Kernel::buffers order.
std::string generate_cpp(const loop::Program& p);

// The same kernels split over `units` translation units (fewer when there are fewer kernels),
// balanced by the length of their code, to be compiled in parallel and linked into one
// library: the first defines what the library needs once (the error flag, the vector libm
// entry points the program calls), the others refer to it.
std::vector<std::string> generate_cpp_units(const loop::Program& p, size_t units);

}  // namespace kiln::codegen
