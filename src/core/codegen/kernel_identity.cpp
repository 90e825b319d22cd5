#include "core/codegen/kernel_identity.h"

#include "core/codegen/scalar_emitter.h"

namespace kiln::codegen {

std::string canonical_kernel_text(std::string text, const loop::Program& p, const loop::Kernel& k,
                                  const std::string& kernel_name) {
  replace_identifier(text, k.name, kernel_name);
  // Buffers by their place in the argument list, and the names codegen derives from a buffer's
  // (its vector-alignment flag) with them.
  for (size_t a = 0; a < k.buffers.size(); ++a) {
    const std::string& name = p.buffers[k.buffers[a]].name;
    replace_identifier(text, name, "kiln_arg" + std::to_string(a));
    replace_identifier(text, "kiln_al_" + name, "kiln_al_arg" + std::to_string(a));
  }
  int accs = 0;
  for (const loop::Stage& st : k.stages)
    if (st.kind == loop::Stage::Kind::Reduce) replace_identifier(text, "acc" + std::to_string(st.acc), "kiln_acc" + std::to_string(accs++));
  return text;
}

}  // namespace kiln::codegen
