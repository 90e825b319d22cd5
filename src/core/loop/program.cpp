#include "core/loop/program.h"

#include <set>

namespace kiln::loop {

Expr Buffer::bytes() const {
  // Extent of the layout: 1 + sum((size - 1) * stride), times the element size.
  Expr span = 1;
  for (size_t i = 0; i < sizes.size(); ++i) span = span + (sizes[i] - Expr(1)) * strides[i];
  for (const Expr& s : sizes)
    if (s.is_const(0)) return Expr(0);
  return (span + offset) * Expr(dtype_size(dtype));
}

std::vector<int> scalar_args_of(const Program& p, const Kernel& k) {
  std::set<int> used;
  std::set<SRef> seen;
  std::vector<SRef> stack;
  for (const Stage& st : k.stages) {
    if (st.kind == Stage::Kind::Reduce) stack.push_back(st.value);
    for (const Store& s : st.stores) stack.push_back(s.value);
  }
  while (!stack.empty()) {
    const SRef r = stack.back();
    stack.pop_back();
    if (r < 0 || !seen.insert(r).second) continue;
    const SNode& n = p.exprs[r];
    if (n.op == SOp::Arg) used.insert(static_cast<int>(n.ival));
    stack.insert(stack.end(), {n.a, n.b, n.c});
  }
  return {used.begin(), used.end()};
}

int Program::add_buffer(Buffer b) {
  b.id = static_cast<int>(buffers.size());
  buffers.push_back(std::move(b));
  return buffers.back().id;
}

namespace {
const char* kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::Input: return "input";
    case BufferKind::Output: return "output";
    case BufferKind::Temp: return "temp";
  }
  return "?";
}
}  // namespace

std::string Program::str() const {
  std::string s = "buffers:\n";
  for (const Buffer& b : buffers) {
    if (!b.live) continue;
    s += "  " + b.name + ": " + kind_name(b.kind) + " " + dtype_name(b.dtype) + sym::str(b.sizes) + " strides=" +
         sym::str(b.strides);
    if (b.slot >= 0) s += " slot=" + std::to_string(b.slot);
    s += "\n";
  }
  for (const Step& st : steps) {
    if (st.kind == Step::Kind::Extern) {
      const Extern& e = externs[st.index];
      std::string what = e.label();
      if (e.attrs.get_bool("in_place")) what += " (in place)";
      s += "extern " + what + "(";
      for (size_t i = 0; i < e.inputs.size(); ++i) {
        const BufferView& v = e.inputs[i];
        s += (i ? ", " : "") + (v.buffer < 0 ? std::string("None") : buffers[v.buffer].name + sym::str(v.sizes) + ":" + sym::str(v.strides));
      }
      s += ") -> " + buffers[e.output].name + "\n";
      continue;
    }
    const Kernel& k = kernels[st.index];
    s += "kernel " + k.name + " over " + sym::str(k.ranges) + " " + sym::str(k.vars) + ":\n";
    for (const Stage& stage : k.stages) {
      std::string inner = stage.vars.empty() ? "" : " for " + sym::str(stage.vars) + " in " + sym::str(stage.ranges);
      if (stage.kind == Stage::Kind::Reduce) {
        static const char* names[] = {"sum", "max", "min", "prod"};
        s += "  acc" + std::to_string(stage.acc) + " = " + names[static_cast<int>(stage.reduce)] + inner + ": " +
             exprs.str(stage.value) + "\n";
      }
      for (const Store& st2 : stage.stores)
        s += "  " + buffers[st2.buffer].name + "[" + st2.index.str() + "] =" + inner + " " + exprs.str(st2.value) + "\n";
    }
  }
  s += "outputs:";
  for (const Output& o : outputs)
    s += o.input_alias >= 0 ? " input" + std::to_string(o.input_alias) : " " + buffers[o.view.buffer].name;
  s += "\n";
  for (const ForeachGroup& g : foreach_groups) {
    s += "foreach " + g.name + ":";
    for (int k : g.kernels) s += " " + kernels[k].name;
    s += "\n";
  }
  return s;
}

std::string Extern::label() const {
  return !aten.empty() ? aten : attrs.has("target") ? attrs.get_str("target") : op;
}

bool Program::may_raise() const {
  if (device.type != DeviceType::CPU) return false;
  for (size_t r = 0; r < exprs.size(); ++r) {
    const SNode& n = exprs[static_cast<SRef>(r)];
    if ((n.op == SOp::FloorDiv || n.op == SOp::Mod || n.op == SOp::TruncDiv) && is_integral(n.dtype, true)) return true;
  }
  return false;
}

int Program::first_step_writing_inputs() const {
  std::vector<bool> is_input(buffers.size(), false);
  for (int b : inputs)
    if (b >= 0) is_input[static_cast<size_t>(b)] = true;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    if (s.kind == Step::Kind::Extern) {
      const Extern& e = externs[static_cast<size_t>(s.index)];
      if (e.attrs.get_bool("in_place") || (e.output >= 0 && is_input[static_cast<size_t>(e.output)])) return static_cast<int>(i);
      continue;
    }
    for (const Stage& st : kernels[static_cast<size_t>(s.index)].stages)
      for (const Store& x : st.stores)
        if (x.buffer >= 0 && is_input[static_cast<size_t>(x.buffer)]) return static_cast<int>(i);
  }
  return -1;
}

bool reduces_columns(const Program& p, const Kernel& k) {
  if (k.vars.empty()) return false;
  const Stage* reduce = nullptr;
  for (const Stage& st : k.stages) {
    if (st.vars.empty()) {
      if (st.kind == Stage::Kind::Reduce) return false;
      continue;
    }
    if (st.kind != Stage::Kind::Reduce || (reduce && (reduce->vars != st.vars || reduce->ranges != st.ranges))) return false;
    reduce = &st;
  }
  if (!reduce) return false;
  std::vector<sym::Expr> all = k.vars;
  all.insert(all.end(), reduce->vars.begin(), reduce->vars.end());
  const size_t out_inner = k.vars.size() - 1, red_inner = all.size() - 1;
  bool coalesced = false, rowwise = false;
  for (const Stage& st : k.stages) {
    if (st.vars.empty()) continue;
    std::set<SRef> seen;
    visit_loads(p.exprs, st.value, seen, [&](const SNode& ld) {
      auto a = sym::affine(ld.index, all);
      if (!a) return void(rowwise = true);
      bool walks = false, spreads = false;
      for (size_t d = k.vars.size(); d < all.size(); ++d) walks |= !a->coeffs[d].is_const(0);
      for (size_t d = 0; d < k.vars.size(); ++d) spreads |= !a->coeffs[d].is_const(0);
      if (!walks || !spreads) return;
      if (a->coeffs[red_inner].is_const(1) || !a->coeffs[out_inner].is_const(1)) rowwise = true;
      else coalesced = true;
    });
  }
  return coalesced && !rowwise;
}

}  // namespace kiln::loop
