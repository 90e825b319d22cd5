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
  std::vector<std::pair<int, int>> redirects;  // (output buffer, input buffer)
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
    int uses = 0;
    for (const loop::Output& x : p.outputs) uses += x.view.buffer == bo || x.view.buffer == bi || x.input_alias == input;
    if (uses != 1) continue;
    // One pointwise kernel writes it; the steps after that kernel never read the input.
    int writer = -1;
    bool ok = true;
    for (size_t si = 0; si < p.steps.size() && ok; ++si) {
      const loop::Step& st = p.steps[si];
      if (st.kind == loop::Step::Kind::Extern) {
        const loop::Extern& e = p.externs[st.index];
        if (e.output == bo || e.output == bi) ok = false;
        for (const loop::BufferView& v : e.inputs) ok &= !(writer >= 0 && v.buffer == bi);
        continue;
      }
      const Kernel& k = p.kernels[st.index];
      std::set<SRef> seen;
      bool touches_in = false;
      auto reads_in = [&](const SNode& n) { touches_in |= n.buffer == bi; };
      for (const Stage& s : k.stages) {
        if (s.kind == Stage::Kind::Reduce) loop::visit_loads(p.exprs, s.value, seen, reads_in);
        for (const loop::Store& x : s.stores) loop::visit_loads(p.exprs, x.value, seen, reads_in);
      }
      bool stores_out = false;
      for (const Stage& s : k.stages)
        for (const loop::Store& x : s.stores) stores_out |= x.buffer == bo, ok &= x.buffer != bi;
      if (stores_out) {
        if (writer >= 0) ok = false;
        writer = static_cast<int>(si);
      } else if (touches_in && writer >= 0) {
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
    if (ok) redirects.emplace_back(bo, bi);
  }
  for (const auto& [bo, bi] : redirects) {
    for (Kernel& k : p.kernels) {
      // (a kernel's buffer list is made later, by plan_buffers, from what it touches)
      std::unordered_map<SRef, SRef> memo;
      auto rename = [&](loop::ScalarCtx& c, const SNode& n, SRef self) {
        return n.op == SOp::Load && n.buffer == bo ? c.load(bi, n.index, n.dtype) : self;
      };
      for (Stage& st : k.stages) {
        if (st.kind == Stage::Kind::Reduce) st.value = p.exprs.rewrite(st.value, rename, memo);
        for (loop::Store& s : st.stores) {
          s.value = p.exprs.rewrite(s.value, rename, memo);
          if (s.buffer == bo) s.buffer = bi;
        }
      }
    }
    for (loop::Extern& e : p.externs)
      for (loop::BufferView& v : e.inputs)
        if (v.buffer == bo) v.buffer = bi;
    for (loop::Output& o : p.outputs)
      if (o.view.buffer == bo) o.view.buffer = bi;
    p.buffers[bo].live = false;
    p.buffers[bo].kind = loop::BufferKind::Temp;
  }
}

}  // namespace kiln::schedule
