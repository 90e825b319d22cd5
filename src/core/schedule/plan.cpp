#include <algorithm>
#include <map>
#include <set>

#include "core/schedule/schedule.h"
#include "core/sym/shape_env.h"

namespace kiln::schedule {
namespace {

using loop::Kernel;
using loop::SNode;
using loop::SOp;
using loop::SRef;
using loop::Stage;
using loop::visit_loads;
using sym::Expr;

// Index nodes (arange's values) are expressions of the loop vars too.
void visit_index_values(const loop::ScalarCtx& s, SRef r, std::set<SRef>& seen, const std::function<void(const Expr&)>& f) {
  if (r < 0 || !seen.insert(r).second) return;
  const SNode& n = s[r];
  if (n.op == SOp::Index) f(n.index);
  visit_index_values(s, n.a, seen, f);
  visit_index_values(s, n.b, seen, f);
  visit_index_values(s, n.c, seen, f);
}

void for_each_index(const loop::Program& p, const Kernel& k, const std::function<void(const Expr&)>& f) {
  std::set<SRef> seen, seen_values;
  auto loads = [&](SRef v) {
    visit_loads(p.exprs, v, seen, [&](const SNode& n) { f(n.index); });
    visit_index_values(p.exprs, v, seen_values, f);
  };
  for (const Stage& st : k.stages) {
    if (st.kind == Stage::Kind::Reduce) loads(st.value);
    for (const loop::Store& s : st.stores) {
      loads(s.value);
      f(s.index);
    }
  }
}

// Whether a store lies in the kernel's outer space: its stage has no loop of its own.
bool store_is_outer(const Kernel& k, const loop::Store& s) {
  for (const Stage& st : k.stages)
    for (const loop::Store& t : st.stores)
      if (&t == &s) return st.vars.empty();
  return false;
}

// Tries to merge dims (i, i+1) of `vars`: legal when every access is affine in all loop vars
// and steps over dim i exactly as far as over the whole of dim i+1.
bool mergeable(const loop::Program& p, const Kernel& k, const std::vector<Expr>& all_vars, const std::vector<Expr>& vars,
               const std::vector<Expr>& ranges, size_t i) {
  size_t ii = std::find(all_vars.begin(), all_vars.end(), vars[i]) - all_vars.begin();
  size_t jj = std::find(all_vars.begin(), all_vars.end(), vars[i + 1]) - all_vars.begin();
  bool ok = true;
  for_each_index(p, k, [&](const Expr& idx) {
    if (!ok) return;
    auto a = sym::affine(idx, all_vars);
    if (!a || a->coeffs[ii] != a->coeffs[jj] * ranges[i + 1]) ok = false;
  });
  return ok;
}

void rewrite_indices(loop::Program& p, Kernel& k, const std::map<Expr, Expr>& repl) {
  auto sub = [&](const Expr& e) { return sym::substitute(e, repl); };
  auto fix = [&](SRef v) {
    std::unordered_map<SRef, SRef> memo;
    return p.exprs.rewrite(
        v,
        [&](loop::ScalarCtx& c, const SNode& n, SRef self) {
          if (n.op == SOp::Index) return c.size_value(sub(n.index), n.dtype);  // arange's values
          return n.op == SOp::Load ? c.load(n.buffer, sub(n.index), n.dtype) : self;
        },
        memo);
  };
  for (Stage& st : k.stages) {
    if (st.kind == Stage::Kind::Reduce) st.value = fix(st.value);
    for (loop::Store& s : st.stores) {
      s.value = fix(s.value);
      s.index = sub(s.index);
    }
  }
}

// Collapses one list of dims (the outer space, or the shared inner space) from the innermost.
// `others` are the loop vars of the other list, which accesses may also use.
void collapse(loop::Program& p, Kernel& k, std::vector<Expr>& vars, std::vector<Expr>& ranges,
              const std::vector<Expr>& others, const std::string& prefix) {
  int counter = 0;
  for (size_t i = vars.size(); i-- > 1;) {
    std::vector<Expr> all = vars;
    all.insert(all.end(), others.begin(), others.end());
    if (!mergeable(p, k, all, vars, ranges, i - 1)) continue;
    Expr extent = ranges[i - 1] * ranges[i];
    Expr m = Expr::index_var(prefix + "m" + std::to_string(counter++), extent);
    // Affine accesses: dropping dim i-1 and re-indexing dim i by the merged var is exact.
    rewrite_indices(p, k, {{vars[i - 1], Expr(0)}, {vars[i], m}});
    vars.erase(vars.begin() + i - 1, vars.begin() + i + 1);
    ranges.erase(ranges.begin() + i - 1, ranges.begin() + i + 1);
    vars.insert(vars.begin() + i - 1, m);
    ranges.insert(ranges.begin() + i - 1, extent);
    i = std::min(i, vars.size());
  }
}

}  // namespace

void order_loops(loop::Program& p) {
  for (Kernel& k : p.kernels) {
    if (k.vars.size() < 2) continue;
    // The kernel's first store of the outer space (else its first store): its buffer's layout.
    const loop::Store* store = nullptr;
    for (const Stage& st : k.stages)
      for (const loop::Store& s : st.stores)
        if (!store || (st.vars.empty() && !store_is_outer(k, *store))) store = &s;
    if (!store) continue;
    auto a = sym::affine(store->index, k.vars);
    if (!a) continue;
    std::vector<std::pair<int64_t, size_t>> order;  // (stride, dim)
    for (size_t d = 0; d < k.vars.size(); ++d) {
      auto stride = sym::size_hint(a->coeffs[d]);
      if (!stride) {
        order.clear();
        break;
      }
      // A dim of extent 1 has any stride: it keeps its place among its neighbours.
      auto extent = sym::size_hint(k.ranges[d]);
      order.emplace_back(extent && *extent == 1 ? -1 : std::abs(*stride), d);
    }
    if (order.empty()) continue;
    std::vector<std::pair<int64_t, size_t>> moving;
    for (const auto& o : order)
      if (o.first >= 0) moving.push_back(o);
    std::vector<std::pair<int64_t, size_t>> sorted = moving;
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    if (sorted == moving) continue;
    std::vector<Expr> vars = k.vars, ranges = k.ranges;
    size_t next = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i].first < 0) continue;  // extent 1: stays in its slot
      const size_t d = sorted[next++].second;
      vars[i] = k.vars[d];
      ranges[i] = k.ranges[d];
    }
    k.vars = std::move(vars);
    k.ranges = std::move(ranges);
  }
}

void collapse_dims(loop::Program& p) {
  for (Kernel& k : p.kernels) {
    std::vector<Expr> inner_vars, inner_ranges;
    for (const Stage& st : k.stages)
      if (!st.vars.empty()) inner_vars = st.vars, inner_ranges = st.ranges;
    collapse(p, k, k.vars, k.ranges, inner_vars, "x");
    if (inner_vars.empty()) continue;
    // The inner space is shared by every stage that loops: collapse it once for all of them.
    collapse(p, k, inner_vars, inner_ranges, k.vars, "r");
    for (Stage& st : k.stages)
      if (!st.vars.empty()) st.vars = inner_vars, st.ranges = inner_ranges;
  }
}

void plan_buffers(loop::Program& p) {
  // Temporaries that extern ops read or write are torch tensors of their own (torch allocates
  // an extern's result); the others share slots of raw memory by liveness.
  std::set<int> extern_owned;
  for (const loop::Extern& e : p.externs) {
    extern_owned.insert(e.output);
    for (const auto& v : e.inputs) extern_owned.insert(v.buffer);
  }
  // Liveness of temporaries in step order: [first write, last read].
  std::map<int, std::pair<size_t, size_t>> live;
  auto touch = [&](int b, size_t step) {
    if (b < 0 || p.buffers[b].kind != loop::BufferKind::Temp || extern_owned.count(b)) return;
    auto it = live.find(b);
    if (it == live.end()) live[b] = {step, step};
    else it->second.second = step;
  };
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const loop::Step& st = p.steps[i];
    if (st.kind == loop::Step::Kind::Extern) {
      const loop::Extern& e = p.externs[st.index];
      touch(e.output, i);
      for (const auto& v : e.inputs) touch(v.buffer, i);
      continue;
    }
    Kernel& k = p.kernels[st.index];
    std::set<int> used;
    for (const Stage& s : k.stages) {
      for (const loop::Store& x : s.stores) used.insert(x.buffer);
    }
    std::set<SRef> seen;
    for (const Stage& s : k.stages) {
      auto loads = [&](SRef v) { visit_loads(p.exprs, v, seen, [&](const SNode& n) { used.insert(n.buffer); }); };
      if (s.kind == Stage::Kind::Reduce) loads(s.value);
      for (const loop::Store& x : s.stores) loads(x.value);
    }
    k.buffers.assign(used.begin(), used.end());
    for (int b : used) touch(b, i);
  }
  // Temporaries nothing touches any more (fused away) need no memory.
  std::set<int> touched;
  for (const Kernel& k : p.kernels) touched.insert(k.buffers.begin(), k.buffers.end());
  for (const loop::Extern& e : p.externs) {
    touched.insert(e.output);
    for (const auto& v : e.inputs) touched.insert(v.buffer);
  }
  for (const loop::Output& o : p.outputs) touched.insert(o.view.buffer);
  for (loop::Buffer& b : p.buffers)
    if (b.kind == loop::BufferKind::Temp && !touched.count(b.id)) b.live = false;
  // Greedy slot assignment: a slot is free again after the last read of its previous tenant.
  struct Slot { size_t free_after; Device device; };
  std::vector<Slot> slots;
  std::vector<std::pair<int, std::pair<size_t, size_t>>> order(live.begin(), live.end());
  std::sort(order.begin(), order.end(), [](auto& a, auto& b) { return a.second.first < b.second.first; });
  for (auto& [b, range] : order) {
    int chosen = -1;
    for (size_t s = 0; s < slots.size(); ++s)
      if (slots[s].free_after < range.first && slots[s].device == p.buffers[b].device) {
        chosen = static_cast<int>(s);
        break;
      }
    if (chosen < 0) {
      slots.push_back({range.second, p.buffers[b].device});
      chosen = static_cast<int>(slots.size() - 1);
    }
    slots[chosen].free_after = range.second;
    p.buffers[b].slot = chosen;
  }
  p.num_slots = static_cast<int>(slots.size());
}

void name_kernels(loop::Program& p) {
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    std::string name = "kernel" + std::to_string(i);
    size_t n = 0;
    for (const std::string& op : p.kernels[i].ops) {
      if (++n > 6) {
        name += "_etc";
        break;
      }
      name += "_" + op;
    }
    p.kernels[i].name = name;
  }
}

void schedule(loop::Program& p) {
  fuse_kernels(p);
  reuse_reduced_values(p);
  order_loops(p);
  collapse_dims(p);
  write_updates_in_place(p);
  split_reductions(p);
  plan_buffers(p);
  name_kernels(p);
  mark_aligned(p);
  if (p.device.type == DeviceType::CUDA) group_foreach(p);
}

}  // namespace kiln::schedule
