// Split reductions. A reduction of many points into few outputs, a training batch norm's
// per-channel statistics over N·H·W or its backward's sums, runs on few blocks: one per output
// row, or one per 32 outputs when the kept dim is the contiguous one (the CUDA generator's
// column plan). With 64 channels that is 2 of the GPU's 132 SMs reading a 50 MB activation.
//
// split_reductions cuts such a kernel's reduced space in two, as TorchInductor's split
// reductions do: the outer part of the reduced loops joins the kernel's outer space, so each
// reduction first produces S partial results per output (a kernel with S times the blocks),
// and a small kernel combines the partials with the same operator (a sum of partial sums, a max
// of partial maxima). A later reduction that reads an earlier one's result (a variance after
// its mean) reads the combined total from a buffer; the kernel's stores at its outer points
// (the statistics, the running averages) move to the last combining kernel, which has every
// total. The split follows the loops' structure (whole outer loops, then a divisor of the next),
// so every index stays affine and the generator keeps its coalesced plans.
#include <algorithm>
#include <map>
#include <set>

#include "core/ir/graph.h"
#include "core/schedule/schedule.h"

namespace kiln::schedule {

using loop::Kernel;
using loop::SNode;
using loop::SOp;
using loop::SRef;
using loop::Stage;
using sym::Expr;

namespace {

// Where a split pays, per device: how many parallel units (GPU blocks, CPU loop iterations the
// threads share) the partial results should give, the fewest reduced points a partial keeps
// (below that, combining partials costs more than the reading it spreads), and the fewest
// elements a reduction reads to be worth two kernels.
struct Policy {
  int64_t target_units;
  int64_t min_points_per_partial;
  int64_t min_elements;
};
// The GPU: a few blocks per SM of a large GPU.
constexpr Policy kGpu{512, 1024, 1 << 20};
// The CPU: enough iterations for a many-core machine's threads (the generator forks its team
// over the outer loop only), partials of a few cache pages each.
constexpr Policy kCpu{128, 8192, 1 << 20};

int64_t const_product(const std::vector<Expr>& xs) {
  int64_t n = 1;
  for (const Expr& x : xs) n *= *x.as_const();
  return n;
}

bool all_const(const std::vector<Expr>& xs) {
  for (const Expr& x : xs)
    if (!x.as_const()) return false;
  return true;
}

// The row-major index of `vars` in a buffer of extents `ranges`.
Expr flat_index(const std::vector<Expr>& vars, const std::vector<Expr>& ranges) {
  Expr idx = 0;
  for (size_t i = 0; i < vars.size(); ++i) idx = idx * ranges[i] + vars[i];
  return idx;
}

// The loop structure of a kernel split takes: every looping stage a reduction over one shared
// space of constant extent, the other stages stores at the outer points, and no stage reading
// what the kernel writes (its stages are reordered and spread over several kernels).
const Stage* splittable(const loop::Program& p, const Kernel& k) {
  if (!all_const(k.ranges)) return nullptr;
  const Stage* reduce = nullptr;
  std::set<int> stored;
  for (const Stage& st : k.stages) {
    for (const loop::Store& s : st.stores) stored.insert(s.buffer);
    if (st.vars.empty()) {
      if (st.kind == Stage::Kind::Reduce) return nullptr;
      continue;
    }
    if (st.kind != Stage::Kind::Reduce || (reduce && (reduce->vars != st.vars || reduce->ranges != st.ranges)))
      return nullptr;
    reduce = &st;
  }
  if (!reduce || !all_const(reduce->ranges)) return nullptr;
  bool reads_own = false;
  std::set<SRef> seen;
  auto check = [&](SRef v) {
    loop::visit_loads(p.exprs, v, seen, [&](const SNode& n) { reads_own |= stored.count(n.buffer) > 0; });
  };
  for (const Stage& st : k.stages) {
    if (st.kind == Stage::Kind::Reduce) check(st.value);
    for (const loop::Store& s : st.stores) check(s.value);
  }
  return reads_own ? nullptr : reduce;
}

// How many parallel units the generator gives the kernel as it is. A column reduction
// (loop::reduces_columns) puts neighbouring outputs side by side: on the GPU 32 to a block, on
// the CPU the whole innermost outer loop in vector lanes, so the threads share the rest. Other
// reductions: a GPU block per output, a CPU iteration per output.
int64_t units_unsplit(const loop::Program& p, const Kernel& k, int64_t outputs) {
  if (k.vars.empty()) return 1;
  if (!loop::reduces_columns(p, k)) return outputs;
  if (p.device.type == DeviceType::CUDA) return (outputs + 31) / 32;
  auto inner = k.ranges.back().as_const();
  return inner && *inner > 0 ? outputs / *inner : outputs;
}

struct Split {
  std::vector<Expr> outer_vars, outer_ranges;  // the reduced loops' part that becomes outer
  std::vector<Expr> inner_vars, inner_ranges;  // what each partial still reduces
  std::map<Expr, Expr> repl;                   // old reduced var -> its expression in the new vars
  int64_t parts = 1;
};

// Takes whole reduced loops from the outermost while the parts stay under `want` and the
// partials keep enough points, then a divisor of the next loop's extent.
Split choose_split(const Stage& reduce, int64_t want, int64_t points, int64_t min_points) {
  Split s;
  size_t i = 0;
  for (; i < reduce.vars.size(); ++i) {
    const int64_t r = *reduce.ranges[i].as_const();
    if (s.parts * r > want || points / (s.parts * r) < min_points) break;
    Expr v = Expr::index_var("sp" + std::to_string(i), r);
    s.outer_vars.push_back(v), s.outer_ranges.push_back(r);
    s.repl[reduce.vars[i]] = v;
    s.parts *= r;
  }
  if (i < reduce.vars.size()) {
    const int64_t r = *reduce.ranges[i].as_const();
    int64_t d = 1;
    for (int64_t c = 2; c < r && s.parts * c <= want; ++c)
      if (r % c == 0 && points / (s.parts * c) >= min_points) d = c;
    if (d > 1) {
      Expr hi = Expr::index_var("sp" + std::to_string(i), d), lo = Expr::index_var("sl" + std::to_string(i), r / d);
      s.outer_vars.push_back(hi), s.outer_ranges.push_back(d);
      s.inner_vars.push_back(lo), s.inner_ranges.push_back(r / d);
      s.repl[reduce.vars[i]] = hi * Expr(r / d) + lo;
      s.parts *= d;
    } else {
      s.inner_vars.push_back(reduce.vars[i]), s.inner_ranges.push_back(reduce.ranges[i]);
    }
    for (++i; i < reduce.vars.size(); ++i) s.inner_vars.push_back(reduce.vars[i]), s.inner_ranges.push_back(reduce.ranges[i]);
  }
  return s;
}

class Splitter {
 public:
  Splitter(loop::Program& p) : p_(p) {}

  // The kernels that replace `k`, or empty when it stays as it is.
  std::vector<Kernel> split(const Kernel& k) {
    const Stage* reduce = splittable(p_, k);
    if (!reduce) return {};
    const int64_t outputs = const_product(k.ranges), points = const_product(reduce->ranges);
    const Policy& policy = p_.device.type == DeviceType::CUDA ? kGpu : kCpu;
    if (outputs * points < policy.min_elements) return {};
    // Floating products keep torch's CPU order (see Stage::torch_vector_block).
    for (const Stage& st : k.stages)
      if (st.kind == Stage::Kind::Reduce && st.reduce == ops::ReduceOp::Prod && is_floating(st.acc_dtype) &&
          p_.device.type != DeviceType::CUDA)
        return {};
    const int64_t units = units_unsplit(p_, k, outputs);
    if (units * 2 > policy.target_units) return {};
    Split s = choose_split(*reduce, policy.target_units / units, points, policy.min_points_per_partial);
    if (s.parts < 4) return {};
    return build(k, s);
  }

 private:
  std::vector<Kernel> build(const Kernel& k, const Split& s) {
    std::vector<Expr> pvars = s.outer_vars, pranges = s.outer_ranges;
    pvars.insert(pvars.end(), k.vars.begin(), k.vars.end());
    pranges.insert(pranges.end(), k.ranges.begin(), k.ranges.end());
    const Expr partial_at = flat_index(pvars, pranges), total_at = flat_index(k.vars, k.ranges);
    // The accumulators later reductions read: their totals go through a buffer.
    std::set<int> read_later;
    {
      std::set<SRef> seen;
      for (const Stage& st : k.stages)
        if (st.kind == Stage::Kind::Reduce) walk_accs(st.value, seen, read_later);
    }
    std::map<int, int> partials, totals;  // acc -> buffer
    std::vector<Kernel> out;
    for (const Stage& st : k.stages) {
      if (st.kind != Stage::Kind::Reduce) continue;
      Kernel part;
      part.vars = pvars, part.ranges = pranges, part.ops = k.ops;
      Stage r = st;
      r.vars = s.inner_vars, r.ranges = s.inner_ranges;
      r.torch_vector_block = false;
      r.value = rewrite(st.value, s.repl, totals, total_at);
      for (loop::Store& x : r.stores) {
        x.value = rewrite(x.value, s.repl, totals, total_at);
        x.index = sym::substitute(x.index, s.repl);
      }
      const int w = temp(pranges, st.acc_dtype);
      partials[st.acc] = w;
      Stage done;
      done.stores.push_back({w, partial_at, p_.exprs.acc(st.acc, st.acc_dtype)});
      part.stages = {r, done};
      out.push_back(std::move(part));
      if (read_later.count(st.acc)) {
        Kernel total = combining(k, s, {&st}, partials);
        const int t = temp(k.ranges, st.acc_dtype);
        totals[st.acc] = t;
        Stage keep;
        keep.stores.push_back({t, total_at, p_.exprs.acc(st.acc, st.acc_dtype)});
        total.stages.push_back(keep);
        out.push_back(std::move(total));
      }
    }
    std::vector<const Stage*> reductions;
    for (const Stage& st : k.stages)
      if (st.kind == Stage::Kind::Reduce) reductions.push_back(&st);
    Kernel last = combining(k, s, reductions, partials);
    for (const Stage& st : k.stages)
      if (st.kind != Stage::Kind::Reduce) last.stages.push_back(st);
    out.push_back(std::move(last));
    return out;
  }

  // A kernel over `k`'s outer points that combines the partials of `reductions` into their
  // accumulators (the same ids, so the stages that follow read them as before).
  Kernel combining(const Kernel& k, const Split& s, const std::vector<const Stage*>& reductions,
                   const std::map<int, int>& partials) {
    Kernel c;
    c.vars = k.vars, c.ranges = k.ranges, c.ops = k.ops;
    std::vector<Expr> pvars = s.outer_vars, pranges = s.outer_ranges;
    pvars.insert(pvars.end(), k.vars.begin(), k.vars.end());
    pranges.insert(pranges.end(), k.ranges.begin(), k.ranges.end());
    for (const Stage* st : reductions) {
      Stage r;
      r.kind = Stage::Kind::Reduce;
      r.vars = s.outer_vars, r.ranges = s.outer_ranges;
      r.acc = st->acc, r.reduce = st->reduce, r.acc_dtype = st->acc_dtype, r.result_dtype = st->result_dtype;
      r.value = p_.exprs.load(partials.at(st->acc), flat_index(pvars, pranges), st->acc_dtype);
      c.stages.push_back(r);
    }
    return c;
  }

  void walk_accs(SRef r, std::set<SRef>& seen, std::set<int>& accs) const {
    if (r < 0 || !seen.insert(r).second) return;
    const SNode& n = p_.exprs[r];
    if (n.op == SOp::Acc) accs.insert(n.acc);
    walk_accs(n.a, seen, accs), walk_accs(n.b, seen, accs), walk_accs(n.c, seen, accs);
  }

  // `v` with the reduced vars replaced and earlier reductions' results read from their totals.
  SRef rewrite(SRef v, const std::map<Expr, Expr>& repl, const std::map<int, int>& totals, const Expr& total_at) {
    std::unordered_map<SRef, SRef> memo;
    return p_.exprs.rewrite(
        v,
        [&](loop::ScalarCtx& c, const SNode& n, SRef self) {
          switch (n.op) {
            case SOp::Load: return c.load(n.buffer, sym::substitute(n.index, repl), n.dtype);
            case SOp::Index: return c.size_value(sym::substitute(n.index, repl), n.dtype);
            case SOp::Acc: return c.load(totals.at(n.acc), total_at, n.dtype);
            default: return self;
          }
        },
        memo);
  }

  int temp(const std::vector<Expr>& sizes, DType t) {
    loop::Buffer b;
    b.name = "buf" + std::to_string(p_.buffers.size());
    b.dtype = t;
    b.device = p_.device;
    b.sizes = sizes;
    b.strides = ir::contiguous_strides(sizes);
    b.kind = loop::BufferKind::Temp;
    return p_.add_buffer(b);
  }

  loop::Program& p_;
};

}  // namespace

void split_reductions(loop::Program& p) {
  Splitter splitter(p);
  std::vector<Kernel> kernels;
  std::vector<loop::Step> steps;
  for (const loop::Step& st : p.steps) {
    if (st.kind != loop::Step::Kind::Kernel) {
      steps.push_back(st);
      continue;
    }
    std::vector<Kernel> parts = splitter.split(p.kernels[st.index]);
    if (parts.empty()) parts.push_back(p.kernels[st.index]);
    for (Kernel& k : parts) {
      steps.push_back({loop::Step::Kind::Kernel, static_cast<int>(kernels.size())});
      kernels.push_back(std::move(k));
    }
  }
  p.kernels = std::move(kernels);
  p.steps = std::move(steps);
}

}  // namespace kiln::schedule
