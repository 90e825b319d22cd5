#include "core/codegen/cuda_codegen.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "core/codegen/scalar_emitter.h"
#include "core/sym/shape_env.h"

namespace kiln::codegen {

extern const char* const kCudaPrelude;

namespace {

using loop::Kernel;
using loop::Stage;
using sym::Expr;

int64_t const_product(const std::vector<Expr>& xs) {
  int64_t p = 1;
  for (const Expr& e : xs) p *= e.as_const().value_or(1);
  return p;
}

const char* functor(ops::ReduceOp op) {
  switch (op) {
    case ops::ReduceOp::Sum: return "KilnSum()";
    case ops::ReduceOp::Prod: return "KilnProd()";
    case ops::ReduceOp::Max: return "KilnMax()";
    case ops::ReduceOp::Min: return "KilnMin()";
  }
  return "KilnSum()";
}

std::string acc_init(ops::ReduceOp op, DType t) {
  switch (op) {
    case ops::ReduceOp::Sum: return literal(0, 0, t);
    case ops::ReduceOp::Prod: return literal(1, 1, t);
    case ops::ReduceOp::Max: return is_floating(t) ? literal(-INFINITY, 0, t) : literal(0, int_lowest(t), t);
    case ops::ReduceOp::Min: return is_floating(t) ? literal(INFINITY, 0, t) : literal(0, int_highest(t), t);
  }
  return "0";
}

// Unflattens `lin` into `vars` (row-major over `ranges`).
void unravel(std::string& out, const std::string& indent, const std::string& lin, const std::vector<Expr>& vars,
             const std::vector<Expr>& ranges) {
  std::string rest = lin;
  for (size_t d = vars.size(); d-- > 0;) {
    if (d == 0) {
      out += indent + "const kiln_idx " + vars[d].name() + " = " + rest + ";\n";
    } else {
      // Parenthesized: a symbolic extent is a product (s2*s2), and % binds as tightly as *.
      const std::string r = "(" + ranges[d].c_str() + ")";
      out += indent + "const kiln_idx " + vars[d].name() + " = " + rest + " % " + r + ";\n";
      std::string next = vars[d].name() + "_rest";
      out += indent + "const kiln_idx " + next + " = " + rest + " / " + r + ";\n";
      rest = next;
    }
  }
}

// The accesses of a pointwise kernel that move V neighbouring elements in one instruction:
// those whose index steps by exactly 1 along the innermost loop and is a multiple of V where
// that loop starts a group of V (every other stride and the offset are multiples of V).
struct VectorPlan {
  int width = 0;  // V; 0 when the kernel stays scalar
  std::vector<std::pair<int, Expr>> loads;  // (buffer, index)
  std::vector<const loop::Store*> stores;
};

void visit_loads(const loop::ScalarCtx& s, loop::SRef r, std::set<loop::SRef>& seen,
                 const std::function<void(const loop::SNode&)>& f) {
  if (r < 0 || !seen.insert(r).second) return;
  const loop::SNode& n = s[r];
  if (n.op == loop::SOp::Load) f(n);
  visit_loads(s, n.a, seen, f);
  visit_loads(s, n.b, seen, f);
  visit_loads(s, n.c, seen, f);
}

bool steps_by_one(const Expr& index, const std::vector<Expr>& vars, int width) {
  auto a = sym::affine(index, vars);
  if (!a || !a->coeffs.back().is_const(1)) return false;
  for (size_t d = 0; d + 1 < vars.size(); ++d) {
    auto c = a->coeffs[d].as_const();
    if (!c || *c % width) return false;
  }
  auto off = a->offset.as_const();
  return off && *off % width == 0;
}

VectorPlan plan_vectors(const loop::Program& p, const Kernel& k) {
  VectorPlan plan;
  if (k.vars.empty() || k.stages.size() != 1 || k.stages[0].kind == Stage::Kind::Reduce) return plan;
  auto outer = sym::product(k.ranges).as_const();
  auto inner = k.ranges.back().as_const();
  if (!outer || !inner || *outer < 4096) return plan;  // small kernels: launch-bound anyway
  std::set<int> stored;
  for (const loop::Store& st : k.stages[0].stores)
    if (!stored.insert(st.buffer).second) return plan;  // one store a buffer
  std::vector<const loop::SNode*> loads;
  std::set<loop::SRef> seen;
  for (const loop::Store& st : k.stages[0].stores)
    visit_loads(p.exprs, st.value, seen, [&](const loop::SNode& n) { loads.push_back(&n); });
  size_t widest = 0;
  auto widen = [&](int buffer) { widest = std::max<size_t>(widest, dtype_size(p.buffers[buffer].dtype)); };
  for (const loop::Store& st : k.stages[0].stores) widen(st.buffer);
  for (const loop::SNode* n : loads)
    if (!stored.count(n->buffer)) widen(n->buffer);
  if (widest == 0 || widest > 8) return plan;
  const int width = static_cast<int>(std::min<size_t>(8, 16 / widest));
  if (width < 2 || *inner % width) return plan;
  for (const loop::Store& st : k.stages[0].stores)
    if (steps_by_one(st.index, k.vars, width)) plan.stores.push_back(&st);
  std::set<std::pair<int, std::string>> taken;
  for (const loop::SNode* n : loads)
    if (!stored.count(n->buffer) && steps_by_one(n->index, k.vars, width) &&
        taken.insert({n->buffer, n->index.str()}).second)
      plan.loads.push_back({n->buffer, n->index});
  if (plan.loads.empty() && plan.stores.empty()) return plan;
  plan.width = width;
  return plan;
}

class CudaKernelWriter {
 public:
  CudaKernelWriter(const loop::Program& p, const Kernel& k, std::string& out) : p_(p), k_(k), out_(out) {}

  CudaLaunch write() {
    std::set<int> stored;
    for (const Stage& st : k_.stages)
      for (const loop::Store& s : st.stores) stored.insert(s.buffer);
    bool rowwise = false;
    int64_t inner = 1;
    for (const Stage& st : k_.stages)
      if (!st.vars.empty()) rowwise = true, inner = std::max(inner, const_product(st.ranges));
    // Symbolic extents: the block is sized for the sizes the entry was captured at (the
    // shape environment's hints), else the widest.
    bool symbolic_inner = false;
    for (const Stage& st : k_.stages) {
      if (st.vars.empty() || sym::product(st.ranges).as_const()) continue;
      if (auto h = sym::size_hint(sym::product(st.ranges))) inner = std::max(inner, *h);
      else symbolic_inner = true;
    }
    const Expr outer_e = sym::product(k_.ranges);
    const bool symbolic_outer = !outer_e.as_const();
    const int64_t outer = symbolic_outer ? int64_t(1) << 20 : *outer_e.as_const();
    outer_ = symbolic_outer ? outer_e.c_str() : std::to_string(outer);
    CudaLaunch l;
    l.name = k_.name;
    if (rowwise) {
      // About 8 elements a thread, at most 256 threads: enough work per thread to hide load
      // latency, few warps for the block-wide reductions to combine.
      l.block = 32;
      while (l.block < 256 && (symbolic_inner || int64_t(l.block) * 8 < inner)) l.block *= 2;
      l.grid = static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(outer, 1), 1 << 30));
      if (symbolic_outer) l.grid_expr = sym::min(sym::max(outer_e, 1), Expr(int64_t(1) << 30));
    } else {
      vec_ = plan_vectors(p_, k_);
      const int64_t points = vec_.width ? outer / vec_.width : outer;  // a thread's step
      l.block = points >= 256 ? 256 : 128;
      int64_t blocks = (points + l.block - 1) / l.block;
      l.grid = static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 132 * 64));
      if (symbolic_outer)
        l.grid_expr = sym::min(sym::max(sym::floordiv(outer_e + Expr(int64_t(l.block) - 1), Expr(int64_t(l.block))), 1),
                               Expr(132 * 64));
    }
    block_ = l.block;
    out_ += "// " + k_.name + ": fuses " + std::to_string(k_.ops.size()) + " op(s)\n";
    out_ += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(l.block) + ") " + k_.name + "(";
    for (size_t i = 0; i < k_.buffers.size(); ++i) {
      const loop::Buffer& b = p_.buffers[k_.buffers[i]];
      std::string cv = stored.count(b.id) ? "" : "const ";
      out_ += (i ? ", " : "") + cv + ctype(b.dtype) + "* __restrict__ " + b.name;
    }
    for (const loop::SymbolBinding& sb : p_.symbols) out_ += ", const long long " + sb.symbol.name();
    out_ += ") {\n";
    ScalarEmitter em(p_, out_, [](int acc) { return "acc" + std::to_string(acc); });
    std::string indent = "  ";
    if (rowwise) {
      out_ += indent + "__shared__ double kiln_smem_raw[32];\n";
      out_ += indent + "for (kiln_idx kiln_row = blockIdx.x; kiln_row < " + outer_ +
              "; kiln_row += gridDim.x) {\n";
      indent += "  ";
      unravel(out_, indent, "kiln_row", k_.vars, k_.ranges);
      for (const Stage& st : k_.stages) write_row_stage(st, em, indent);
      out_ += "  }\n";
    } else {
      if (vec_.width) {
        write_vectorized(em, indent);
        out_ += indent + "else\n";
      }
      out_ += indent + "#pragma unroll 4\n";  // several independent loads in flight per thread
      out_ += indent + "for (kiln_idx kiln_lin = (kiln_idx)blockIdx.x * " + std::to_string(l.block) +
              " + threadIdx.x; kiln_lin < " + outer_ + "; kiln_lin += (kiln_idx)gridDim.x * " +
              std::to_string(l.block) + ") {\n";
      indent += "  ";
      unravel(out_, indent, "kiln_lin", k_.vars, k_.ranges);
      for (const Stage& st : k_.stages) {
        if (st.kind == Stage::Kind::Reduce) {
          // A reduction over an empty inner space (size-1 dims): one combine with the init.
          std::string acc = "acc" + std::to_string(st.acc);
          std::string v = em.emit(st.value, indent);
          out_ += indent + ctype(st.acc_dtype) + " " + acc + " = " + functor(st.reduce) + "(" +
                  acc_init(st.reduce, st.acc_dtype) + ", " + v + ");\n";
        }
        for (const loop::Store& s : st.stores) {
          std::string v = em.emit(s.value, indent);
          out_ += indent + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
        }
      }
      out_ += "  }\n";
    }
    out_ += "}\n\n";
    return l;
  }

 private:
  void write_row_stage(const Stage& st, ScalarEmitter& em, const std::string& indent) {
    std::string in2 = indent + "  ";
    if (st.kind == Stage::Kind::Reduce) {
      std::string acc = "acc" + std::to_string(st.acc);
      std::string t = ctype(st.acc_dtype);
      out_ += indent + t + " " + acc + " = " + acc_init(st.reduce, st.acc_dtype) + ";\n";
      out_ += indent + "#pragma unroll 4\n";
      out_ += indent + "for (kiln_idx kiln_q = threadIdx.x; kiln_q < " + sym::product(st.ranges).c_str() +
              "; kiln_q += " + std::to_string(block_) + ") {\n";
      em.push_scope();
      unravel(out_, in2, "kiln_q", st.vars, st.ranges);
      std::string v = em.emit(st.value, in2);
      for (const loop::Store& s : st.stores) out_ += in2 + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
      out_ += in2 + acc + " = " + functor(st.reduce) + "(" + acc + ", " + v + ");\n";
      em.pop_scope();
      out_ += indent + "}\n";
      out_ += indent + acc + " = kiln_block_reduce(" + acc + ", " + functor(st.reduce) + ", reinterpret_cast<" + t +
              "*>(kiln_smem_raw));\n";
      return;
    }
    if (st.vars.empty()) {
      // Outer-point stores: every thread holds the values; one writes.
      out_ += indent + "if (threadIdx.x == 0) {\n";
      em.push_scope();
      for (const loop::Store& s : st.stores) {
        std::string v = em.emit(s.value, in2);
        out_ += in2 + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
      }
      em.pop_scope();
      out_ += indent + "}\n";
      return;
    }
    out_ += indent + "#pragma unroll 4\n";
    out_ += indent + "for (kiln_idx kiln_q = threadIdx.x; kiln_q < " + sym::product(st.ranges).c_str() +
            "; kiln_q += " + std::to_string(block_) + ") {\n";
    em.push_scope();
    unravel(out_, in2, "kiln_q", st.vars, st.ranges);
    for (const loop::Store& s : st.stores) {
      std::string v = em.emit(s.value, in2);
      out_ += in2 + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
    }
    em.pop_scope();
    out_ += indent + "}\n";
  }

  // The loop over groups of V points, taken when every vector access is aligned at run time
  // (a view's offset may not be): the vector loads, V bodies reading their elements, then the
  // vector stores. The scalar loop after it handles the unaligned case.
  void write_vectorized(ScalarEmitter& em, const std::string& indent) {
    const int V = vec_.width;
    const std::string Vs = std::to_string(V);
    auto vec_type = [&](int buffer) { return "kiln_vec<" + ctype(p_.buffers[buffer].dtype) + ", " + Vs + ">"; };
    std::string aligned;
    auto check = [&](int buffer) {
      const loop::Buffer& b = p_.buffers[buffer];
      aligned += std::string(aligned.empty() ? "" : " && ") + "(reinterpret_cast<unsigned long long>(" + b.name +
                 ") % sizeof(" + vec_type(buffer) + ") == 0)";
    };
    for (const auto& [buffer, index] : vec_.loads) check(buffer);
    for (const loop::Store* st : vec_.stores) check(st->buffer);
    out_ += indent + "if (" + aligned + ")\n";
    out_ += indent + "for (kiln_idx kiln_g = (kiln_idx)blockIdx.x * " + std::to_string(block_) +
            " + threadIdx.x; kiln_g < " + outer_ + " / " + Vs + "; kiln_g += (kiln_idx)gridDim.x * " +
            std::to_string(block_) + ") {\n";
    const std::string in2 = indent + "  ", in3 = in2 + "  ";
    // Where the group starts: the innermost extent is a multiple of V, so the group lies in one row.
    out_ += in2 + "const kiln_idx kiln_lin0 = kiln_g * " + Vs + ";\n";
    std::map<std::pair<int, std::string>, std::string> element;  // (buffer, index) -> vector name
    // The outer loop vars are the group's; the innermost is its first point's plus kiln_j.
    const std::string inner = k_.vars.back().name(), inner0 = inner + "_0";
    const std::vector<Expr> outer_vars(k_.vars.begin(), k_.vars.end() - 1), outer_ranges(k_.ranges.begin(), k_.ranges.end() - 1);
    if (outer_vars.empty()) {
      out_ += in2 + "const kiln_idx " + inner0 + " = kiln_lin0;\n";
    } else {
      const std::string r = "(" + k_.ranges.back().c_str() + ")";
      out_ += in2 + "const kiln_idx " + inner0 + " = kiln_lin0 % " + r + ";\n";
      out_ += in2 + "const kiln_idx kiln_row0 = kiln_lin0 / " + r + ";\n";
      unravel(out_, in2, "kiln_row0", outer_vars, outer_ranges);
    }
    out_ += in2 + "kiln_idx kiln_at[" + std::to_string(vec_.loads.size() + vec_.stores.size()) + "];\n";
    out_ += in2 + "{\n";
    out_ += in3 + "const kiln_idx " + inner + " = " + inner0 + ";\n";
    size_t slot = 0;
    for (const auto& [buffer, index] : vec_.loads) out_ += in3 + "kiln_at[" + std::to_string(slot++) + "] = " + index.c_str() + ";\n";
    for (const loop::Store* st : vec_.stores) out_ += in3 + "kiln_at[" + std::to_string(slot++) + "] = " + st->index.c_str() + ";\n";
    out_ += in2 + "}\n";
    slot = 0;
    for (const auto& [buffer, index] : vec_.loads) {
      const std::string name = "kiln_v" + std::to_string(slot);
      out_ += in2 + "const " + vec_type(buffer) + " " + name + " = *reinterpret_cast<const " + vec_type(buffer) + "*>(" +
              p_.buffers[buffer].name + " + kiln_at[" + std::to_string(slot) + "]);\n";
      element[{buffer, index.str()}] = name + ".v[kiln_j]";
      ++slot;
    }
    std::vector<std::string> out_names;
    for (const loop::Store* st : vec_.stores) {
      out_names.push_back("kiln_v" + std::to_string(slot++));
      out_ += in2 + vec_type(st->buffer) + " " + out_names.back() + ";\n";
    }
    out_ += in2 + "#pragma unroll\n";
    out_ += in2 + "for (int kiln_j = 0; kiln_j < " + Vs + "; ++kiln_j) {\n";
    out_ += in3 + "const kiln_idx " + inner + " = " + inner0 + " + kiln_j;\n";
    em.push_scope();
    em.element_of = [&](const loop::SNode& n) {
      auto it = element.find({n.buffer, n.index.str()});
      return it == element.end() ? std::string() : it->second;
    };
    for (const loop::Store& s : k_.stages[0].stores) {
      std::string v = em.emit(s.value, in3);
      auto it = std::find(vec_.stores.begin(), vec_.stores.end(), &s);
      if (it == vec_.stores.end()) {
        out_ += in3 + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
      } else {
        out_ += in3 + store_to(p_.buffers[s.buffer], out_names[it - vec_.stores.begin()] + ".v[kiln_j]", v) + "\n";
      }
    }
    em.element_of = nullptr;
    em.pop_scope();
    out_ += in2 + "}\n";
    slot = vec_.loads.size();
    for (size_t i = 0; i < vec_.stores.size(); ++i, ++slot) {
      const loop::Store* st = vec_.stores[i];
      out_ += in2 + "*reinterpret_cast<" + vec_type(st->buffer) + "*>(" + p_.buffers[st->buffer].name + " + kiln_at[" +
              std::to_string(slot) + "]) = " + out_names[i] + ";\n";
    }
    out_ += indent + "}\n";
  }

  const loop::Program& p_;
  const Kernel& k_;
  std::string& out_;
  VectorPlan vec_;
  unsigned block_ = 256;
  std::string outer_;  // the outer space's point count, as source text
};

// 32-bit index arithmetic is much cheaper on the GPU; it is exact while every buffer spans
// fewer than 2^31 elements and every iteration space has fewer points.
bool fits_int32(const loop::Program& p) {
  const int64_t limit = (int64_t{1} << 31) - 1;
  for (const loop::Buffer& b : p.buffers) {
    if (!b.live) continue;
    auto bytes = b.bytes().as_const();
    if (!bytes || *bytes / dtype_size(b.dtype) >= limit) return false;
  }
  for (const Kernel& k : p.kernels) {
    if (!sym::product(k.ranges).as_const()) return false;  // shape-generic: sizes unknown
    if (const_product(k.ranges) * 2 >= limit) return false;
    for (const Stage& st : k.stages)
      if (!sym::product(st.ranges).as_const() ||
          const_product(k.ranges) * std::max<int64_t>(const_product(st.ranges), 1) >= limit)
        return false;
  }
  return true;
}

}  // namespace

CudaSource generate_cuda(const loop::Program& p) {
  CudaSource s;
  s.source = "// Generated by kiln. Each kernel fuses the graph ops in its name.\n";
  s.source += kCudaPrelude;
  s.source += fits_int32(p) ? "typedef int kiln_idx;\n\n" : "typedef long long kiln_idx;\n\n";
  s.header = s.source;
  for (const Kernel& k : p.kernels) {
    const size_t start = s.source.size();
    s.launches.push_back(CudaKernelWriter(p, k, s.source).write());
    s.kernels.push_back(s.source.substr(start));
  }
  return s;
}

}  // namespace kiln::codegen
