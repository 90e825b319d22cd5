#include "core/pipeline/compile_graph.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <cstdlib>
#include <thread>
#include <unordered_map>

#include "core/codegen/cpp_codegen.h"
#include "core/codegen/cuda_codegen.h"
#include "core/codegen/scalar_emitter.h"
#include "core/compile/nvrtc.h"
#include "core/pipeline/cuda_units.h"
#include "core/pipeline/tune_launches.h"
#include "core/lower/lower.h"
#include "core/passes/passes.h"
#include "core/schedule/schedule.h"
#include "core/support/log.h"

namespace kiln::pipeline {

void run_graph_passes(ir::Graph& g, const std::string& dump_name, passes::ExternTiming* timing) {
  auto step = [&](const char* name, const std::function<void(ir::Graph&)>& pass) {
    pass(g);
    if (!dump_name.empty()) debug_dump(dump_name + ".after_" + name + ".txt", g.str());
  };
  if (!dump_name.empty()) debug_dump(dump_name + ".captured.txt", g.str());
  step("fuse_attention", passes::fuse_attention);
  step("additive_attention_masks", passes::additive_attention_masks);
  step("fold_batch_norm", passes::fold_batch_norm);
  step("channels_last_convolutions", passes::channels_last_convolutions);
  step("decompose", [](ir::Graph& gr) { passes::decompose(gr); });
  step("channels_last_activations", passes::channels_last_activations);
  step("saved_in_producer_layout", passes::saved_in_producer_layout);
  step("prepack_convolutions", passes::prepack_convolutions);
  step("gemm_epilogues", [timing](ir::Graph& gr) { passes::gemm_epilogues(gr, timing); });
  step("dce", passes::dead_code_elimination);
  step("cse", passes::common_subexpression_elimination);
  step("reinplace_input_updates", passes::reinplace_input_updates);
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string ms(double seconds) { return std::to_string(static_cast<int>(seconds * 1e3 + 0.5)) + " ms"; }

bool compile_cuda_units(const codegen::CudaSource& cs, const loop::Program& p, const std::string& arch,
                        const std::string& name_hint, std::vector<size_t>& unit_of, CompiledGraph& out,
                        std::string& error) {
  std::vector<std::string> units;
  std::unordered_map<std::string, size_t> index;
  std::vector<bool> grouped(p.kernels.size(), false);  // launched by its foreach group: not compiled alone
  for (const loop::ForeachGroup& g : p.foreach_groups)
    for (int k : g.kernels) grouped[k] = true;
  auto add_unit = [&](std::string unit) {
    auto [it, fresh] = index.emplace(unit, units.size());
    if (fresh) units.push_back(std::move(unit));
    return it->second;
  };
  for (size_t i = 0; i < p.kernels.size(); ++i)
    unit_of.push_back(grouped[i] ? SIZE_MAX : add_unit(canonical_unit(cs.header, cs.kernels[i], p, p.kernels[i])));
  for (size_t i = 0; i < p.foreach_groups.size(); ++i) {
    std::string text = cs.foreach_kernels[i];
    codegen::replace_identifier(text, p.foreach_groups[i].name, kUnitKernelName);
    codegen::replace_identifier(text, p.foreach_groups[i].name + "_table", "kiln_unit_table");
    unit_of.push_back(add_unit(cs.header + text));
  }
  const auto started = std::chrono::steady_clock::now();
  size_t threads = 1;
  std::vector<compile::NvrtcResult> results = compile_units(units, arch, name_hint, &threads);
  if (log_enabled("timing")) {
    double total = 0, longest = 0;
    size_t hits = 0, slowest = 0;
    for (size_t u = 0; u < results.size(); ++u) {
      const compile::NvrtcResult& r = results[u];
      total += r.seconds;
      if (r.seconds > longest) longest = r.seconds, slowest = u;
      hits += r.cache_hit ? 1 : 0;
    }
    std::string slow_kernels;  // which kernels the slowest unit holds: where NVRTC's time went
    for (size_t i = 0; i < unit_of.size(); ++i)
      if (unit_of[i] == slowest)
        slow_kernels += (slow_kernels.empty() ? "" : ", ") +
                        (i < p.kernels.size() ? p.kernels[i].name : p.foreach_groups[i - p.kernels.size()].name);
    log("timing", name_hint + ": NVRTC " + ms(seconds_since(started)) + " for " + std::to_string(p.kernels.size()) +
                      " kernels in " + std::to_string(units.size()) + " units (" + std::to_string(hits) +
                      " from disk) on " + std::to_string(threads) + " threads; summed " + ms(total) +
                      ", longest " + ms(longest) + " (" + slow_kernels + ")");
  }
  const auto loading = std::chrono::steady_clock::now();
  const int device = p.device.index < 0 ? 0 : p.device.index;
  out.disk_cache_hit = true;
  for (const compile::NvrtcResult& r : results) {
    if (!r.ok) {
      error = "NVRTC failed: " + r.log;
      return false;
    }
    out.disk_cache_hit = out.disk_cache_hit && r.cache_hit;
    out.cuda_modules.push_back(compile::CudaModule::load(r.image, device, error));
    if (!out.cuda_modules.back()) return false;
  }
  log("timing", name_hint + ": module loads " + ms(seconds_since(loading)));
  return true;
}

// The source of one kernel inside the translation unit, for explain.
std::string kernel_source(const std::string& tu, const std::string& name) {
  auto start = tu.find("// " + name + ":");
  if (start == std::string::npos) return "";
  // A kernel defined as another's alias (cpp_codegen.cpp): its two lines, then that kernel's code.
  const auto line2 = tu.find('\n', start) + 1, line2_end = tu.find('\n', line2);
  const auto alias = tu.find("__attribute__((alias(\"", line2);
  if (alias != std::string::npos && alias < line2_end) {
    const auto target = alias + 22;
    return tu.substr(start, line2_end + 1 - start) + kernel_source(tu, tu.substr(target, tu.find('"', target) - target));
  }
  auto end = tu.find("\n}\n", start);
  return tu.substr(start, end == std::string::npos ? std::string::npos : end + 3 - start);
}

}  // namespace

namespace {
// How many C++ translation units a CPU program is compiled as: one per core, each with at
// least kKernelsPerUnit kernels (a unit's fixed cost, the prelude and a link step, is worth
// paying only for a share of real work; a small graph stays one unit, as it was).
size_t cpu_units(const loop::Program& p) {
  constexpr size_t kKernelsPerUnit = 6;
  if (const char* env = std::getenv("KILN_CPU_UNITS")) return std::max(1, std::atoi(env));  // tests, measurements
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  return std::max<size_t>(1, std::min(cores, p.kernels.size() / kKernelsPerUnit));
}

// Every size symbol the program uses must be readable from an input dim at run time.
bool symbols_bound(const loop::Program& p, std::string& error) {
  std::vector<sym::Expr> used;
  for (const loop::Buffer& b : p.buffers) {
    for (const sym::Expr& e : b.sizes) sym::collect_symbols(e, used);
    for (const sym::Expr& e : b.strides) sym::collect_symbols(e, used);
    sym::collect_symbols(b.offset, used);
  }
  for (const loop::Kernel& k : p.kernels) {
    for (const sym::Expr& e : k.ranges) sym::collect_symbols(e, used);
    for (const loop::Stage& st : k.stages)
      for (const sym::Expr& e : st.ranges) sym::collect_symbols(e, used);
  }
  for (const sym::Expr& e : used) {
    bool bound = false;
    for (const loop::SymbolBinding& b : p.symbols) bound |= b.symbol == e;
    if (!bound) {
      error = "size symbol " + e.str() + " is not the size of an input dim";
      return false;
    }
  }
  return true;
}
}  // namespace

bool compile_graph(ir::Graph& g, const CompileOptions& options, CompiledGraph& out, std::string& error) {
  auto t0 = std::chrono::steady_clock::now();
  try {
    passes::ExternTiming timing = options.time_extern;  // counts this compile's decisions
    run_graph_passes(g, debug_dir().empty() ? "" : options.name,
                     options.autotunes() && timing.time ? &timing : nullptr);
    out.tuned_kernels += timing.timed;
    out.tuned_from_disk += timing.from_disk;
  } catch (const std::exception& e) {
    error = std::string("graph passes failed: ") + e.what();
    return false;
  }
  if (std::unique_ptr<ir::Graph> pg = passes::split_prologue(g, out.prologue_inputs)) {
    debug_dump(options.name + ".prologue.txt", pg->str());
    CompileOptions po = options;
    po.name = options.name + "_prologue";
    out.prologue = std::make_unique<CompiledGraph>();
    if (!compile_graph(*pg, po, *out.prologue, error)) {
      error = "the prologue (what parameters alone make): " + error;
      return false;
    }
    out.cancelled = out.prologue->cancelled;
  }
  out.graph_text = g.str();
  out.op_count = g.op_count();
  log("graph", "\n" + out.graph_text);
  const double passes_s = seconds_since(t0);

  loop::Program& p = out.program;
  p.exprs.torch = options.torch;
  if (!lower::lower_graph(g, p, error)) return false;
  debug_dump(options.name + ".loop_lowered.txt", p.str());
  schedule::schedule(p);
  out.loop_text = p.str();
  debug_dump(options.name + ".loop_scheduled.txt", out.loop_text);
  if (!symbols_bound(p, error)) return false;
  log("timing", options.name + ": graph passes " + ms(passes_s) + ", lowering and scheduling " +
                    ms(seconds_since(t0) - passes_s) + " (" + std::to_string(out.op_count) + " ops, " +
                    std::to_string(p.kernels.size()) + " kernels)");

  if (p.kernels.empty()) {
    out.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return true;
  }

  if (p.device.type == DeviceType::CPU) {
    const auto generating = std::chrono::steady_clock::now();
    const std::vector<std::string> units = codegen::generate_cpp_units(p, cpu_units(p));
    out.source.clear();
    for (const std::string& u : units) out.source += u;
    debug_dump(options.name + ".kernels.cpp", out.source);
    const auto compiling = std::chrono::steady_clock::now();
    compile::CpuCompileResult r = compile::compile_cpp_units(units, options.cancel);
    log("timing", options.name + ": C++ code generation " + ms(seconds_since(generating) - seconds_since(compiling)) +
                      ", C++ compiler " + ms(seconds_since(compiling)) + " for " + std::to_string(units.size()) +
                      " units" + (r.cache_hit ? " (from disk)" : ""));
    if (r.cancelled) {
      out.cancelled = true;
      error = "compilation cancelled";
      return false;
    }
    if (!r.library) {
      error = "C++ compiler failed: " + r.error;
      return false;
    }
    out.library = r.library;
    out.disk_cache_hit = r.cache_hit;
    out.source_path = r.source_path;
    if (p.may_raise()) out.take_error = reinterpret_cast<int (*)()>(r.library->symbol("kiln_take_error"));
    for (const loop::Kernel& k : p.kernels) {
      CompiledKernel ck;
      ck.name = k.name;
      ck.source = kernel_source(out.source, k.name);
      ck.cpu_fn = reinterpret_cast<void (*)(void* const*)>(r.library->symbol(k.name));
      if (!ck.cpu_fn) {
        error = "kernel symbol missing from compiled library: " + k.name;
        return false;
      }
      out.kernels.push_back(ck);
    }
  } else {
    std::string why;
    if (!compile::cuda_driver_available(&why)) {
      error = "CUDA driver unavailable: " + why;
      return false;
    }
    const int device = p.device.index < 0 ? 0 : p.device.index;
    int cc = compile::cuda_compute_capability(device);
    std::string arch = cc > 0 ? "sm_" + std::to_string(cc) : "compute_75";
    LaunchTuning tuning;
    if (options.autotunes()) {
      tuning = tune_launches(p, codegen::generate_cuda(p).header, arch, device, options.name);
      out.tuned_kernels += tuning.timed;
      out.tuned_from_disk += tuning.from_disk;
      log("timing", options.name + ": autotuning " + ms(tuning.seconds) + " (" + std::to_string(tuning.timed) +
                        " kernels timed, " + std::to_string(tuning.from_disk) + " from disk)");
    }
    const auto generating = std::chrono::steady_clock::now();
    codegen::CudaSource cs = codegen::generate_cuda(p, tuning.choices);
    out.source = cs.source;
    log("timing", options.name + ": CUDA code generation " + ms(seconds_since(generating)));
    debug_dump(options.name + ".kernels.cu", out.source);
    std::vector<size_t> unit_of;  // per kernel: the translation unit it was compiled in
    if (!compile_cuda_units(cs, p, arch, options.name, unit_of, out, error)) return false;
    for (size_t i = 0; i < p.kernels.size() + p.foreach_groups.size(); ++i) {
      const bool group = i >= p.kernels.size();
      CompiledKernel ck;
      ck.name = group ? p.foreach_groups[i - p.kernels.size()].name : p.kernels[i].name;
      ck.source = kernel_source(out.source, ck.name);
      if (group) {
        const codegen::CudaLaunch& l = cs.foreach_launches[i - p.kernels.size()];
        ck.cuda_fn = out.cuda_modules[unit_of[i]]->function(kUnitKernelName, error);
        if (!ck.cuda_fn) return false;
        ck.grid = l.grid;
        ck.block = l.block;
        out.foreach.push_back(ck);
        continue;
      }
      if (unit_of[i] != SIZE_MAX) {
        ck.cuda_fn = out.cuda_modules[unit_of[i]]->function(kUnitKernelName, error);
        if (!ck.cuda_fn) return false;
      }
      ck.grid = cs.launches[i].grid;
      ck.block = cs.launches[i].block;
      if (i < tuning.how.size()) ck.tuned = tuning.how[i];
      ck.grid_expr = cs.launches[i].grid_expr;
      out.kernels.push_back(ck);
    }
  }
  out.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (log_enabled("kernels")) log("kernels", out.source);
  return true;
}

}  // namespace kiln::pipeline
