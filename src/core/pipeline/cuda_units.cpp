#include "core/pipeline/cuda_units.h"

#include "core/codegen/scalar_emitter.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <thread>

namespace kiln::pipeline {

using codegen::replace_identifier;

std::string canonical_unit(const std::string& header, std::string text, const loop::Program& p,
                           const loop::Kernel& k) {
  replace_identifier(text, k.name, kUnitKernelName);
  // Buffers by their place in the argument list: a layer's kernel reads other buffers than the
  // same kernel of the next layer, under other names, yet is the same code.
  // Names codegen derives from a buffer's (its vector-alignment flag) go the same way.
  for (size_t a = 0; a < k.buffers.size(); ++a) {
    const std::string& name = p.buffers[k.buffers[a]].name;
    replace_identifier(text, name, "kiln_arg" + std::to_string(a));
    replace_identifier(text, "kiln_al_" + name, "kiln_al_arg" + std::to_string(a));
  }
  int accs = 0;  // reductions' accumulators are numbered across the program
  for (const loop::Stage& st : k.stages)
    if (st.kind == loop::Stage::Kind::Reduce) replace_identifier(text, "acc" + std::to_string(st.acc), "kiln_acc" + std::to_string(accs++));
  return header + text;
}

std::vector<compile::NvrtcResult> compile_units(const std::vector<std::string>& units, const std::string& arch,
                                                const std::string& name_hint, size_t* threads_used) {
  std::vector<compile::NvrtcResult> results(units.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t u; (u = next++) < units.size();) results[u] = compile::nvrtc_compile(units[u], arch, name_hint);
  };
  const size_t threads = std::min<size_t>(units.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (threads_used) *threads_used = threads;
  return results;
}

}  // namespace kiln::pipeline
