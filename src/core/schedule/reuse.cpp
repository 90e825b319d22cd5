#include <set>
#include <unordered_map>

#include "core/schedule/schedule.h"

namespace kiln::schedule {

// In a row kernel, a later loop often recomputes the value an earlier reduction folded (softmax:
// exp(x - max) is summed, then divided by the sum). The reduction stores that value into the
// output element the loop writes, and the loop reads it back: one transcendental per element
// instead of two. The same thread writes and reads each element, in both backends.
void reuse_reduced_values(loop::Program& p) {
  using loop::SRef;
  using loop::Stage;
  for (loop::Kernel& k : p.kernels) {
    // An element can carry one reduction's value: a second would overwrite the first before
    // the loop reads it.
    std::set<int> carriers;
    for (size_t i = 0; i < k.stages.size(); ++i) {
      Stage& r = k.stages[i];
      if (r.kind != Stage::Kind::Reduce || r.vars.empty() || !r.stores.empty()) continue;
      const SRef v = r.value;
      const loop::SNode& vn = p.exprs[v];
      if (vn.op == loop::SOp::Load || vn.op == loop::SOp::Const) continue;  // nothing to save
      for (size_t j = i + 1; j < k.stages.size() && r.stores.empty(); ++j) {
        Stage& l = k.stages[j];
        if (l.kind != Stage::Kind::Loop || l.vars != r.vars) continue;
        for (loop::Store& s : l.stores) {
          if (p.buffers[s.buffer].dtype != p.exprs.dtype(v) || s.value == v || carriers.count(s.buffer)) continue;
          bool found = false;
          std::unordered_map<SRef, SRef> memo;
          SRef rewritten = p.exprs.rewrite(
              s.value,
              [&](loop::ScalarCtx& c, const loop::SNode& n, SRef self) {
                if (self != v) return self;
                found = true;
                return c.load(s.buffer, s.index, n.dtype);
              },
              memo);
          if (!found) continue;
          r.stores.push_back({s.buffer, s.index, v});
          carriers.insert(s.buffer);
          s.value = rewritten;
          break;
        }
      }
    }
  }
}

}  // namespace kiln::schedule
