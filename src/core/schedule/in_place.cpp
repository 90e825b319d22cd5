// In-place updates of graph inputs written where the input lies. Capture computes an update of
// an input (an optimizer's parameter, its moments) out of place, and the runtime copies the
// result into the caller's tensor after the graph: for a training step's parameters and state
// that is a second pass over all of them. Where the kernel that computes the update reads the
// input only at the element it writes, and nothing after it reads the old value, the kernel
// stores straight into the input, as eager's in-place op does; the write-back then finds the
// result already there (tensor_bridge's copy_into).
#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/schedule/schedule.h"

namespace kiln::schedule {

using loop::Kernel;
using loop::SNode;
using loop::SOp;
using loop::SRef;
using loop::Stage;

namespace {

bool same_layout(const loop::Buffer& a, const loop::Buffer& b) {
  return a.dtype == b.dtype && a.device == b.device && a.sizes == b.sizes && a.strides == b.strides &&
         a.offset == b.offset;
}

}  // namespace

void write_updates_in_place(loop::Program& p) {
  // A program that may raise midway leaves inputs alone: the runtime then reruns the call
  // eagerly, which makes eager's updates before the failing op and none after.
  if (p.may_raise()) return;
  // What each step reads and writes, found once: an optimizer's program has hundreds of
  // updates over hundreds of kernels.
  struct Access {
    std::unordered_set<int> reads, writes;
  };
  std::vector<Access> access(p.steps.size());
  for (size_t si = 0; si < p.steps.size(); ++si) {
    const loop::Step& st = p.steps[si];
    Access& a = access[si];
    if (st.kind == loop::Step::Kind::Extern) {
      const loop::Extern& e = p.externs[st.index];
      a.writes.insert(e.output);
      for (const loop::BufferView& v : e.inputs) a.reads.insert(v.buffer);
      continue;
    }
    std::set<SRef> seen;
    auto read = [&](const SNode& n) { a.reads.insert(n.buffer); };
    for (const Stage& s : p.kernels[st.index].stages) {
      if (s.kind == Stage::Kind::Reduce) loop::visit_loads(p.exprs, s.value, seen, read);
      for (const loop::Store& x : s.stores) {
        loop::visit_loads(p.exprs, x.value, seen, read);
        a.writes.insert(x.buffer);
      }
    }
  }
  std::unordered_map<int, int> output_uses;  // buffer (or -2 - input for an alias) -> outputs naming it
  for (const loop::Output& x : p.outputs) {
    if (x.view.buffer >= 0) ++output_uses[x.view.buffer];
    if (x.input_alias >= 0) ++output_uses[-2 - x.input_alias];
  }
  std::unordered_map<int, int> redirects;  // output buffer -> input buffer
  for (const auto& [input, output] : p.input_updates) {
    if (output < 0 || output >= static_cast<int>(p.outputs.size()) || input >= static_cast<int>(p.inputs.size())) continue;
    const loop::Output& o = p.outputs[output];
    if (o.input_alias >= 0 || o.view.buffer < 0) continue;
    const int bo = o.view.buffer, bi = p.inputs[input];
    const loop::Buffer &BO = p.buffers[bo], &BI = p.buffers[bi];
    // The output is its whole buffer, laid out as the input, and returned once.
    if (BO.kind != loop::BufferKind::Output || !same_layout(BO, BI) || !(o.view.sizes == BO.sizes) ||
        !(o.view.strides == BO.strides) || !(o.view.offset == BO.offset))
      continue;
    auto uses_of = [&](int key) {
      auto it = output_uses.find(key);
      return it == output_uses.end() ? 0 : it->second;
    };
    if (uses_of(bo) + (bi != bo ? uses_of(bi) : 0) + uses_of(-2 - input) != 1) continue;
    // One pointwise kernel writes it; the steps after that kernel never read the input.
    int writer = -1;
    bool ok = true;
    for (size_t si = 0; si < p.steps.size() && ok; ++si) {
      const Access& a = access[si];
      const bool reads_in = a.reads.count(bi) > 0;
      if (p.steps[si].kind == loop::Step::Kind::Extern) {
        ok = !a.writes.count(bo) && !a.writes.count(bi) && !(writer >= 0 && reads_in);
        continue;
      }
      ok = !a.writes.count(bi);
      if (a.writes.count(bo)) {
        if (writer >= 0) ok = false;
        writer = static_cast<int>(si);
      } else if (reads_in && writer >= 0) {
        ok = false;
      }
    }
    if (!ok || writer < 0) continue;
    const Kernel& k = p.kernels[p.steps[writer].index];
    std::vector<loop::Store> stores;  // a pointwise kernel's stores, in order, whatever stage holds them
    for (const Stage& st : k.stages) {
      ok &= st.kind == Stage::Kind::Loop && st.vars.empty();
      stores.insert(stores.end(), st.stores.begin(), st.stores.end());
    }
    if (!ok) continue;
    // Within the kernel: each point reads the input only where it writes it, and every such read
    // is made before the store (by this store's value or an earlier one's, held in a register).
    size_t at = 0;
    while (stores[at].buffer != bo) ++at;
    // Loads are hash-consed by (buffer, index, dtype): a later store's read of the input at the
    // store's index in a dtype an earlier value read it in is that same load, in a register.
    std::set<SRef> seen;
    std::set<DType> read_before;
    for (size_t i = 0; i < stores.size(); ++i) {
      if (i != at && stores[i].buffer == bo) ok = false;
      if (i == at + 1) seen.clear();
      loop::visit_loads(p.exprs, stores[i].value, seen, [&](const SNode& n) {
        if (n.buffer != bi) return;
        ok &= n.index == stores[at].index;
        if (i <= at) read_before.insert(n.dtype);
        else ok &= read_before.count(n.dtype) > 0;
      });
    }
    if (ok) redirects.emplace(bo, bi);
  }
  if (redirects.empty()) return;
  auto target = [&](int b) {
    auto it = redirects.find(b);
    return it == redirects.end() ? b : it->second;
  };
  for (Kernel& k : p.kernels) {
    // (a kernel's buffer list is made later, by plan_buffers, from what it touches)
    std::unordered_map<SRef, SRef> memo;
    auto rename = [&](loop::ScalarCtx& c, const SNode& n, SRef self) {
      return n.op == SOp::Load && redirects.count(n.buffer) ? c.load(target(n.buffer), n.index, n.dtype) : self;
    };
    for (Stage& st : k.stages) {
      if (st.kind == Stage::Kind::Reduce) st.value = p.exprs.rewrite(st.value, rename, memo);
      for (loop::Store& s : st.stores) {
        s.value = p.exprs.rewrite(s.value, rename, memo);
        s.buffer = target(s.buffer);
      }
    }
  }
  for (loop::Extern& e : p.externs)
    for (loop::BufferView& v : e.inputs) v.buffer = target(v.buffer);
  for (loop::Output& o : p.outputs)
    if (o.view.buffer >= 0) o.view.buffer = target(o.view.buffer);
  for (const auto& [bo, bi] : redirects) {
    p.buffers[bo].live = false;
    p.buffers[bo].kind = loop::BufferKind::Temp;
  }
}

}  // namespace kiln::schedule
