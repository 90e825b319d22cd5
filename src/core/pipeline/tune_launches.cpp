#include "core/pipeline/tune_launches.h"

#include <chrono>
#include <map>
#include <memory>
#include <sstream>

#include "core/compile/cuda_driver.h"
#include "core/compile/disk_cache.h"
#include "core/pipeline/cuda_units.h"
#include "core/support/hash.h"
#include "core/support/log.h"

namespace kiln::pipeline {
namespace {

using codegen::LaunchChoice;

// Bumped when what a tuned choice means changes (the candidates, the writer's plans).
constexpr const char* kTuneVersion = "kiln-launch-tune-1";
// A candidate replaces the heuristics' launch only when it is this much faster: below it,
// timing noise would flip choices from run to run.
constexpr double kMinGain = 0.03;

std::string tune_key(const std::string& gpu, const std::string& unit) {
  return hex64(hash_str(unit, hash_str(std::string(kTuneVersion) + "|" + gpu))) + ".tune";
}

struct Candidate {
  LaunchChoice choice;
  codegen::CudaLaunch launch;
  size_t unit = 0;
};

struct Pending {
  size_t kernel;
  std::string key;
  std::vector<Candidate> candidates;
};

// Milliseconds of GPU time a launch of `fn` takes (compile::cuda_benchmark).
double time_kernel(void* fn, const codegen::CudaLaunch& l, void** args, int device, std::string& error) {
  return compile::cuda_benchmark(
      [&](std::string& err) { return compile::cuda_launch(fn, l.grid, 1, 1, l.block, 1, 1, 0, nullptr, args, err); },
      200, device, nullptr, error);
}

}  // namespace

LaunchTuning tune_launches(const loop::Program& p, const std::string& header, const std::string& arch, int device,
                           const std::string& name_hint) {
  const auto started = std::chrono::steady_clock::now();
  LaunchTuning out;
  out.choices.assign(p.kernels.size(), LaunchChoice{});
  out.how.assign(p.kernels.size(), "");
  // Shape-generic programs size their launches at run time, and scalar arguments are values of
  // a call: nothing to time at compile time.
  if (!p.symbols.empty() || p.scalar_args > 0) return out;
  // The winners depend on the GPU, not only its architecture (an H100's and an H200's memory).
  const std::string gpu = arch + "/" + compile::cuda_device_name(device);
  std::vector<Pending> pending;
  std::map<std::string, size_t> pending_of_key;  // a layer's kernel repeated: timed once
  std::vector<std::pair<size_t, size_t>> follows;  // (kernel, pending index) sharing a key
  std::vector<std::string> units;
  std::map<std::string, size_t> unit_index;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const loop::Kernel& k = p.kernels[i];
    std::vector<LaunchChoice> choices = codegen::launch_candidates(p, k);
    if (choices.size() < 2) continue;
    bool sized = true;
    for (int b : k.buffers) sized = sized && p.buffers[b].bytes().as_const().has_value();
    if (!sized) continue;
    std::vector<Candidate> cands;
    std::string key;
    std::map<std::string, bool> seen_text;
    for (const LaunchChoice& c : choices) {
      Candidate cand{c, {}, 0};
      std::string unit = canonical_unit(header, codegen::generate_cuda_kernel(p, k, c, cand.launch), p, k);
      if (key.empty()) key = tune_key(gpu, unit);
      // Two choices the writer emits alike (a warp-row request on rows too long for it) are one.
      if (!seen_text.emplace(unit + std::to_string(cand.launch.block) + "/" + std::to_string(cand.launch.grid), true).second)
        continue;
      auto [it, fresh] = unit_index.emplace(unit, units.size());
      if (fresh) units.push_back(std::move(unit));
      cand.unit = it->second;
      cands.push_back(cand);
    }
    if (cands.size() < 2) continue;
    if (LaunchChoice c; [&] { auto d = compile::read_decision(key); return d && LaunchChoice::parse(*d, c); }()) {
      out.choices[i] = c;
      out.how[i] = "disk";
      ++out.from_disk;
      continue;
    }
    if (auto it = pending_of_key.find(key); it != pending_of_key.end()) {
      follows.push_back({i, it->second});
      continue;
    }
    pending_of_key[key] = pending.size();
    pending.push_back(Pending{i, key, std::move(cands)});
  }
  if (pending.empty()) {
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return out;
  }
  // Only the units of kernels still to time are compiled.
  std::vector<bool> needed(units.size(), false);
  for (const Pending& pk : pending)
    for (const Candidate& c : pk.candidates) needed[c.unit] = true;
  std::vector<std::string> to_compile;
  std::vector<size_t> compiled_of(units.size(), 0);
  for (size_t u = 0; u < units.size(); ++u)
    if (needed[u]) compiled_of[u] = to_compile.size(), to_compile.push_back(units[u]);
  std::vector<compile::NvrtcResult> results = compile_units(to_compile, arch, name_hint + "_tune");
  std::vector<std::shared_ptr<compile::CudaModule>> modules(to_compile.size());
  for (Pending& pk : pending) {
    const loop::Kernel& k = p.kernels[pk.kernel];
    std::string error;
    std::vector<std::unique_ptr<compile::CudaScratch>> scratch;
    std::vector<void*> ptrs;
    for (int b : k.buffers) {
      scratch.push_back(compile::CudaScratch::make(static_cast<size_t>(*p.buffers[b].bytes().as_const()), device, error));
      if (!scratch.back()) break;
      ptrs.push_back(scratch.back()->ptr());
    }
    std::vector<void*> args;
    for (void*& ptr : ptrs) args.push_back(&ptr);
    double heuristic_ms = -1, best_ms = -1;
    size_t best = 0;
    std::string report;
    for (size_t c = 0; c < pk.candidates.size() && ptrs.size() == k.buffers.size(); ++c) {
      const Candidate& cand = pk.candidates[c];
      const size_t u = compiled_of[cand.unit];
      if (!results[u].ok) continue;
      if (!modules[u] && !(modules[u] = compile::CudaModule::load(results[u].image, device, error))) continue;
      void* fn = modules[u]->function(kUnitKernelName, error);
      const double t = fn ? time_kernel(fn, cand.launch, args.data(), device, error) : -1;
      if (t < 0) {
        // A fault in a candidate poisons the context for the rest of the process: stop timing.
        log("autotune", k.name + ": " + cand.choice.str() + " failed: " + error);
        break;
      }
      report += " [" + cand.choice.str() + "] " + std::to_string(t * 1e3) + " us;";
      if (c == 0) heuristic_ms = t;
      if (best_ms < 0 || t < best_ms) best_ms = t, best = c;
    }
    if (heuristic_ms < 0) continue;
    if (best_ms > heuristic_ms * (1 - kMinGain)) best = 0;
    out.choices[pk.kernel] = pk.candidates[best].choice;
    out.how[pk.kernel] = "timed";
    ++out.timed;
    log("autotune", k.name + ":" + report + " -> " + pk.candidates[best].choice.str());
    compile::write_decision(pk.key, pk.candidates[best].choice.str());
  }
  for (auto [kernel, pi] : follows) {
    if (out.how[pending[pi].kernel].empty()) continue;
    out.choices[kernel] = out.choices[pending[pi].kernel];
    out.how[kernel] = "timed";
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

}  // namespace kiln::pipeline
