#include "core/pipeline/cuda_units.h"

#include "core/codegen/kernel_identity.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <thread>

namespace kiln::pipeline {

std::string canonical_unit(const std::string& header, std::string text, const loop::Program& p,
                           const loop::Kernel& k) {
  return header + codegen::canonical_kernel_text(std::move(text), p, k, kUnitKernelName);
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
