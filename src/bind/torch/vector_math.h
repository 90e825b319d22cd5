// Hands kiln's CPU kernels the vector math eager's kernels use: the Sleef functions torch's
// own library exports (compile::set_vector_math).
#pragma once

namespace kiln::bind {

// Looks the functions up in the loaded libtorch_cpu; where one is missing, kernels use what
// the machine has instead (glibc's libmvec, or kiln's own). Called once, at import.
void provide_torch_vector_math();

}  // namespace kiln::bind
