#include "bind/torch/vector_math.h"

#include <dlfcn.h>

#include <string>
#include <vector>

#include "core/compile/cpu_compiler.h"

namespace kiln::bind {

void provide_torch_vector_math() {
  // torch is imported before kiln._C: its library is loaded, and RTLD_NOLOAD finds it by name.
  void* torch_cpu = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
  if (!torch_cpu) return;
  std::vector<void*> table;
  for (const char* width : {"f8_u10", "d4_u10", "f16_u10", "d8_u10"})
    for (const std::string& fn : compile::vector_math_functions())
      table.push_back(dlsym(torch_cpu, ("Sleef_" + fn + width).c_str()));
  compile::set_vector_math(std::move(table));  // ignored unless every function is there
  dlclose(torch_cpu);  // drops the reference NOLOAD took; torch keeps its own
}

}  // namespace kiln::bind
