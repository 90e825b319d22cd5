// Multi-tensor launches. A training step's optimizer update is the same few pointwise ops over
// every parameter: after fusion, one kernel per parameter, each reading and writing that
// parameter's buffers. On the GPU each would be a launch of its own (hundreds per step); torch's
// foreach kernels instead cover many tensors per launch from a table of pointers. group_foreach
// finds such kernels, consecutive in the program, and records them as one ForeachGroup; kernels
// whose bodies are the same once their buffers and scalar arguments are numbered in order of use
// share a variant, whose body the CUDA generator writes once (a few variants per group: fusion
// puts two parameters of one shape, a LayerNorm's weight and bias, in one kernel of their own),
// over a table; the executor launches the group once.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "core/schedule/schedule.h"

namespace kiln::schedule {

using loop::Kernel;
using loop::SNode;
using loop::SOp;
using loop::SRef;
using loop::Stage;

namespace {

// A kernel's body with its buffers and scalar arguments numbered by first use: two kernels
// with the same text compute the same thing over other buffers.
struct Canonical {
  std::string text;
  std::vector<int> buffers, args;
  std::set<int> reads, writes;
  int64_t points = 0;
};

bool canonical(const loop::Program& p, const Kernel& k, Canonical& c) {
  if (k.vars.size() != 1) return false;
  for (const Stage& st : k.stages)
    if (st.kind != Stage::Kind::Loop || !st.vars.empty()) return false;
  auto n = k.ranges[0].as_const();
  if (!n || *n <= 0) return false;
  c.points = *n;
  const sym::Expr& x = k.vars[0];
  std::map<int, int> bid, aid;
  std::map<SRef, int> seen;
  auto buffer = [&](int b) {
    auto [it, fresh] = bid.emplace(b, static_cast<int>(c.buffers.size()));
    if (fresh) c.buffers.push_back(b);
    return std::to_string(it->second) + dtype_name(p.buffers[b].dtype);
  };
  bool ok = true;
  std::function<void(SRef)> walk = [&](SRef r) {
    if (r < 0 || !ok) return;
    if (auto it = seen.find(r); it != seen.end()) {
      c.text += "#" + std::to_string(it->second);
      return;
    }
    const SNode& s = p.exprs[r];
    c.text += std::string("(") + loop::sop_name(s.op) + ":" + dtype_name(s.dtype);
    switch (s.op) {
      case SOp::Load:
        if (!(s.index == x)) ok = false;
        c.reads.insert(s.buffer);
        c.text += ":b" + buffer(s.buffer);
        break;
      case SOp::Arg: {
        auto [it, fresh] = aid.emplace(static_cast<int>(s.ival), static_cast<int>(c.args.size()));
        if (fresh) c.args.push_back(static_cast<int>(s.ival));
        c.text += ":a" + std::to_string(it->second);
        break;
      }
      case SOp::Const: {
        char lit[64];
        std::snprintf(lit, sizeof lit, ":%.17g:%lld", s.fval, static_cast<long long>(s.ival));
        c.text += lit;
        break;
      }
      case SOp::Index:
      case SOp::Acc: ok = false; break;
      default: break;
    }
    walk(s.a);
    walk(s.b);
    walk(s.c);
    c.text += ")";
    seen.emplace(r, static_cast<int>(seen.size()));
  };
  for (const Stage& stage : k.stages)
    for (const loop::Store& st : stage.stores) {
      walk(st.value);
      if (!(st.index == x)) ok = false;
      c.writes.insert(st.buffer);
      c.text += "->b" + buffer(st.buffer) + ";";
    }
  return ok;
}

// The kernel parameter table: 8 bytes per member per buffer, argument, extent, variant and
// block start; kept under the 4 KB that every CUDA version takes as kernel parameters.
constexpr size_t kTableSlots = 480;
// Bodies one group's kernel holds.
constexpr size_t kMaxVariants = 4;

}  // namespace

void group_foreach(loop::Program& p) {
  std::vector<Canonical> canon(p.kernels.size());
  std::vector<bool> flat(p.kernels.size(), false);
  for (size_t i = 0; i < p.kernels.size(); ++i) flat[i] = canonical(p, p.kernels[i], canon[i]);
  loop::ForeachGroup g;
  std::set<int> written, touched;  // by the group's members so far
  std::vector<std::string> texts;  // per variant of the group
  size_t max_buffers = 0, max_args = 0;
  auto close = [&] {
    if (g.kernels.size() >= 2) {
      g.name = "foreach" + std::to_string(p.foreach_groups.size()) + "_" + p.kernels[g.kernels[0]].name;
      p.foreach_groups.push_back(std::move(g));
    }
    g = loop::ForeachGroup{};
    written.clear();
    touched.clear();
    texts.clear();
    max_buffers = max_args = 0;
  };
  for (const loop::Step& st : p.steps) {
    if (st.kind != loop::Step::Kind::Kernel || !flat[st.index]) {
      close();
      continue;
    }
    const Canonical& c = canon[st.index];
    auto variant = [&] { return static_cast<size_t>(std::find(texts.begin(), texts.end(), c.text) - texts.begin()); };
    bool fits = variant() < texts.size() || texts.size() < kMaxVariants;
    for (int b : c.reads) fits = fits && !written.count(b);
    for (int b : c.writes) fits = fits && !touched.count(b);
    const size_t per_member = std::max(max_buffers, c.buffers.size()) + std::max(max_args, c.args.size()) + 3;
    fits = fits && (g.kernels.size() + 1) * per_member + 1 <= kTableSlots;
    if (!fits) close();
    const size_t v = variant();
    if (v == texts.size()) {
      texts.push_back(c.text);
      g.variant_member.push_back(static_cast<int>(g.kernels.size()));
    }
    max_buffers = std::max(max_buffers, c.buffers.size());
    max_args = std::max(max_args, c.args.size());
    g.variant.push_back(static_cast<int>(v));
    g.kernels.push_back(st.index);
    g.buffers.push_back(c.buffers);
    g.args.push_back(c.args);
    g.points.push_back(c.points);
    written.insert(c.writes.begin(), c.writes.end());
    touched.insert(c.reads.begin(), c.reads.end());
    touched.insert(c.writes.begin(), c.writes.end());
  }
  close();
}

}  // namespace kiln::schedule
