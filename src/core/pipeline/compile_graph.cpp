#include "core/pipeline/compile_graph.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "core/codegen/cpp_codegen.h"
#include "core/codegen/cuda_codegen.h"
#include "core/compile/nvrtc.h"
#include "core/lower/lower.h"
#include "core/passes/passes.h"
#include "core/schedule/schedule.h"
#include "core/support/log.h"

namespace kiln::pipeline {

void run_graph_passes(ir::Graph& g, const std::string& dump_name) {
  auto step = [&](const char* name, void (*pass)(ir::Graph&)) {
    pass(g);
    if (!dump_name.empty()) debug_dump(dump_name + ".after_" + name + ".txt", g.str());
  };
  if (!dump_name.empty()) debug_dump(dump_name + ".captured.txt", g.str());
  step("fuse_attention", passes::fuse_attention);
  step("additive_attention_masks", passes::additive_attention_masks);
  step("channels_last_convolutions", passes::channels_last_convolutions);
  step("decompose", passes::decompose);
  step("dce", passes::dead_code_elimination);
  step("cse", passes::common_subexpression_elimination);
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string ms(double seconds) { return std::to_string(static_cast<int>(seconds * 1e3 + 0.5)) + " ms"; }

// The source of one kernel inside the translation unit, for explain.
// Every kernel is compiled as a translation unit of its own, under one name (kUnitKernelName)
// and with its buffers named by argument position:
// kernels that fuse the same ops over the same layouts (a model's repeated layers) are then the
// same text, compiled once and shared through NVRTC's disk cache by every graph that has them,
// and the distinct ones compile on parallel threads. One NVRTC call over a whole graph ran on
// one thread and recompiled a layer's kernels for each layer.
constexpr const char* kUnitKernelName = "kiln_kernel";

bool identifier_char(char c) { return isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Replaces the identifier `from` (whole words only) by `to`.
void replace_identifier(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
    const size_t end = at + from.size();
    if ((end == text.size() || !identifier_char(text[end])) && (at == 0 || !identifier_char(text[at - 1]))) {
      text.replace(at, from.size(), to);
      at += to.size();
    } else {
      at = end;
    }
  }
}

bool compile_cuda_units(const codegen::CudaSource& cs, const loop::Program& p, const std::string& arch,
                        const std::string& name_hint, std::vector<size_t>& unit_of, CompiledGraph& out,
                        std::string& error) {
  std::vector<std::string> units;
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    std::string text = cs.kernels[i];
    replace_identifier(text, p.kernels[i].name, kUnitKernelName);
    // Buffers by their place in the argument list: a layer's kernel reads other buffers than
    // the same kernel of the next layer, under other names, yet is the same code.
    for (size_t a = 0; a < p.kernels[i].buffers.size(); ++a)
      replace_identifier(text, p.buffers[p.kernels[i].buffers[a]].name, "kiln_arg" + std::to_string(a));
    int accs = 0;  // reductions' accumulators are numbered across the program
    for (const loop::Stage& st : p.kernels[i].stages)
      if (st.kind == loop::Stage::Kind::Reduce) replace_identifier(text, "acc" + std::to_string(st.acc), "kiln_acc" + std::to_string(accs++));
    std::string unit = cs.header + text;
    auto [it, fresh] = index.emplace(unit, units.size());
    if (fresh) units.push_back(std::move(unit));
    unit_of.push_back(it->second);
  }
  std::vector<compile::NvrtcResult> results(units.size());
  const auto started = std::chrono::steady_clock::now();
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t u; (u = next++) < units.size();) results[u] = compile::nvrtc_compile(units[u], arch, name_hint);
  };
  const size_t threads = std::min<size_t>(units.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (log_enabled("timing")) {
    double total = 0, longest = 0;
    size_t hits = 0;
    for (const compile::NvrtcResult& r : results) {
      total += r.seconds;
      longest = std::max(longest, r.seconds);
      hits += r.cache_hit ? 1 : 0;
    }
    log("timing", name_hint + ": NVRTC " + ms(seconds_since(started)) + " for " + std::to_string(p.kernels.size()) +
                      " kernels in " + std::to_string(units.size()) + " units (" + std::to_string(hits) +
                      " from disk) on " + std::to_string(threads) + " threads; summed " + ms(total) +
                      ", longest " + ms(longest));
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

std::string kernel_source(const std::string& tu, const std::string& name) {
  auto start = tu.find("// " + name + ":");
  if (start == std::string::npos) return "";
  auto end = tu.find("\n}\n", start);
  return tu.substr(start, end == std::string::npos ? std::string::npos : end + 3 - start);
}

}  // namespace

namespace {
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
    run_graph_passes(g, debug_dir().empty() ? "" : options.name);
  } catch (const std::exception& e) {
    error = std::string("graph passes failed: ") + e.what();
    return false;
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
    out.source = codegen::generate_cpp(p);
    debug_dump(options.name + ".kernels.cpp", out.source);
    const auto compiling = std::chrono::steady_clock::now();
    compile::CpuCompileResult r = compile::compile_cpp(out.source, options.cancel);
    log("timing", options.name + ": C++ code generation " + ms(seconds_since(generating) - seconds_since(compiling)) +
                      ", C++ compiler " + ms(seconds_since(compiling)) + (r.cache_hit ? " (from disk)" : ""));
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
    out.take_error = reinterpret_cast<int (*)()>(r.library->symbol("kiln_take_error"));
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
    const auto generating = std::chrono::steady_clock::now();
    codegen::CudaSource cs = codegen::generate_cuda(p);
    out.source = cs.source;
    log("timing", options.name + ": CUDA code generation " + ms(seconds_since(generating)));
    debug_dump(options.name + ".kernels.cu", out.source);
    std::string why;
    if (!compile::cuda_driver_available(&why)) {
      error = "CUDA driver unavailable: " + why;
      return false;
    }
    int cc = compile::cuda_compute_capability(p.device.index < 0 ? 0 : p.device.index);
    std::string arch = cc > 0 ? "sm_" + std::to_string(cc) : "compute_75";
    std::vector<size_t> unit_of;  // per kernel: the translation unit it was compiled in
    if (!compile_cuda_units(cs, p, arch, options.name, unit_of, out, error)) return false;
    for (size_t i = 0; i < p.kernels.size(); ++i) {
      CompiledKernel ck;
      ck.name = p.kernels[i].name;
      ck.source = kernel_source(out.source, ck.name);
      ck.cuda_fn = out.cuda_modules[unit_of[i]]->function(kUnitKernelName, error);
      if (!ck.cuda_fn) return false;
      ck.grid = cs.launches[i].grid;
      ck.block = cs.launches[i].block;
      ck.grid_expr = cs.launches[i].grid_expr;
      out.kernels.push_back(ck);
    }
  }
  out.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (log_enabled("kernels")) log("kernels", out.source);
  return true;
}

}  // namespace kiln::pipeline
