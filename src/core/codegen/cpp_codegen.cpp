#include "core/codegen/cpp_codegen.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/codegen/kernel_identity.h"
#include "core/codegen/scalar_emitter.h"

namespace kiln::codegen {

extern const char* const kCpuPrelude;

namespace {

using loop::Kernel;
using loop::SOp;
using loop::Stage;
using sym::Expr;

// Work below this many evaluations of a cheap body (a load, an add and a store: the cost
// kBaseCost in ScalarCtx::cost's units) runs on one thread: forking the team costs more. A
// costlier body forks at proportionally fewer points: a gelu over BERT 1x8's 24,576 features
// took 38 us on one thread of the 16-core Xeon, and erf's 8 lanes run at a tenth of an add's.
constexpr int64_t kParallelThreshold = 32768;
constexpr double kBaseCost = 4;
constexpr int64_t kMinParallelPoints = 1024;
// Iterations the threads share: enough for a machine of many cores. A conv activation of
// batch 4 has only 4 points in its first dim, so the leading dims are collapsed until there
// are at least this many.
constexpr int64_t kParallelChunks = 256;

std::string acc_init(ops::ReduceOp op, DType t) {
  switch (op) {
    case ops::ReduceOp::Sum: return literal(0, 0, t);
    case ops::ReduceOp::Prod: return literal(1, 1, t);
    case ops::ReduceOp::Max: return is_floating(t) ? literal(-INFINITY, 0, t) : literal(0, int_lowest(t), t);
    case ops::ReduceOp::Min: return is_floating(t) ? literal(INFINITY, 0, t) : literal(0, int_highest(t), t);
  }
  return "0";
}

std::string combine(ops::ReduceOp op, const std::string& acc, const std::string& v, DType t) {
  switch (op) {
    case ops::ReduceOp::Sum: return t == DType::Bool ? acc + " || " + v : acc + " + " + v;
    case ops::ReduceOp::Prod: return t == DType::Bool ? acc + " && " + v : acc + " * " + v;
    case ops::ReduceOp::Max: return "kiln_max(" + acc + ", " + v + ")";
    case ops::ReduceOp::Min: return "kiln_min(" + acc + ", " + v + ")";
  }
  return v;
}

int64_t const_product(const std::vector<Expr>& xs) {
  int64_t p = 1;
  for (const Expr& e : xs) {
    auto c = e.as_const();
    if (!c) return -1;
    p *= *c;
  }
  return p;
}

class KernelWriter {
 public:
  KernelWriter(const loop::Program& p, const Kernel& k, std::string& out, int torch_vector_bytes)
      : p_(p), k_(k), out_(out), torch_vector_bytes_(torch_vector_bytes) {}

  void write() {
    std::set<int> stored;
    for (const Stage& st : k_.stages)
      for (const loop::Store& s : st.stores) stored.insert(s.buffer);
    out_ += "// " + k_.name + ": fuses " + std::to_string(k_.ops.size()) + " op(s)\n";
    out_ += "extern \"C\" void " + k_.name + "(void* const* kiln_args) {\n";
    for (size_t i = 0; i < k_.buffers.size(); ++i) {
      const loop::Buffer& b = p_.buffers[k_.buffers[i]];
      std::string cv = stored.count(b.id) ? "" : "const ";
      out_ += "  " + cv + ctype(b.dtype) + "* __restrict__ " + b.name + " = (" + cv + ctype(b.dtype) + "*)kiln_args[" +
              std::to_string(i) + "];\n";
    }
    // A shape-generic program's size symbols follow the buffers, as one array of int64.
    if (!p_.symbols.empty()) {
      out_ += "  const kiln_i64* kiln_syms = (const kiln_i64*)kiln_args[" + std::to_string(k_.buffers.size()) + "];\n";
      for (size_t i = 0; i < p_.symbols.size(); ++i)
        out_ += "  const kiln_i64 " + p_.symbols[i].symbol.name() + " = kiln_syms[" + std::to_string(i) + "];\n";
    }
    // The scalar arguments (Python floats read per call) follow, as one array of double.
    if (p_.scalar_args > 0) {
      const size_t at = k_.buffers.size() + (p_.symbols.empty() ? 0 : 1);
      out_ += "  const double* kiln_scalar_args = (const double*)kiln_args[" + std::to_string(at) + "];\n";
      for (int i : loop::scalar_args_of(p_, k_))
        out_ += "  const double " + arg_name(i) + " = kiln_scalar_args[" + std::to_string(i) + "];\n";
    }
    int64_t outer = const_product(k_.ranges);
    int64_t inner = 1;
    for (const Stage& st : k_.stages)
      if (!st.vars.empty()) inner = std::max<int64_t>(inner, const_product(st.ranges));
    // The body's cost per point of the inner space (stages summed: each runs at every point).
    double body_cost = 0;
    std::unordered_set<loop::SRef> seen;
    for (const Stage& st : k_.stages) {
      if (st.kind == Stage::Kind::Reduce) body_cost += p_.exprs.cost(st.value, seen) + 1;
      for (const loop::Store& store : st.stores) body_cost += p_.exprs.cost(store.value, seen) + 1;
    }
    const int64_t threshold = std::max<int64_t>(
        kMinParallelPoints, static_cast<int64_t>(kParallelThreshold * kBaseCost / std::max(kBaseCost, body_cost)));
    bool parallel = outer < 0 || inner < 0 || (outer > 1 && outer * inner >= threshold);
    // Symbolic sizes: whether the team forks is decided per call, from the sizes of that call.
    std::string when;
    if (outer < 0 || inner < 0) {
      Expr work = sym::product(k_.ranges);
      for (const Stage& st : k_.stages)
        if (!st.vars.empty()) work = work * sym::product(st.ranges);
      when = " if(" + work.c_str() + " >= " + std::to_string(threshold) + ")";
    }
    bool pointwise_only = true;
    for (const Stage& st : k_.stages) pointwise_only &= st.vars.empty();

    // How many leading dims the threads split: the fewest that give kParallelChunks
    // iterations, leaving a pointwise kernel's innermost dim to the vector unit.
    size_t n = k_.vars.size(), collapse = 1;
    if (parallel && n > 1) {
      size_t limit = pointwise_only ? n - 1 : n;
      int64_t iters = 1;
      for (collapse = 0; collapse < limit;) {
        auto c = k_.ranges[collapse].as_const();
        ++collapse;
        if (!c) break;
        iters *= *c;
        if (iters >= kParallelChunks) break;
      }
    }
    std::string split = collapse > 1 ? " collapse(" + std::to_string(collapse) + ")" : "";

    if (columns()) {
      write_columns(parallel, when);
      return;
    }
    ScalarEmitter em(p_, out_, [](int acc) { return "acc" + std::to_string(acc); });
    std::string indent = "  ";
    for (size_t d = 0; d < n; ++d) {
      bool innermost = d + 1 == n;
      if (d == 0 && parallel) {
        bool simd = pointwise_only && collapse == n;
        out_ += indent + (simd ? "#pragma omp parallel for simd schedule(static)" : "#pragma omp parallel for schedule(static)") +
                split + when + "\n";
      } else if (innermost && pointwise_only && !(parallel && d < collapse)) {
        out_ += indent + "#pragma omp simd\n";
      }
      const std::string v = k_.vars[d].name();
      out_ += indent + "for (kiln_i64 " + v + " = 0; " + v + " < " + k_.ranges[d].c_str() + "; ++" + v + ") {\n";
      indent += "  ";
    }
    for (const Stage& st : k_.stages) write_stage(st, em, indent);
    for (size_t d = k_.vars.size(); d-- > 0;) {
      indent.resize(indent.size() - 2);
      out_ += indent + "}\n";
    }
    out_ += "}\n\n";
  }

 private:
  // Column sums (loop::reduces_columns) whose innermost outer loop is short and known: that
  // loop moves inside the reduction, one accumulator per output in an array, so each reduced
  // point reads a contiguous run of the kept dim into vector lanes (a channels-last batch
  // norm's statistics: 64 channels side by side), instead of a strided walk per output.
  static constexpr int64_t kMaxColumns = 2048;
  static constexpr int64_t kColumnBlock = 64;
  bool columns() const {
    if (!loop::reduces_columns(p_, k_)) return false;
    auto c = k_.ranges.back().as_const();
    if (!c || *c < 2 || *c > kMaxColumns) return false;
    for (const Stage& st : k_.stages)
      if (st.kind == Stage::Kind::Reduce && (st.reduce != ops::ReduceOp::Sum || st.acc_dtype == DType::Bool)) return false;
    return true;
  }

  void write_columns(bool parallel, const std::string& when) {
    const std::string col = k_.vars.back().name(), C = k_.ranges.back().c_str();
    ScalarEmitter em(p_, out_, [col](int acc) { return "acc" + std::to_string(acc) + "[" + col + "]"; });
    std::string indent = "  ";
    const size_t n = k_.vars.size() - 1;  // the loops outside the columns
    for (size_t d = 0; d < n; ++d) {
      if (d == 0 && parallel) out_ += indent + "#pragma omp parallel for schedule(static)" + (n > 1 ? " collapse(" + std::to_string(n) + ")" : std::string()) + when + "\n";
      const std::string v = k_.vars[d].name();
      out_ += indent + "for (kiln_i64 " + v + " = 0; " + v + " < " + k_.ranges[d].c_str() + "; ++" + v + ") {\n";
      indent += "  ";
    }
    auto columns_loop = [&](const std::string& ind) {
      out_ += ind + "#pragma omp simd\n";
      out_ += ind + "for (kiln_i64 " + col + " = 0; " + col + " < " + C + "; ++" + col + ") {\n";
    };
    for (const Stage& st : k_.stages)
      if (st.kind == Stage::Kind::Reduce)
        out_ += indent + ctype(st.acc_dtype) + " acc" + std::to_string(st.acc) + "[" + C + "] = {};\n";
    for (const Stage& st : k_.stages) {
      std::string ind = indent;
      em.push_scope();
      if (st.kind == Stage::Kind::Reduce) {
        // The innermost reduced loop in blocks of kColumnBlock points, each summed apart and
        // then added to the total: a two-level sum, whose rounding error grows with the number
        // of blocks plus the block's length rather than with every point (torch's CPU sums
        // cascade too; one running sum over 12,544 points was 1e-4 off in float32).
        const std::string acc = "acc" + std::to_string(st.acc), block = acc + "_block";
        const std::string r = st.vars.back().name(), R = st.ranges.back().c_str(), B = std::to_string(kColumnBlock);
        const std::string T = ctype(st.acc_dtype);
        Stage outer_loops = st;
        outer_loops.vars.pop_back(), outer_loops.ranges.pop_back();
        open_inner(outer_loops, ind, "");
        out_ += ind + "for (kiln_i64 " + r + "_b = 0; " + r + "_b < " + R + "; " + r + "_b += " + B + ") {\n";
        out_ += ind + "  " + T + " " + block + "[" + C + "] = {};\n";
        out_ += ind + "  const kiln_i64 " + r + "_e = " + r + "_b + " + B + " < " + R + " ? " + r + "_b + " + B + " : " + R + ";\n";
        out_ += ind + "  for (kiln_i64 " + r + " = " + r + "_b; " + r + " < " + r + "_e; ++" + r + ") {\n";
        const std::string in3 = ind + "    ";
        columns_loop(in3);
        std::string v = em.emit(st.value, in3 + "  ");
        for (const loop::Store& x : st.stores) out_ += in3 + "  " + store_stmt(p_.buffers[x.buffer], x.index.c_str(), v) + "\n";
        out_ += in3 + "  " + block + "[" + col + "] = " + combine(st.reduce, block + "[" + col + "]", v, st.acc_dtype) + ";\n";
        out_ += in3 + "}\n";
        out_ += ind + "  }\n";
        columns_loop(ind + "  ");
        out_ += ind + "    " + acc + "[" + col + "] = " + combine(st.reduce, acc + "[" + col + "]", block + "[" + col + "]", st.acc_dtype) + ";\n";
        out_ += ind + "  }\n";
        out_ += ind + "}\n";
        close_inner(outer_loops, ind);
      } else {
        columns_loop(ind);
        for (const loop::Store& x : st.stores) {
          std::string v = em.emit(x.value, ind + "  ");
          out_ += ind + "  " + store_stmt(p_.buffers[x.buffer], x.index.c_str(), v) + "\n";
        }
        out_ += ind + "}\n";
      }
      em.pop_scope();
    }
    for (size_t d = n; d-- > 0;) {
      indent.resize(indent.size() - 2);
      out_ += indent + "}\n";
    }
    out_ += "}\n\n";
  }

  void open_inner(const Stage& st, std::string& indent, const std::string& pragma) {
    for (size_t d = 0; d < st.vars.size(); ++d) {
      if (d + 1 == st.vars.size() && !pragma.empty()) out_ += indent + pragma + "\n";
      const std::string v = st.vars[d].name();
      out_ += indent + "for (kiln_i64 " + v + " = 0; " + v + " < " + st.ranges[d].c_str() + "; ++" + v + ") {\n";
      indent += "  ";
    }
  }
  void close_inner(const Stage& st, std::string& indent) {
    for (size_t d = 0; d < st.vars.size(); ++d) {
      indent.resize(indent.size() - 2);
      out_ += indent + "}\n";
    }
  }

  void write_stage(const Stage& st, ScalarEmitter& em, std::string indent) {
    if (st.kind == Stage::Kind::Reduce) {
      std::string acc = "acc" + std::to_string(st.acc);
      DType t = st.acc_dtype;
      out_ += indent + ctype(t) + " " + acc + " = " + acc_init(st.reduce, t) + ";\n";
      // Reductions vectorize through OpenMP's simd reductions (sums may be reassociated, as
      // torch's own vectorized sums are). Max/min of floats track NaN apart, since the simd
      // max reduction would drop it and torch propagates it.
      bool minmax = st.reduce == ops::ReduceOp::Max || st.reduce == ops::ReduceOp::Min;
      bool track_nan = minmax && is_floating(t);
      std::string nan = acc + "_nan";
      std::string pragma;
      if (t != DType::Bool) {
        if (st.reduce == ops::ReduceOp::Sum) pragma = "#pragma omp simd reduction(+:" + acc + ")";
        // Floating products in order, as torch's CPU kernel folds the rows it does not split
        // into vectors (see docs/architecture.md): reassociated, they differ in the last bits
        // and near overflow even in whether they overflow. Integer products are exact.
        if (st.reduce == ops::ReduceOp::Prod && !is_floating(t)) pragma = "#pragma omp simd reduction(*:" + acc + ")";
        if (minmax) {
          pragma = std::string("#pragma omp simd reduction(") + (st.reduce == ops::ReduceOp::Max ? "max:" : "min:") + acc + ")";
          if (track_nan) pragma += " reduction(|:" + nan + ")";
        }
      }
      if (st.torch_vector_block && st.reduce == ops::ReduceOp::Prod && is_floating(t) && !st.vars.empty() &&
          torch_vector_bytes_ >= dtype_size(product_type(st))) {
        write_torch_product(st, em, indent, acc);
        return;
      }
      // An int flag: bool lanes do not vectorize.
      if (track_nan) out_ += indent + "int " + nan + " = 0;\n";
      em.push_scope();
      open_inner(st, indent, pragma);
      std::string v = em.emit(st.value, indent);
      for (const loop::Store& s : st.stores) out_ += indent + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
      if (minmax && t != DType::Bool) {
        const char* cmp = st.reduce == ops::ReduceOp::Max ? " > " : " < ";
        out_ += indent + acc + " = " + v + cmp + acc + " ? " + v + " : " + acc + ";\n";
        if (track_nan) out_ += indent + nan + " |= (" + v + " != " + v + ");\n";
      } else if (st.reduce == ops::ReduceOp::Prod) {
        out_ += indent + acc + " = " + times(st, acc, v) + ";\n";
      } else {
        out_ += indent + acc + " = " + combine(st.reduce, acc, v, t) + ";\n";
      }
      close_inner(st, indent);
      em.pop_scope();
      if (track_nan) out_ += indent + "if (" + nan + ") " + acc + " = " + (t == DType::Float32 ? "kiln_nan_f()" : "kiln_nan_d()") + ";\n";
      return;
    }
    bool looped = !st.vars.empty();
    if (looped) em.push_scope();
    open_inner(st, indent, looped ? "#pragma omp simd" : "");
    for (const loop::Store& s : st.stores) {
      std::string v = em.emit(s.value, indent);
      out_ += indent + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
    }
    close_inner(st, indent);
    if (looped) em.pop_scope();
  }

  // A floating product over a block torch's kernel vectorizes (Stage::torch_vector_block):
  // the factors in torch's order. Its vectorized_inner_reduction loads the first 4 vectors of
  // V lanes, multiplies each following group of 4V elements into them lane by lane, combines
  // the four as (v0*v1)*(v2*v3), folds the V lanes of that one after another into the output,
  // then the elements past the last full group one at a time. Outer reduced vars (blocks torch
  // could not merge) fold one block after another into the same output, as torch's do.
  // The type torch's CPU kernel multiplies a product's factors in: a 16-bit result's own type
  // (each multiply rounded to it), else the accumulator's.
  static DType product_type(const Stage& st) {
    return is_16bit_float(st.result_dtype) && is_floating(st.acc_dtype) ? st.result_dtype : st.acc_dtype;
  }

  // a * b as one multiply of torch's product kernel (rounded to a 16-bit product type).
  static std::string times(const Stage& st, const std::string& a, const std::string& b) {
    const DType pt = product_type(st);
    if (pt == st.acc_dtype) return a + " * " + b;
    return std::string(pt == DType::Float16 ? "kiln_round_f16(" : "kiln_round_bf16(") + a + " * " + b + ")";
  }

  void write_torch_product(const Stage& st, ScalarEmitter& em, std::string indent, const std::string& acc) {
    const DType t = st.acc_dtype;
    const int V = torch_vector_bytes_ / dtype_size(product_type(st)), L = 4 * V;
    const std::string T = ctype(t), lanes = acc + "_lane", full = acc + "_full", b = acc + "_b", l = acc + "_l";
    const std::string var = st.vars.back().name(), range = st.ranges.back().c_str();
    for (size_t d = 0; d + 1 < st.vars.size(); ++d) {
      const std::string v = st.vars[d].name();
      out_ += indent + "for (kiln_i64 " + v + " = 0; " + v + " < " + st.ranges[d].c_str() + "; ++" + v + ") {\n";
      indent += "  ";
    }
    // Each element's value (and the stores fused at inner points), with `var` bound to `at`.
    auto element = [&](const std::string& at, std::string ind, const std::function<std::string(const std::string&)>& use) {
      em.push_scope();
      out_ += ind + "const kiln_i64 " + var + " = " + at + ";\n";
      std::string v = em.emit(st.value, ind);
      for (const loop::Store& s : st.stores) out_ += ind + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
      out_ += ind + use(v) + "\n";
      em.pop_scope();
    };
    const std::string Ls = std::to_string(L), Vs = std::to_string(V);
    out_ += indent + "{\n";
    std::string in = indent + "  ";
    out_ += in + "const kiln_i64 " + full + " = (" + range + ") / " + Ls + " * " + Ls + ";\n";
    out_ += in + "if (" + full + " > 0) {\n";
    std::string in2 = in + "  ";
    out_ += in2 + T + " " + lanes + "[" + Ls + "];\n";
    out_ += in2 + "for (kiln_i64 " + l + " = 0; " + l + " < " + Ls + "; ++" + l + ") {\n";
    element(l, in2 + "  ", [&](const std::string& v) { return lanes + "[" + l + "] = " + v + ";"; });
    out_ += in2 + "}\n";
    out_ += in2 + "for (kiln_i64 " + b + " = " + Ls + "; " + b + " < " + full + "; " + b + " += " + Ls + ") {\n";
    out_ += in2 + "  #pragma omp simd\n";
    out_ += in2 + "  for (kiln_i64 " + l + " = 0; " + l + " < " + Ls + "; ++" + l + ") {\n";
    element(b + " + " + l, in2 + "    ", [&](const std::string& v) { return lanes + "[" + l + "] = " + times(st, lanes + "[" + l + "]", v) + ";"; });
    out_ += in2 + "  }\n" + in2 + "}\n";
    auto lane = [&](const std::string& j) {
      auto at = [&](int k) { return lanes + "[" + (k ? std::to_string(k * V) + " + " : "") + j + "]"; };
      return "(" + times(st, "(" + times(st, at(0), at(1)) + ")", "(" + times(st, at(2), at(3)) + ")") + ")";
    };
    out_ += in2 + T + " " + acc + "_h = " + lane("0") + ";\n";
    out_ += in2 + "for (kiln_i64 " + l + " = 1; " + l + " < " + Vs + "; ++" + l + ") " + acc + "_h = " + times(st, acc + "_h", lane(l)) + ";\n";
    out_ += in2 + acc + " = " + times(st, acc, acc + "_h") + ";\n";
    out_ += in + "}\n";
    out_ += in + "for (kiln_i64 " + l + " = " + full + "; " + l + " < " + range + "; ++" + l + ") {\n";
    element(l, in + "  ", [&](const std::string& v) { return acc + " = " + times(st, acc, v) + ";"; });
    out_ += in + "}\n";
    out_ += indent + "}\n";
    for (size_t d = 0; d + 1 < st.vars.size(); ++d) {
      indent.resize(indent.size() - 2);
      out_ += indent + "}\n";
    }
  }

  const loop::Program& p_;
  const Kernel& k_;
  std::string& out_;
  int torch_vector_bytes_;
};

}  // namespace

// The prelude's routed libm functions this program calls (see KILN_MVEC_DEFINE there).
std::string libm_definitions(const loop::Program& p) {
  std::set<std::string> fns;
  for (size_t r = 0; r < p.exprs.size(); ++r) {
    switch (p.exprs[static_cast<loop::SRef>(r)].op) {
      case SOp::Exp: case SOp::Sigmoid: fns.insert("exp"); break;
      case SOp::Exp2: fns.insert("exp2"); break;
      case SOp::Expm1: fns.insert("expm1"); break;
      case SOp::Log: fns.insert("log"); break;
      case SOp::Log2: fns.insert("log2"); break;
      case SOp::Log1p: fns.insert("log1p"); break;
      case SOp::Sin: fns.insert("sin"); break;
      case SOp::Cos: fns.insert("cos"); break;
      case SOp::Tan: fns.insert("tan"); break;
      case SOp::Tanh: fns.insert("tanh"); break;
      case SOp::Erf: fns.insert("erf"); break;
      default: break;
    }
  }
  std::string out;
  for (const std::string& f : fns) out += "KILN_MVEC_DEFINE(" + f + ")\n";
  return out.empty() ? out : out + "\n";
}

std::string generate_cpp(const loop::Program& p) { return generate_cpp_units(p, 1)[0]; }

std::vector<std::string> generate_cpp_units(const loop::Program& p, size_t units) {
  std::vector<std::string> texts;
  // A kernel that is the same code as an earlier one (the same fusion in another layer: see
  // kernel_identity.h) is an alias of that one's symbol, defined in its unit: compiled once.
  std::vector<size_t> same_as(p.kernels.size());
  std::unordered_map<std::string, size_t> first_of;
  size_t distinct = 0;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const Kernel& k = p.kernels[i];
    texts.emplace_back();
    KernelWriter(p, k, texts.back(), p.exprs.torch.prod_vector_bytes).write();
    auto [it, fresh] = first_of.emplace(canonical_kernel_text(texts.back(), p, k, "kiln_kernel"), i);
    same_as[i] = it->second;
    if (fresh) {
      ++distinct;
      continue;
    }
    const std::string& target = p.kernels[it->second].name;
    texts.back() = "// " + k.name + ": the same code as " + target + ", over its own buffers\n" + "extern \"C\" void " + k.name +
                   "(void* const* kiln_args) __attribute__((alias(\"" + target + "\")));\n\n";
  }
  units = std::max<size_t>(1, std::min(units, distinct));
  // Longest kernels first, each to the unit with the least code so far; each unit keeps its
  // kernels in program order, an alias in its target's unit.
  std::vector<size_t> order;
  for (size_t i = 0; i < texts.size(); ++i)
    if (same_as[i] == i) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return texts[a].size() > texts[b].size(); });
  std::vector<size_t> load(units, 0), unit_of(texts.size(), 0);
  for (size_t i : order) {
    const size_t u = std::min_element(load.begin(), load.end()) - load.begin();
    unit_of[i] = u;
    load[u] += texts[i].size();
  }
  for (size_t i = 0; i < texts.size(); ++i) unit_of[i] = unit_of[same_as[i]];
  std::vector<std::string> out(units);
  for (size_t u = 0; u < units; ++u) {
    out[u] = "// Generated by kiln. Each kernel fuses the graph ops in its name.\n";
    if (u > 0) out[u] += "#define KILN_SECONDARY_UNIT 1\n";
    out[u] += kCpuPrelude;
    out[u] += "\n";
    if (u == 0) out[u] += libm_definitions(p);
  }
  for (size_t i = 0; i < texts.size(); ++i) out[unit_of[i]] += texts[i];
  return out;
}

}  // namespace kiln::codegen
