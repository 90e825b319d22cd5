#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "core/schedule/schedule.h"

namespace kiln::schedule {
namespace {

using loop::Kernel;
using loop::SNode;
using loop::SOp;
using loop::SRef;
using loop::Stage;
using sym::Expr;
using Exprs = std::vector<Expr>;

// Rewrites every load index in the value through `f`.
SRef map_indices(loop::ScalarCtx& s, SRef root, const std::function<Expr(const Expr&)>& f) {
  std::unordered_map<SRef, SRef> memo;
  return s.rewrite(
      root,
      [&](loop::ScalarCtx& c, const SNode& n, SRef self) {
        if (n.op == SOp::Index) return c.size_value(f(n.index), n.dtype);  // arange's values
        if (n.op != SOp::Load) return self;
        return c.load(n.buffer, f(n.index), n.dtype);
      },
      memo);
}

void for_each_value(Kernel& k, const std::function<void(SRef&)>& f) {
  for (Stage& st : k.stages) {
    if (st.kind == Stage::Kind::Reduce) f(st.value);
    for (loop::Store& s : st.stores) f(s.value);
  }
}

void substitute_kernel(loop::ScalarCtx& s, Kernel& k, const std::map<Expr, Expr>& repl) {
  auto sub = [&](const Expr& e) { return sym::substitute(e, repl); };
  for_each_value(k, [&](SRef& v) { v = map_indices(s, v, sub); });
  for (Stage& st : k.stages)
    for (loop::Store& x : st.stores) x.index = sub(x.index);
}

// A kernel's iteration space with unit dims dropped: outer dims P, inner (reduction) dims Q.
struct Space {
  Exprs P, Q;
  bool operator==(const Space& o) const { return P == o.P && Q == o.Q; }
};

Exprs nonunit(const Exprs& r) {
  Exprs out;
  for (const Expr& e : r)
    if (!e.is_const(1)) out.push_back(e);
  return out;
}

bool is_reduction(const Kernel& k) { return !k.stages.empty() && k.stages[0].kind == Stage::Kind::Reduce; }

class Fuser {
 public:
  explicit Fuser(loop::Program& p) : p_(p), s_(p.exprs) {}

  void run() {
    std::vector<Kernel> out_kernels;
    std::vector<loop::Step> out_steps;
    bool open = false;
    auto flush = [&] {
      if (!open) return;
      out_kernels.push_back(std::move(cur_));
      out_steps.push_back({loop::Step::Kind::Kernel, static_cast<int>(out_kernels.size() - 1)});
      open = false;
    };
    for (const loop::Step& step : p_.steps) {
      if (step.kind == loop::Step::Kind::Extern) {
        flush();
        out_steps.push_back(step);
        continue;
      }
      Kernel k = p_.kernels[step.index];
      if (open && try_merge(k)) continue;
      flush();
      start(std::move(k));
      open = true;
    }
    flush();
    p_.kernels = std::move(out_kernels);
    p_.steps = std::move(out_steps);
    remove_dead_stores();
  }

 private:
  Exprs group_vars(const std::string& prefix, const Exprs& ranges) {
    Exprs v;
    for (size_t i = 0; i < ranges.size(); ++i) {
      v.push_back(Expr::index_var(prefix + std::to_string(i), ranges[i]));
    }
    return v;
  }

  // Maps a kernel's own vars onto the group's: non-unit dims in order, unit dims to 0.
  static void map_vars(const Exprs& vars, const Exprs& ranges, const Exprs& targets, std::map<Expr, Expr>& repl) {
    size_t j = 0;
    for (size_t i = 0; i < vars.size(); ++i) repl[vars[i]] = ranges[i].is_const(1) ? Expr(0) : targets[j++];
  }

  void start(Kernel k) {
    space_.P = nonunit(k.ranges);
    space_.Q = is_reduction(k) ? nonunit(k.stages[0].ranges) : Exprs{};
    xs_ = group_vars("x", space_.P);
    rs_ = group_vars("r", space_.Q);
    std::map<Expr, Expr> repl;
    map_vars(k.vars, k.ranges, xs_, repl);
    if (is_reduction(k)) map_vars(k.stages[0].vars, k.stages[0].ranges, rs_, repl);
    substitute_kernel(s_, k, repl);
    for (Stage& st : k.stages)
      if (!st.vars.empty() || st.kind == Stage::Kind::Reduce) {
        st.vars = rs_;
        st.ranges = space_.Q;
      }
    cur_ = std::move(k);
    cur_.vars = xs_;
    cur_.ranges = space_.P;
  }

  bool try_merge(Kernel k) {
    Space saved_space = space_;
    Exprs saved_rs = rs_;
    if (merge(std::move(k))) return true;
    space_ = saved_space;
    rs_ = saved_rs;
    return false;
  }

  bool merge(Kernel k) {
    Exprs P = nonunit(k.ranges);
    std::map<Expr, Expr> repl;
    bool inner = false;
    if (is_reduction(k)) {
      Exprs Q = nonunit(k.stages[0].ranges);
      if (P != space_.P || Q.empty()) return false;
      if (!space_.Q.empty() && Q != space_.Q) return false;
      if (space_.Q.empty()) {
        // The group so far ran at outer points only: it can take this inner space.
        space_.Q = Q;
        rs_ = group_vars("r", Q);
      }
      map_vars(k.vars, k.ranges, xs_, repl);
      map_vars(k.stages[0].vars, k.stages[0].ranges, rs_, repl);
    } else {
      Exprs PQ = space_.P;
      PQ.insert(PQ.end(), space_.Q.begin(), space_.Q.end());
      if (!space_.Q.empty() && P == PQ) {
        inner = true;
        Exprs targets = xs_;
        targets.insert(targets.end(), rs_.begin(), rs_.end());
        map_vars(k.vars, k.ranges, targets, repl);
      } else if (P == space_.P) {
        map_vars(k.vars, k.ranges, xs_, repl);
      } else {
        return false;
      }
    }
    substitute_kernel(s_, k, repl);
    if (is_reduction(k)) {
      k.stages[0].vars = rs_;
      k.stages[0].ranges = space_.Q;
    } else if (inner) {
      k.stages[0].vars = rs_;
      k.stages[0].ranges = space_.Q;
    }
    // Every read of a buffer this group writes must hit the element computed at the same
    // point by the same thread; such reads of outer-point values become register uses.
    std::map<std::pair<int, uint64_t>, std::pair<SRef, bool>> written;  // (buffer, index) -> (value, inner)
    std::set<int> written_buffers;
    for (const Stage& st : cur_.stages)
      for (const loop::Store& s : st.stores) {
        written[{s.buffer, s.index.id()}] = {s.value, !st.vars.empty()};
        written_buffers.insert(s.buffer);
      }
    bool ok = true;
    for (Stage& st : k.stages) {
      bool stage_inner = !st.vars.empty();
      auto fix = [&](SRef v) {
        std::unordered_map<SRef, SRef> memo;
        return s_.rewrite(
            v,
            [&](loop::ScalarCtx& c, const SNode& n, SRef self) {
              if (n.op != SOp::Load || !written_buffers.count(n.buffer)) return self;
              auto it = written.find({n.buffer, n.index.id()});
              if (it == written.end()) {
                ok = false;
                return self;
              }
              auto [value, in_inner] = it->second;
              if (!in_inner) return value;        // computed at this outer point: reuse it
              if (stage_inner) return self;       // same element, same thread, earlier loop
              ok = false;
              return self;
            },
            memo);
      };
      if (st.kind == Stage::Kind::Reduce) st.value = fix(st.value);
      for (loop::Store& s : st.stores) s.value = fix(s.value);
    }
    if (!ok) return false;
    for (Stage& st : k.stages) cur_.stages.push_back(st);
    for (auto& o : k.ops)
      if (std::find(cur_.ops.begin(), cur_.ops.end(), o) == cur_.ops.end()) cur_.ops.push_back(o);
    return true;
  }

  void collect_loads(SRef r, std::set<int>& out, std::set<SRef>& seen) {
    if (r < 0 || !seen.insert(r).second) return;
    const SNode& n = s_[r];
    if (n.op == SOp::Load) out.insert(n.buffer);
    collect_loads(n.a, out, seen);
    collect_loads(n.b, out, seen);
    collect_loads(n.c, out, seen);
  }

  void remove_dead_stores() {
    std::set<int> read;
    for (Kernel& k : p_.kernels) {
      std::set<SRef> seen;
      for_each_value(k, [&](SRef& v) { collect_loads(v, read, seen); });
    }
    for (const loop::Extern& e : p_.externs)
      for (const loop::BufferView& v : e.inputs) read.insert(v.buffer);
    for (Kernel& k : p_.kernels) {
      for (Stage& st : k.stages) {
        st.stores.erase(std::remove_if(st.stores.begin(), st.stores.end(),
                                       [&](const loop::Store& s) {
                                         const loop::Buffer& b = p_.buffers[s.buffer];
                                         return b.kind == loop::BufferKind::Temp && !b.keep && !read.count(s.buffer);
                                       }),
                        st.stores.end());
      }
      k.stages.erase(std::remove_if(k.stages.begin(), k.stages.end(),
                                    [](const Stage& st) { return st.kind == Stage::Kind::Loop && st.stores.empty(); }),
                     k.stages.end());
    }
  }

  loop::Program& p_;
  loop::ScalarCtx& s_;
  Kernel cur_;
  Space space_;
  Exprs xs_, rs_;
};

}  // namespace

void fuse_kernels(loop::Program& p) { Fuser(p).run(); }

}  // namespace kiln::schedule
