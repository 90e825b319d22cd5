#include "core/codegen/cuda_codegen.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "core/codegen/scalar_emitter.h"
#include "core/sym/shape_env.h"

namespace kiln::codegen {

extern const char* const kCudaPrelude;

namespace {

using loop::SOp;
using loop::Kernel;
using loop::Stage;
using loop::visit_loads;
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

// Unflattens `first`, the first point of a group of V that lies in one row (the innermost extent
// is a multiple of V), into `vars`: the outer ones as they are, the innermost as <var>_0, which
// the group's bodies step by kiln_j.
void unravel_group(std::string& out, const std::string& indent, const std::string& first, const std::vector<Expr>& vars,
                   const std::vector<Expr>& ranges) {
  const std::string inner0 = vars.back().name() + "_0";
  if (vars.size() == 1) {
    out += indent + "const kiln_idx " + inner0 + " = " + first + ";\n";
    return;
  }
  const std::string r = "(" + ranges.back().c_str() + ")", rest = first + "_rest";
  out += indent + "const kiln_idx " + inner0 + " = " + first + " % " + r + ";\n";
  out += indent + "const kiln_idx " + rest + " = " + first + " / " + r + ";\n";
  unravel(out, indent, rest, std::vector<Expr>(vars.begin(), vars.end() - 1), std::vector<Expr>(ranges.begin(), ranges.end() - 1));
}

// kiln_at[i]: where `indices[i]` points at a group's first element (innermost var <var>_0).
void write_bases(std::string& out, const std::string& indent, const Expr& innermost, const std::vector<std::string>& indices) {
  if (indices.empty()) return;
  out += indent + "kiln_idx kiln_at[" + std::to_string(indices.size()) + "];\n";
  out += indent + "{\n";
  out += indent + "  const kiln_idx " + innermost.name() + " = " + innermost.name() + "_0;\n";
  for (size_t i = 0; i < indices.size(); ++i) out += indent + "  kiln_at[" + std::to_string(i) + "] = " + indices[i] + ";\n";
  out += indent + "}\n";
}

// The accesses of a pointwise kernel that move V neighbouring elements in one instruction:
// those whose index steps by exactly 1 along the innermost loop and is a multiple of V where
// that loop starts a group of V (every other stride and the offset are multiples of V).
struct VectorPlan {
  int width = 0;  // V; 0 when the kernel stays scalar
  std::vector<std::pair<int, Expr>> loads;  // (buffer, index)
  std::vector<const loop::Store*> stores;
};

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

// How a row-reduction kernel walks its rows when their length is a known constant: each row
// belongs to one warp (short rows, many of them) or to the whole block, a thread takes groups of
// V neighbouring elements (one 16-byte load where the accesses step by one), and the elements
// that several stages read (layer_norm's input: mean, variance, then the output) are loaded
// once into registers and reused, so the row is read from memory once.
// A plan that is not persistent is empty: the kernel streams, a row per block.
struct RowPlan {
  bool persistent = false;
  bool warp_rows = false;     // a row per warp (else a row per block)
  int width = 1;              // V
  int64_t points = 0;         // elements of a row
  // Values a stage computes per element and a later stage uses again (layer_norm's x + residual:
  // its mean, its variance and the output all need it), held in registers from the first stage
  // that computes them; a later stage reads the register instead of loading and computing again.
  std::vector<loop::SRef> held_values;
  std::vector<size_t> held_stage;             // the stage that computes each
  std::vector<std::pair<int, Expr>> cached;   // (buffer, index) loaded once per row, in registers
  size_t prefetched = 0;  // the last `prefetched` of `cached`: read by one stage, loaded early
  std::vector<std::pair<int, Expr>> vector_loads;  // read a group at a time where they are used
  std::vector<const loop::Store*> vector_stores;
};

constexpr int kRowsPerWarpBlock = 4;   // warp rows: a block of 4 warps
constexpr int64_t kMaxRowRegisters = 64;  // cached elements a thread may hold
constexpr int64_t kMaxPrefetchRegisters = 96;  // with the loads prefetched (RowPlan::prefetched)

RowPlan plan_rows(const loop::Program& p, const Kernel& k, unsigned block, int warp_rows_choice) {
  RowPlan plan;
  const Stage* looping = nullptr;
  for (const Stage& st : k.stages) {
    if (st.vars.empty()) {
      if (st.kind == Stage::Kind::Reduce) return plan;
      continue;
    }
    if (looping && looping->vars != st.vars) return plan;
    looping = &st;
  }
  if (!looping) return plan;
  auto outer = sym::product(k.ranges).as_const();
  auto n = sym::product(looping->ranges).as_const();
  auto innermost = looping->ranges.back().as_const();
  if (!outer || !n || !innermost || *n < 1) return plan;
  const bool warp_rows = warp_rows_choice < 0 ? *n <= 1024 && *outer >= 256 : warp_rows_choice == 1;
  const int64_t lanes = warp_rows ? 32 : block;
  std::vector<Expr> all = k.vars;
  all.insert(all.end(), looping->vars.begin(), looping->vars.end());
  std::set<int> stored;
  for (const Stage& st : k.stages)
    for (const loop::Store& s : st.stores) stored.insert(s.buffer);
  // Values several stages compute (held in registers; see RowPlan::held_values). A value is
  // worth a register when it walks the row and is more than a load (cached below) or a
  // constant; a stage's reduction results are final by the time a later stage reads them.
  std::map<loop::SRef, bool> walks_memo;
  std::function<bool(loop::SRef)> walks_row = [&](loop::SRef r) -> bool {
    if (r < 0) return false;
    if (auto it = walks_memo.find(r); it != walks_memo.end()) return it->second;
    const loop::SNode& nd = p.exprs[r];
    bool w = false;
    if (nd.op == SOp::Load || nd.op == SOp::Index)
      for (const Expr& v : looping->vars) w |= sym::depends_on(nd.index, v);
    w = w || walks_row(nd.a) || walks_row(nd.b) || walks_row(nd.c);
    return walks_memo[r] = w;
  };
  auto roots = [](const Stage& st) {
    std::vector<loop::SRef> r;
    if (st.kind == Stage::Kind::Reduce) r.push_back(st.value);
    for (const loop::Store& s : st.stores) r.push_back(s.value);
    return r;
  };
  // Every value under `r` (into `out`), not looking under those in `stop`.
  std::function<void(loop::SRef, const std::set<loop::SRef>&, std::set<loop::SRef>&)> under =
      [&](loop::SRef r, const std::set<loop::SRef>& stop, std::set<loop::SRef>& out) {
        if (r < 0 || stop.count(r) || !out.insert(r).second) return;
        const loop::SNode& nd = p.exprs[r];
        under(nd.a, stop, out), under(nd.b, stop, out), under(nd.c, stop, out);
      };
  std::map<loop::SRef, size_t> computed_in;  // by the row-walking stages so far: the first one
  std::set<loop::SRef> held;                 // held in registers
  for (size_t i = 0; i < k.stages.size(); ++i) {
    const Stage& st = k.stages[i];
    if (st.vars.empty()) continue;
    std::set<loop::SRef> seen;
    std::function<void(loop::SRef)> visit = [&](loop::SRef r) {
      if (r < 0 || !seen.insert(r).second || held.count(r)) return;
      const loop::SNode& nd = p.exprs[r];
      const bool value = nd.op != SOp::Const && nd.op != SOp::Load && nd.op != SOp::Acc && nd.op != SOp::Index &&
                         nd.op != SOp::Arg;
      if (auto it = computed_in.find(r); value && it != computed_in.end() && walks_row(r)) {
        held.insert(r);
        plan.held_values.push_back(r);
        plan.held_stage.push_back(it->second);
        return;
      }
      visit(nd.a), visit(nd.b), visit(nd.c);
    };
    for (loop::SRef r : roots(st)) visit(r);
    std::set<loop::SRef> mine;
    for (loop::SRef r : roots(st)) under(r, held, mine);
    for (loop::SRef r : mine) computed_in.emplace(r, i);
  }
  // Loads that walk the row, and how many stages read each (not counting the reads under a
  // value a stage takes from a register).
  std::vector<std::pair<const loop::SNode*, int>> row_loads;
  std::vector<size_t> first_reader;  // per row load: the first stage that reads it
  size_t first_walk = k.stages.size();
  for (size_t si = 0; si < k.stages.size(); ++si) {
    const Stage& st = k.stages[si];
    if (st.vars.empty()) continue;
    first_walk = std::min(first_walk, si);
    std::set<loop::SRef> seen;
    for (size_t h = 0; h < plan.held_values.size(); ++h)
      if (plan.held_stage[h] < si) seen.insert(plan.held_values[h]);
    std::set<std::string> in_stage;
    auto visit = [&](const loop::SNode& ld) {
      bool walks = false;
      for (const Expr& v : looping->vars) walks |= sym::depends_on(ld.index, v);
      if (!walks || stored.count(ld.buffer)) return;
      const std::string key = std::to_string(ld.buffer) + ":" + ld.index.str();
      if (!in_stage.insert(key).second) return;
      for (auto& [other, count] : row_loads)
        if (other->buffer == ld.buffer && other->index == ld.index) return void(++count);
      row_loads.push_back({&ld, 1});
      first_reader.push_back(si);
    };
    if (st.kind == Stage::Kind::Reduce) visit_loads(p.exprs, st.value, seen, visit);
    for (const loop::Store& s : st.stores) visit_loads(p.exprs, s.value, seen, visit);
  }
  // The widest element among the vector accesses sets V (16 bytes), when the row's innermost
  // extent is a multiple of it.
  size_t widest = 1;
  for (auto& [ld, count] : row_loads) widest = std::max<size_t>(widest, dtype_size(p.buffers[ld->buffer].dtype));
  for (const loop::Store& s : looping->stores) widest = std::max<size_t>(widest, dtype_size(p.buffers[s.buffer].dtype));
  int width = static_cast<int>(std::min<size_t>(8, 16 / std::min<size_t>(widest, 16)));
  while (width > 1 && (*innermost % width || *n / width < lanes / 2)) width /= 2;
  // Groups a thread walks, unrolled: long rows keep the streaming loop.
  const int64_t trips = (*n / width + lanes - 1) / lanes, per_thread = trips * width;
  if (trips > 16 || (*n + lanes - 1) / lanes > 64) return plan;
  while (!plan.held_values.empty() && int64_t(plan.held_values.size()) * per_thread > kMaxRowRegisters)
    plan.held_values.pop_back(), plan.held_stage.pop_back();  // recomputed where they are used
  int64_t registers = int64_t(plan.held_values.size()) * per_thread;
  std::vector<bool> cache(row_loads.size(), false);
  for (size_t i = 0; i < row_loads.size(); ++i)
    if (row_loads[i].second > 1 && registers + per_thread <= kMaxRowRegisters) registers += per_thread, cache[i] = true;
  // A load only a stage after a reduction reads (layer_norm's weight and bias, read once the
  // mean and variance are known) is issued with the row's first loads: its latency then hides
  // behind theirs and the reductions', where it would otherwise stand after both.
  std::vector<bool> prefetch(row_loads.size(), false);
  for (size_t i = 0; i < row_loads.size(); ++i) {
    const loop::SNode* ld = row_loads[i].first;
    if (cache[i] || first_reader[i] == first_walk || (width > 1 && !steps_by_one(ld->index, all, width))) continue;
    if (registers + per_thread > kMaxPrefetchRegisters) break;
    registers += per_thread, prefetch[i] = true;
  }
  for (size_t i = 0; i < row_loads.size(); ++i) {
    const loop::SNode* ld = row_loads[i].first;
    if (cache[i]) plan.cached.push_back({ld->buffer, ld->index});
    else if (!prefetch[i] && width > 1 && steps_by_one(ld->index, all, width)) plan.vector_loads.push_back({ld->buffer, ld->index});
  }
  for (size_t i = 0; i < row_loads.size(); ++i)
    if (prefetch[i]) plan.cached.push_back({row_loads[i].first->buffer, row_loads[i].first->index}), ++plan.prefetched;
  if (width > 1)
    for (const Stage& st : k.stages)
      for (const loop::Store& s : st.stores)
        if (!st.vars.empty() && steps_by_one(s.index, all, width)) plan.vector_stores.push_back(&s);
  // Cached loads are read by groups too: with V > 1 they must step by one.
  if (width > 1)
    for (auto& [b, idx] : plan.cached)
      if (!steps_by_one(idx, all, width)) return RowPlan{};
  plan.persistent = true;
  plan.warp_rows = warp_rows;
  plan.width = width;
  plan.points = *n;
  return plan;
}

// How a reduction over an outer dim is walked when the kept dim is the contiguous one (a bias's
// gradient: the sum over rows of a [rows, features] tensor; a channels-last batch norm's
// statistics over N, H and W): a row per warp would read one element per 32-byte sector. Here
// the 32 lanes of a warp take 32 neighbouring output points (coalesced loads), the block's R
// warps split the reduced points among them, and the R partial results meet in shared memory.
// Taken for the kernels loop::reduces_columns describes (the CPU generator puts the same
// neighbouring outputs in vector lanes), at least 8 outputs and 64 reduced points each.
struct ColumnPlan {
  bool columns = false;
  int parts = 0;        // R: warps of a block splitting the reduced points
  int64_t tiles = 0;    // 32 outer points each
  int64_t points = 0;   // reduced points per output
};

ColumnPlan plan_columns(const loop::Program& p, const Kernel& k) {
  ColumnPlan plan;
  if (!loop::reduces_columns(p, k)) return plan;
  const Stage* reduce = nullptr;
  for (const Stage& st : k.stages)
    if (!st.vars.empty()) reduce = &st;
  auto outer = sym::product(k.ranges).as_const();
  auto n = sym::product(reduce->ranges).as_const();
  if (!outer || !n || *outer < 8 || *n < 64) return plan;
  plan.columns = true;
  plan.tiles = (*outer + 31) / 32;
  plan.points = *n;
  // Few tiles: more warps a block, so more of the GPU reads; never more warps than a few
  // points each.
  int parts = plan.tiles >= 264 ? 8 : 32;
  while (parts > 1 && *n < int64_t(parts) * 4) parts /= 2;
  plan.parts = parts;
  return plan;
}

class CudaKernelWriter {
 public:
  CudaKernelWriter(const loop::Program& p, const Kernel& k, const LaunchChoice& choice, std::string& out)
      : p_(p), k_(k), choice_(choice), out_(out) {}

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
    if (rowwise && !symbolic_outer && !symbolic_inner) cols_ = plan_columns(p_, k_);
    if (cols_.columns) {
      l.block = static_cast<unsigned>(32 * cols_.parts);
      l.grid = static_cast<unsigned>(std::min<int64_t>(cols_.tiles, 1 << 30));
    } else if (rowwise) {
      // About 8 elements a thread, at most 256 threads: enough work per thread to hide load
      // latency, few warps for the block-wide reductions to combine.
      l.block = 32;
      while (l.block < 256 && (symbolic_inner || int64_t(l.block) * 8 < inner)) l.block *= 2;
      if (choice_.block) l.block = choice_.block;
      l.grid = static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(outer, 1), 1 << 30));
      if (symbolic_outer) l.grid_expr = sym::min(sym::max(outer_e, 1), Expr(int64_t(1) << 30));
      if (!symbolic_outer && !symbolic_inner) rows_ = plan_rows(p_, k_, l.block, choice_.warp_rows);
      if (rows_.persistent && rows_.warp_rows) {
        l.block = 32 * kRowsPerWarpBlock;
        l.grid = static_cast<unsigned>(std::min<int64_t>((outer + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock, 1 << 30));
      }
    } else {
      if (choice_.vectorize) vec_ = plan_vectors(p_, k_);
      const int64_t points = vec_.width ? outer / vec_.width : outer;  // a thread's step
      l.block = choice_.block ? choice_.block : points >= 256 ? 256 : 128;
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
    for (int i : loop::scalar_args_of(p_, k_)) out_ += ", const double " + arg_name(i);
    out_ += ") {\n";
    ScalarEmitter em(p_, out_, [](int acc) { return "acc" + std::to_string(acc); });
    std::string indent = "  ";
    if (cols_.columns) {
      write_columns(em, indent);
    } else if (rows_.persistent) {
      write_persistent_rows(em, indent);
    } else if (rowwise) {
      out_ += indent + "__shared__ double kiln_smem_raw[32];\n";
      out_ += indent + "for (kiln_idx kiln_row = blockIdx.x; kiln_row < " + outer_ +
              "; kiln_row += gridDim.x) {\n";
      indent += "  ";
      unravel(out_, indent, "kiln_row", k_.vars, k_.ranges);
      for (const Stage& st : k_.stages) write_row_stage(st, em, indent);
      out_ += "  }\n";
    } else if (vec_.width && !write_vectorized(em, indent)) {
      // Every vector access is to a buffer known aligned, and the groups cover every point.
    } else {
      if (vec_.width) out_ += indent + "else\n";
      const std::string first = "(kiln_idx)blockIdx.x * " + std::to_string(l.block) + " + threadIdx.x";
      if (!symbolic_outer && int64_t(l.grid) * l.block >= outer) {
        // One point per thread: no loop, so NVRTC compiles the body once (an unrolled loop
        // over sin and cos took 60 of a 1-element kernel's 140 ms).
        out_ += indent + "if (const kiln_idx kiln_lin = " + first + "; kiln_lin < " + outer_ + ") {\n";
      } else {
        // Several independent loads in flight per thread where the loop is the hot path; the
        // scalar loop behind a vector loop only runs for misaligned views, and is not unrolled.
        out_ += indent + (vec_.width ? "#pragma unroll 1\n" : "#pragma unroll 4\n");
        out_ += indent + "for (kiln_idx kiln_lin = " + first + "; kiln_lin < " + outer_ +
                "; kiln_lin += (kiln_idx)gridDim.x * " + std::to_string(l.block) + ") {\n";
      }
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
  // The threads that share a row: a warp's lanes, or the whole block.
  std::string row_lane() const { return rows_.warp_rows ? "kiln_lane" : "threadIdx.x"; }
  int64_t row_lanes() const { return rows_.warp_rows ? 32 : block_; }
  std::string row_reduce(const std::string& acc, const std::string& op, const std::string& t) const {
    if (rows_.warp_rows) return "kiln_warp_reduce(" + acc + ", " + op + ")";
    return "kiln_block_reduce(" + acc + ", " + op + ", reinterpret_cast<" + t + "*>(kiln_smem_raw))";
  }

  void write_row_stage(const Stage& st, ScalarEmitter& em, const std::string& indent) {
    std::string in2 = indent + "  ";
    if (st.kind == Stage::Kind::Reduce) {
      std::string acc = "acc" + std::to_string(st.acc);
      std::string t = ctype(st.acc_dtype);
      out_ += indent + t + " " + acc + " = " + acc_init(st.reduce, st.acc_dtype) + ";\n";
      out_ += indent + "#pragma unroll 4\n";
      out_ += indent + "for (kiln_idx kiln_q = " + row_lane() + "; kiln_q < " + sym::product(st.ranges).c_str() +
              "; kiln_q += " + std::to_string(row_lanes()) + ") {\n";
      em.push_scope();
      unravel(out_, in2, "kiln_q", st.vars, st.ranges);
      std::string v = em.emit(st.value, in2);
      for (const loop::Store& s : st.stores) out_ += in2 + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
      out_ += in2 + acc + " = " + functor(st.reduce) + "(" + acc + ", " + v + ");\n";
      em.pop_scope();
      out_ += indent + "}\n";
      out_ += indent + acc + " = " + row_reduce(acc, functor(st.reduce), t) + ";\n";
      return;
    }
    if (st.vars.empty()) {
      // Outer-point stores: every thread holds the values; one writes.
      out_ += indent + "if (" + row_lane() + " == 0) {\n";
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
    out_ += indent + "for (kiln_idx kiln_q = " + row_lane() + "; kiln_q < " + sym::product(st.ranges).c_str() +
            "; kiln_q += " + std::to_string(row_lanes()) + ") {\n";
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
  // vector stores. The scalar loop after it handles the unaligned case. Returns whether that
  // case can happen: false when every buffer accessed by vectors is known aligned.
  bool write_vectorized(ScalarEmitter& em, const std::string& indent) {
    const int V = vec_.width;
    const std::string Vs = std::to_string(V);
    auto vtype = [&](int buffer) { return vec_type(buffer, V); };
    std::string aligned;
    auto check = [&](int buffer) {
      const loop::Buffer& b = p_.buffers[buffer];
      if (b.aligned) return;
      aligned += std::string(aligned.empty() ? "" : " && ") + "(reinterpret_cast<unsigned long long>(" + b.name +
                 ") % sizeof(" + vtype(buffer) + ") == 0)";
    };
    for (const auto& [buffer, index] : vec_.loads) check(buffer);
    for (const loop::Store* st : vec_.stores) check(st->buffer);
    if (!aligned.empty()) out_ += indent + "if (" + aligned + ")\n";
    out_ += indent + "for (kiln_idx kiln_g = (kiln_idx)blockIdx.x * " + std::to_string(block_) +
            " + threadIdx.x; kiln_g < " + outer_ + " / " + Vs + "; kiln_g += (kiln_idx)gridDim.x * " +
            std::to_string(block_) + ") {\n";
    const std::string in2 = indent + "  ", in3 = in2 + "  ";
    out_ += in2 + "const kiln_idx kiln_lin0 = kiln_g * " + Vs + ";\n";
    unravel_group(out_, in2, "kiln_lin0", k_.vars, k_.ranges);
    std::map<std::pair<int, std::string>, std::string> element;  // (buffer, index) -> vector name
    const std::string inner = k_.vars.back().name(), inner0 = inner + "_0";
    std::vector<std::string> bases;
    for (const auto& [buffer, index] : vec_.loads) bases.push_back(index.c_str());
    for (const loop::Store* st : vec_.stores) bases.push_back(st->index.c_str());
    write_bases(out_, in2, k_.vars.back(), bases);
    size_t slot = 0;
    for (const auto& [buffer, index] : vec_.loads) {
      const std::string name = "kiln_v" + std::to_string(slot);
      out_ += in2 + "const " + vtype(buffer) + " " + name + " = *reinterpret_cast<const " + vtype(buffer) + "*>(" +
              p_.buffers[buffer].name + " + kiln_at[" + std::to_string(slot) + "]);\n";
      element[{buffer, index.str()}] = name + ".v[kiln_j]";
      ++slot;
    }
    std::vector<std::string> out_names;
    for (const loop::Store* st : vec_.stores) {
      out_names.push_back("kiln_v" + std::to_string(slot++));
      out_ += in2 + vtype(st->buffer) + " " + out_names.back() + ";\n";
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
      out_ += in2 + "*reinterpret_cast<" + vtype(st->buffer) + "*>(" + p_.buffers[st->buffer].name + " + kiln_at[" +
              std::to_string(slot) + "]) = " + out_names[i] + ";\n";
    }
    out_ += indent + "}\n";
    return !aligned.empty();
  }

  // ---- reductions over the outer dims of a contiguous kept dim (ColumnPlan) ----

  void write_columns(ScalarEmitter& em, const std::string& indent) {
    const std::string R = std::to_string(cols_.parts), in2 = indent + "  ", in3 = in2 + "  ", in4 = in3 + "  ";
    out_ += indent + "__shared__ double kiln_smem_raw[" + std::to_string(32 * cols_.parts) + "];\n";
    out_ += indent + "const unsigned kiln_col = threadIdx.x & 31u, kiln_part = threadIdx.x >> 5;\n";
    out_ += indent + "for (kiln_idx kiln_tile = blockIdx.x; kiln_tile < " + std::to_string(cols_.tiles) +
            "; kiln_tile += gridDim.x) {\n";
    out_ += in2 + "const kiln_idx kiln_o = kiln_tile * 32 + kiln_col;\n";
    out_ += in2 + "const bool kiln_in = kiln_o < " + outer_ + ";\n";
    unravel(out_, in2, "kiln_o", k_.vars, k_.ranges);
    for (const Stage& st : k_.stages) {
      if (st.kind != Stage::Kind::Reduce) {
        out_ += in2 + "if (kiln_part == 0 && kiln_in) {\n";
        em.push_scope();
        for (const loop::Store& s : st.stores) {
          std::string v = em.emit(s.value, in3);
          out_ += in3 + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
        }
        em.pop_scope();
        out_ += in2 + "}\n";
        continue;
      }
      const std::string acc = "acc" + std::to_string(st.acc), t = ctype(st.acc_dtype), f = functor(st.reduce);
      out_ += in2 + t + " " + acc + " = " + acc_init(st.reduce, st.acc_dtype) + ";\n";
      out_ += in2 + "if (kiln_in) {\n";
      out_ += in3 + "#pragma unroll 4\n";
      out_ += in3 + "for (kiln_idx kiln_q = kiln_part; kiln_q < " + std::to_string(cols_.points) + "; kiln_q += " + R + ") {\n";
      em.push_scope();
      unravel(out_, in4, "kiln_q", st.vars, st.ranges);
      std::string v = em.emit(st.value, in4);
      for (const loop::Store& s : st.stores) out_ += in4 + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
      out_ += in4 + acc + " = " + f + "(" + acc + ", " + v + ");\n";
      em.pop_scope();
      out_ += in3 + "}\n";
      out_ += in2 + "}\n";
      // The R partial results of each output point meet in shared memory; every thread reads
      // the total back (a later stage may use it).
      out_ += in2 + "{\n";
      out_ += in3 + t + "* kiln_cs = reinterpret_cast<" + t + "*>(kiln_smem_raw);\n";
      out_ += in3 + "kiln_cs[threadIdx.x] = " + acc + ";\n";
      out_ += in3 + "__syncthreads();\n";
      out_ += in3 + "if (kiln_part == 0) {\n";
      out_ += in4 + "for (int kiln_p = 1; kiln_p < " + R + "; ++kiln_p) " + acc + " = " + f + "(" + acc +
              ", kiln_cs[kiln_p * 32 + kiln_col]);\n";
      out_ += in4 + "kiln_cs[kiln_col] = " + acc + ";\n";
      out_ += in3 + "}\n";
      out_ += in3 + "__syncthreads();\n";
      out_ += in3 + acc + " = kiln_cs[kiln_col];\n";
      out_ += in3 + "__syncthreads();\n";
      out_ += in2 + "}\n";
    }
    out_ += indent + "}\n";
  }

  // ---- rows of a known length (RowPlan) ----

  // The rows, walked with groups of V elements. Whether each vector-accessed buffer is aligned
  // for V is tested once; an unaligned one (a view's offset) moves its groups an element at a
  // time, in the same code (a second copy of the unrolled row doubled NVRTC's time).
  void write_persistent_rows(ScalarEmitter& em, const std::string& indent) {
    if (!rows_.warp_rows) out_ += indent + "__shared__ double kiln_smem_raw[32];\n";
    if (rows_.width > 1) {
      std::set<int> checked;
      auto flag = [&](int buffer) {
        if (p_.buffers[buffer].aligned || !checked.insert(buffer).second) return;
        const loop::Buffer& b = p_.buffers[buffer];
        out_ += indent + "const bool kiln_al_" + b.name + " = reinterpret_cast<unsigned long long>(" + b.name +
                ") % sizeof(" + vec_type(buffer, rows_.width) + ") == 0;\n";
      };
      for (const auto& [b, idx] : rows_.cached) flag(b);
      for (const auto& [b, idx] : rows_.vector_loads) flag(b);
      for (const loop::Store* st : rows_.vector_stores) flag(st->buffer);
    }
    write_row_loop(em, indent, rows_.width);
  }

  // `kiln_vload<T, V>(buffer + at, aligned)`, or the element itself when V is 1.
  std::string vector_load(int buffer, int width, const std::string& at) const {
    const loop::Buffer& b = p_.buffers[buffer];
    return "kiln_vload<" + ctype(b.dtype) + ", " + std::to_string(width) + ">(" + b.name + " + " + at + ", " +
           alignment_flag(b, width) + ")";
  }
  std::string vector_store(int buffer, int width, const std::string& at, const std::string& value) const {
    const loop::Buffer& b = p_.buffers[buffer];
    return "kiln_vstore<" + ctype(b.dtype) + ", " + std::to_string(width) + ">(" + b.name + " + " + at + ", " + value + ", " +
           alignment_flag(b, width) + ");";
  }

  // Whether `b` is aligned for a group of `width` elements: known (one element, or a buffer
  // schedule::mark_aligned vouches for), or the flag the kernel tested on entry.
  static std::string alignment_flag(const loop::Buffer& b, int width) {
    return width == 1 || b.aligned ? std::string("true") : "kiln_al_" + b.name;
  }

  std::string vec_type(int buffer, int width) const {
    return "kiln_vec<" + ctype(p_.buffers[buffer].dtype) + ", " + std::to_string(width) + ">";
  }

  void write_row_loop(ScalarEmitter& em, const std::string& indent, int width) {
    const std::string in2 = indent + "  ";
    const int64_t lanes = rows_.warp_rows ? 32 : block_;
    const std::string lane = rows_.warp_rows ? "kiln_lane" : "threadIdx.x";
    if (rows_.warp_rows) {
      const std::string per_block = std::to_string(kRowsPerWarpBlock);
      out_ += indent + "const unsigned kiln_lane = threadIdx.x & 31u;\n";
      out_ += indent + "for (kiln_idx kiln_row = (kiln_idx)blockIdx.x * " + per_block +
              " + (threadIdx.x >> 5); kiln_row < " + outer_ + "; kiln_row += (kiln_idx)gridDim.x * " + per_block + ") {\n";
    } else {
      out_ += indent + "for (kiln_idx kiln_row = blockIdx.x; kiln_row < " + outer_ + "; kiln_row += gridDim.x) {\n";
    }
    unravel(out_, in2, "kiln_row", k_.vars, k_.ranges);
    const int64_t groups = rows_.points / width, trips = (groups + lanes - 1) / lanes;
    const Stage* looping = nullptr;
    for (const Stage& st : k_.stages)
      if (!st.vars.empty()) looping = &st;
    GroupLoop g{looping->vars, looping->ranges, width, trips, groups, lanes, lane};
    // Elements several stages read: loaded once per row.
    std::map<std::pair<int, std::string>, std::string> cached;
    for (size_t c = 0; c < rows_.cached.size(); ++c) {
      const auto& [buffer, index] = rows_.cached[c];
      const std::string name = "kiln_rc" + std::to_string(c);
      cached[{buffer, index.str()}] = name + "[kiln_it * " + std::to_string(width) + " + kiln_j]";
      out_ += in2 + ctype(p_.buffers[buffer].dtype) + " " + name + "[" + std::to_string(trips * width) + "];\n";
    }
    for (size_t h = 0; h < rows_.held_values.size(); ++h)
      out_ += in2 + register_ctype(p_.exprs[rows_.held_values[h]].dtype) + " kiln_rv" + std::to_string(h) + "[" +
              std::to_string(trips * width) + "];\n";
    plan_held_stores(trips * width);
    for (const auto& [store, held] : held_)
      if (!held.value_register)
        out_ += in2 + ctype(p_.buffers[store->buffer].dtype) + " " + held.reg + "[" + std::to_string(trips * width) + "];\n";
    if (!rows_.cached.empty()) {
      open_group(g, in2);
      const std::string in4 = in2 + "    ";
      std::vector<std::string> bases;
      for (const auto& [buffer, index] : rows_.cached) bases.push_back(index.c_str());
      write_bases(out_, in4, g.vars.back(), bases);
      for (size_t c = 0; c < rows_.cached.size(); ++c) {
        const int buffer = rows_.cached[c].first;
        out_ += in4 + "{\n";
        out_ += in4 + "  const " + vec_type(buffer, width) + " kiln_t = " + vector_load(buffer, width, "kiln_at[" + std::to_string(c) + "]") + ";\n";
        out_ += in4 + "  #pragma unroll\n";
        out_ += in4 + "  for (int kiln_j = 0; kiln_j < " + std::to_string(width) + "; ++kiln_j) kiln_rc" +
                std::to_string(c) + "[kiln_it * " + std::to_string(width) + " + kiln_j] = kiln_t.v[kiln_j];\n";
        out_ += in4 + "}\n";
      }
      close_group(g, in2);
    }
    for (size_t si = 0; si < k_.stages.size(); ++si) {
      const Stage& st = k_.stages[si];
      write_group_stage(st, si, em, in2, g, cached);
      // Later stages read what this one holds from its registers.
      for (const loop::Store& s : st.stores)
        if (auto it = held_.find(&s); it != held_.end())
          cached[{s.buffer, s.index.str()}] = it->second.reg + "[kiln_it * " + std::to_string(width) + " + kiln_j]";
    }
    out_ += indent + "}\n";
  }

  // Row elements a stage stores and a later stage reads back at the same index (softmax's
  // exponentials, read by its division) stay in registers from one stage to the next, as the
  // cached loads do. Such a store is not written at all when a later stage stores the same
  // element (the division overwrites the exponentials in place): the row then makes one trip
  // through memory each way. Only where every read of the buffer in the kernel is at that
  // index, by a stage that walks the row, and the registers fit beside the cached loads.
  void plan_held_stores(int64_t per_thread) {
    held_.clear();
    std::vector<std::vector<std::pair<int, std::string>>> reads(k_.stages.size());
    std::set<int> unheld;  // buffers read at another index or outside the row walk
    for (size_t i = 0; i < k_.stages.size(); ++i) {
      const Stage& st = k_.stages[i];
      std::set<loop::SRef> seen;
      auto note = [&](const loop::SNode& n) {
        if (st.vars.empty()) unheld.insert(n.buffer);
        reads[i].push_back({n.buffer, n.index.str()});
      };
      if (st.kind == Stage::Kind::Reduce) visit_loads(p_.exprs, st.value, seen, note);
      for (const loop::Store& s : st.stores) visit_loads(p_.exprs, s.value, seen, note);
    }
    int64_t registers = int64_t(rows_.cached.size() - rows_.prefetched + rows_.held_values.size()) * per_thread;
    const int64_t prefetch_registers = int64_t(rows_.prefetched) * per_thread;
    for (size_t i = 0; i < k_.stages.size(); ++i) {
      if (k_.stages[i].vars.empty()) continue;
      for (const loop::Store& s : k_.stages[i].stores) {
        const std::string index = s.index.str();
        bool read_later = false, other_index = unheld.count(s.buffer) > 0, overwritten = false;
        for (size_t j = 0; j < k_.stages.size(); ++j)
          for (const auto& [b, idx] : reads[j]) {
            if (b != s.buffer) continue;
            if (idx != index) other_index = true;
            else if (j > i) read_later = true;
          }
        for (size_t j = i + 1; j < k_.stages.size(); ++j)
          for (const loop::Store& later : k_.stages[j].stores)
            overwritten |= !k_.stages[j].vars.empty() && later.buffer == s.buffer && later.index.str() == index;
        if (!read_later || other_index) continue;
        // A float32 store of a value already held: read back from the value's registers.
        const loop::Buffer& b = p_.buffers[s.buffer];
        auto h = std::find(rows_.held_values.begin(), rows_.held_values.end(), s.value);
        if (h != rows_.held_values.end() && !is_16bit_float(b.dtype) && p_.exprs[s.value].dtype == b.dtype) {
          held_[&s] = Held{"kiln_rv" + std::to_string(h - rows_.held_values.begin()), overwritten, true};
          continue;
        }
        if (registers + per_thread > kMaxRowRegisters ||
            registers + prefetch_registers + per_thread > kMaxPrefetchRegisters)
          continue;
        registers += per_thread;
        held_[&s] = Held{"kiln_rs" + std::to_string(held_.size()), overwritten};
      }
    }
  }

  struct GroupLoop {
    std::vector<Expr> vars, ranges;
    int width;
    int64_t trips, groups, lanes;
    std::string lane;
  };

  // Opens `for (kiln_it ...) { if (group in the row) {` with the stage vars of the group's
  // first element (the innermost named <var>_0).
  void open_group(const GroupLoop& g, const std::string& indent) {
    const std::string in2 = indent + "  ", in3 = in2 + "  ";
    out_ += indent + "#pragma unroll\n";
    out_ += indent + "for (int kiln_it = 0; kiln_it < " + std::to_string(g.trips) + "; ++kiln_it) {\n";
    out_ += in2 + "const kiln_idx kiln_g = " + g.lane + " + kiln_it * " + std::to_string(g.lanes) + ";\n";
    out_ += in2 + "if (" + (g.trips * g.lanes == g.groups ? std::string("true") : "kiln_g < " + std::to_string(g.groups)) + ") {\n";
    out_ += in3 + "const kiln_idx kiln_q0 = kiln_g * " + std::to_string(g.width) + ";\n";
    unravel_group(out_, in3, "kiln_q0", g.vars, g.ranges);
  }

  void close_group(const GroupLoop&, const std::string& indent) {
    out_ += indent + "  }\n";
    out_ += indent + "}\n";
  }

  void write_group_stage(const Stage& st, size_t stage, ScalarEmitter& em, const std::string& indent, const GroupLoop& g,
                         const std::map<std::pair<int, std::string>, std::string>& cached) {
    const std::string element_at = "[kiln_it * " + std::to_string(g.width) + " + kiln_j]";
    const std::string lane0 = "(" + g.lane + " == 0)";
    if (st.vars.empty()) {  // outer-point stores: every thread holds the values; one writes
      out_ += indent + "if " + lane0 + " {\n";
      em.push_scope();
      for (const loop::Store& s : st.stores) {
        std::string v = em.emit(s.value, indent + "  ");
        out_ += indent + "  " + store_stmt(p_.buffers[s.buffer], s.index.c_str(), v) + "\n";
      }
      em.pop_scope();
      out_ += indent + "}\n";
      return;
    }
    const bool reduce = st.kind == Stage::Kind::Reduce;
    const std::string acc = "acc" + std::to_string(st.acc), t = ctype(st.acc_dtype);
    if (reduce) out_ += indent + t + " " + acc + " = " + acc_init(st.reduce, st.acc_dtype) + ";\n";
    // This stage's vector loads and stores.
    std::vector<std::pair<int, Expr>> loads;
    std::vector<const loop::Store*> stores;
    if (g.width > 1) {
      std::set<loop::SRef> seen;  // not under the values an earlier stage holds
      for (size_t h = 0; h < rows_.held_values.size(); ++h)
        if (rows_.held_stage[h] < stage) seen.insert(rows_.held_values[h]);
      std::set<std::pair<int, std::string>> used;
      auto note = [&](const loop::SNode& n) { used.insert({n.buffer, n.index.str()}); };
      if (reduce) visit_loads(p_.exprs, st.value, seen, note);
      for (const loop::Store& s : st.stores) visit_loads(p_.exprs, s.value, seen, note);
      for (const auto& l : rows_.vector_loads)
        if (used.count({l.first, l.second.str()})) loads.push_back(l);
      for (const loop::Store& s : st.stores)
        if (std::find(rows_.vector_stores.begin(), rows_.vector_stores.end(), &s) != rows_.vector_stores.end() &&
            !is_dead(s))
          stores.push_back(&s);
    }
    open_group(g, indent);
    const std::string in4 = indent + "    ", in5 = in4 + "  ";
    std::vector<std::string> bases;
    for (const auto& l : loads) bases.push_back(l.second.c_str());
    for (const loop::Store* s : stores) bases.push_back(s->index.c_str());
    write_bases(out_, in4, g.vars.back(), bases);
    std::map<std::pair<int, std::string>, std::string> element = cached;
    for (size_t i = 0; i < loads.size(); ++i) {
      const int buffer = loads[i].first;
      const std::string name = "kiln_sv" + std::to_string(i);
      out_ += in4 + "const " + vec_type(buffer, g.width) + " " + name + " = " +
              vector_load(buffer, g.width, "kiln_at[" + std::to_string(i) + "]") + ";\n";
      element[{buffer, loads[i].second.str()}] = name + ".v[kiln_j]";
    }
    for (size_t i = 0; i < stores.size(); ++i)
      out_ += in4 + vec_type(stores[i]->buffer, g.width) + " kiln_so" + std::to_string(i) + ";\n";
    out_ += in4 + "#pragma unroll\n";
    out_ += in4 + "for (int kiln_j = 0; kiln_j < " + std::to_string(g.width) + "; ++kiln_j) {\n";
    out_ += in5 + "const kiln_idx " + g.vars.back().name() + " = " + g.vars.back().name() + "_0 + kiln_j;\n";
    em.push_scope();
    em.element_of = [&](const loop::SNode& n) {
      auto it = element.find({n.buffer, n.index.str()});
      return it == element.end() ? std::string() : it->second;
    };
    for (size_t h = 0; h < rows_.held_values.size(); ++h)
      if (rows_.held_stage[h] < stage) em.name(rows_.held_values[h], "kiln_rv" + std::to_string(h) + element_at);
    std::string v;
    if (reduce) v = em.emit(st.value, in5);
    for (const loop::Store& s : st.stores) {
      const std::string value = reduce ? v : em.emit(s.value, in5);
      if (auto h = held_.find(&s); h != held_.end() && !h->second.value_register)
        out_ += in5 + store_to(p_.buffers[s.buffer], h->second.reg + element_at, value) + "\n";
      if (is_dead(s)) continue;
      auto it = std::find(stores.begin(), stores.end(), &s);
      if (it == stores.end()) out_ += in5 + store_stmt(p_.buffers[s.buffer], s.index.c_str(), value) + "\n";
      else out_ += in5 + store_to(p_.buffers[s.buffer], "kiln_so" + std::to_string(it - stores.begin()) + ".v[kiln_j]", value) + "\n";
    }
    if (reduce) out_ += in5 + acc + " = " + functor(st.reduce) + "(" + acc + ", " + v + ");\n";
    for (size_t h = 0; h < rows_.held_values.size(); ++h)
      if (rows_.held_stage[h] == stage)
        out_ += in5 + "kiln_rv" + std::to_string(h) + element_at + " = " + em.emit(rows_.held_values[h], in5) + ";\n";
    em.element_of = nullptr;
    em.pop_scope();
    out_ += in4 + "}\n";
    for (size_t i = 0; i < stores.size(); ++i)
      out_ += in4 + vector_store(stores[i]->buffer, g.width, "kiln_at[" + std::to_string(loads.size() + i) + "]",
                                 "kiln_so" + std::to_string(i)) + "\n";
    close_group(g, indent);
    if (reduce) {
      out_ += indent + acc + " = " + row_reduce(acc, functor(st.reduce), t) + ";\n";
    }
  }

  const loop::Program& p_;
  const Kernel& k_;
  const LaunchChoice& choice_;
  std::string& out_;
  RowPlan rows_;
  ColumnPlan cols_;
  VectorPlan vec_;
  unsigned block_ = 256;
  struct Held {
    std::string reg;   // the register array, an element per (trip, lane of the group)
    bool dead = false; // a later stage stores the same element: never written to memory
    bool value_register = false;  // reg holds the stored value already (RowPlan::held_values)
  };
  std::map<const loop::Store*, Held> held_;  // persistent rows: stores kept in registers
  bool is_dead(const loop::Store& s) const {
    auto it = held_.find(&s);
    return it != held_.end() && it->second.dead;
  }
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

std::string LaunchChoice::str() const {
  return "block=" + std::to_string(block) + " warp_rows=" + std::to_string(warp_rows) +
         " vectorize=" + std::to_string(vectorize ? 1 : 0);
}

bool LaunchChoice::parse(const std::string& text, LaunchChoice& out) {
  int vec = 1;
  LaunchChoice c;
  if (std::sscanf(text.c_str(), "block=%u warp_rows=%d vectorize=%d", &c.block, &c.warp_rows, &vec) != 3) return false;
  if (c.block > 1024 || c.warp_rows < -1 || c.warp_rows > 1 || (c.block && (c.block % 32 || (c.block & (c.block - 1)))))
    return false;
  c.vectorize = vec != 0;
  out = c;
  return true;
}

std::vector<LaunchChoice> launch_candidates(const loop::Program& p, const Kernel& k) {
  std::vector<LaunchChoice> out{LaunchChoice{}};
  auto outer = sym::product(k.ranges).as_const();
  bool rowwise = false, known = outer.has_value();
  for (const Stage& st : k.stages)
    if (!st.vars.empty()) rowwise = true, known = known && sym::product(st.ranges).as_const().has_value();
  if (!known) return out;  // sized at run time: the launch is fixed before the sizes are known
  if (rowwise && plan_columns(p, k).columns) return out;  // the column plan takes no launch choice
  if (rowwise) {
    // A row per warp (4 warps a block), or a row per block of 64 to 1024 threads.
    out.push_back(LaunchChoice{0, 1, true});
    for (unsigned b : {64u, 128u, 256u, 512u, 1024u}) out.push_back(LaunchChoice{b, 0, true});
    return out;
  }
  if (*outer < 4096) return out;  // launch-bound: the shape does not matter
  for (unsigned b : {128u, 256u, 512u, 1024u}) {
    out.push_back(LaunchChoice{b, -1, true});
    if (plan_vectors(p, k).width) out.push_back(LaunchChoice{b, -1, false});
  }
  return out;
}

constexpr unsigned kForeachBlock = 256;

ForeachTable foreach_table(const loop::ForeachGroup& g) {
  ForeachTable t;
  t.members = g.kernels.size();
  for (const auto& b : g.buffers) t.buffers = std::max(t.buffers, b.size());
  for (const auto& a : g.args) t.args = std::max(t.args, a.size());
  int64_t start = 0;
  for (int64_t n : g.points) {
    t.block_start.push_back(start);
    start += std::clamp<int64_t>((n + kForeachBlock - 1) / kForeachBlock, 1, 1024);
  }
  t.block_start.push_back(start);
  return t;
}

namespace {

// Each variant's body (its first member's kernel), its buffers, scalar arguments and loop
// variable renamed to the table's entries of the member a block works for; each member's blocks
// stride over its extent.
std::string foreach_kernel(const loop::Program& p, const loop::ForeachGroup& g, CudaLaunch& l) {
  const ForeachTable t = foreach_table(g);
  l.name = g.name;
  l.block = kForeachBlock;
  l.grid = static_cast<unsigned>(t.block_start.back());
  const std::string M = std::to_string(t.members), NB = std::to_string(t.buffers), NA = std::to_string(t.args);
  const std::string args0 = std::to_string(t.arg_slot(0, 0)), points0 = std::to_string(t.points_slot(0)),
                    start0 = std::to_string(t.start_slot(0)), variant0 = std::to_string(t.variant_slot(0));
  const Kernel& first = p.kernels[g.kernels[0]];
  std::string out = "// " + g.name + ": " + M + " kernels like " + first.name + " in one launch, over a table of their buffers\n";
  out += "struct " + g.name + "_table { unsigned long long v[" + std::to_string(t.slots()) + "]; };\n";
  out += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kForeachBlock) + ") " + g.name +
         "(const __grid_constant__ " + g.name + "_table kiln_fe) {\n";
  out += "  const unsigned long long* kiln_v = kiln_fe.v;\n";
  out += "  int kiln_t = 0;\n";
  out += "  while (kiln_t + 1 < " + M + " && (long long)blockIdx.x >= (long long)kiln_v[" + start0 + " + kiln_t + 1]) ++kiln_t;\n";
  out += "  const long long kiln_n = (long long)kiln_v[" + points0 + " + kiln_t];\n";
  out += "  const long long kiln_first = (long long)kiln_v[" + start0 + " + kiln_t];\n";
  out += "  const long long kiln_blocks = (long long)kiln_v[" + start0 + " + kiln_t + 1] - kiln_first;\n";
  out += "  const long long kiln_variant = (long long)kiln_v[" + variant0 + " + kiln_t];\n";
  for (size_t v = 0; v < g.variant_member.size(); ++v) {
    const size_t m = static_cast<size_t>(g.variant_member[v]);
    const Kernel& k = p.kernels[g.kernels[m]];
    std::string body;
    ScalarEmitter em(p, body, [](int acc) { return "acc" + std::to_string(acc); });
    const std::string indent = "      ";
    std::set<int> stored;
    for (const Stage& st : k.stages)
      for (const loop::Store& s : st.stores) {
        std::string val = em.emit(s.value, indent);
        body += indent + store_stmt(p.buffers[s.buffer], s.index.c_str(), val) + "\n";
        stored.insert(s.buffer);
      }
    for (size_t j = 0; j < g.buffers[m].size(); ++j) replace_identifier(body, p.buffers[g.buffers[m][j]].name, "kiln_fb" + std::to_string(j));
    for (size_t j = 0; j < g.args[m].size(); ++j) replace_identifier(body, arg_name(g.args[m][j]), "kiln_fs" + std::to_string(j));
    replace_identifier(body, k.vars[0].c_str(), "kiln_x");
    out += "  " + std::string(v ? "else " : "") + "if (kiln_variant == " + std::to_string(v) + ") {\n";
    for (size_t j = 0; j < g.buffers[m].size(); ++j) {
      const loop::Buffer& b = p.buffers[g.buffers[m][j]];
      const std::string cv = stored.count(b.id) ? "" : "const ";
      out += "    " + cv + ctype(b.dtype) + "* __restrict__ kiln_fb" + std::to_string(j) + " = (" + cv + ctype(b.dtype) +
             "*)kiln_v[kiln_t * " + NB + " + " + std::to_string(j) + "];\n";
    }
    for (size_t j = 0; j < g.args[m].size(); ++j)
      out += "    const double kiln_fs" + std::to_string(j) + " = __longlong_as_double((long long)kiln_v[" + args0 +
             " + kiln_t * " + NA + " + " + std::to_string(j) + "]);\n";
    out += "    for (long long kiln_x = ((long long)blockIdx.x - kiln_first) * " + std::to_string(kForeachBlock) +
           " + threadIdx.x; kiln_x < kiln_n; kiln_x += kiln_blocks * " + std::to_string(kForeachBlock) + ") {\n";
    out += body;
    out += "    }\n  }\n";
  }
  out += "}\n\n";
  return out;
}

}  // namespace

std::string generate_cuda_kernel(const loop::Program& p, const Kernel& k, const LaunchChoice& choice,
                                 CudaLaunch& launch) {
  std::string text;
  launch = CudaKernelWriter(p, k, choice, text).write();
  return text;
}

CudaSource generate_cuda(const loop::Program& p, const std::vector<LaunchChoice>& choices) {
  CudaSource s;
  s.source = "// Generated by kiln. Each kernel fuses the graph ops in its name.\n";
  s.source += kCudaPrelude;
  s.source += fits_int32(p) ? "typedef int kiln_idx;\n\n" : "typedef long long kiln_idx;\n\n";
  s.header = s.source;
  const LaunchChoice heuristic;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    s.launches.emplace_back();
    s.kernels.push_back(generate_cuda_kernel(p, p.kernels[i], i < choices.size() ? choices[i] : heuristic,
                                             s.launches.back()));
    s.source += s.kernels.back();
  }
  for (const loop::ForeachGroup& g : p.foreach_groups) {
    s.foreach_launches.emplace_back();
    s.foreach_kernels.push_back(foreach_kernel(p, g, s.foreach_launches.back()));
    s.source += s.foreach_kernels.back();
  }
  return s;
}

}  // namespace kiln::codegen
