#include "core/codegen/cuda_codegen.h"

#include <algorithm>
#include <cmath>
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
      l.block = outer >= 256 ? 256 : 128;
      int64_t blocks = (outer + l.block - 1) / l.block;
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

  const loop::Program& p_;
  const Kernel& k_;
  std::string& out_;
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
