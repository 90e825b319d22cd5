#include "core/lower/lower.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>

#include "core/ops/registry.h"

namespace kiln::lower {
namespace {

using loop::Buffer;
using loop::BufferKind;
using loop::Kernel;
using loop::SRef;
using loop::Stage;
using sym::Expr;
using Exprs = std::vector<Expr>;

// A value as the lowering sees it: how to read it at an index, and where it lives if realized.
struct Value {
  Exprs sizes;
  DType dtype;
  std::function<SRef(const Exprs&)> read;
  int buffer = -1;
  std::vector<std::string> ops;  // graph ops inlined into this value
};

constexpr size_t kInlineCostLimit = 40;  // scalar nodes a shared value may cost before it is realized

// Where torch's CPU kernels fold a reduction's elements into each output, for a product of
// floats (whose last bits depend on the order). TensorIterator makes the reduced dims the
// fastest, ordered by the input's strides (smallest first), and merges neighbours that are
// contiguous with each other; each output then folds its elements in that order, one element
// after another, except that a merged block of stride 1 goes through the vectorized kernel
// (codegen: Stage::torch_vector_block). The groups, outermost first; nullopt where that order
// is not plain: symbolic or zero sizes, broadcast (stride 0) or equal strides, nothing reduced.
struct ReduceGroup {
  std::vector<size_t> dims;  // outermost first
  int64_t size = 1;          // elements of the block
  int64_t stride = 0;        // of its innermost dim
};

std::optional<std::vector<ReduceGroup>> torch_reduce_order(const ir::TensorMeta& m, const std::vector<bool>& reduced) {
  if (m.strides.size() != m.sizes.size()) return std::nullopt;
  std::vector<std::pair<int64_t, size_t>> dims;  // (stride, dim) of reduced dims of size > 1
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    auto size = m.sizes[i].as_const();
    if (!size || *size == 0) return std::nullopt;
    if (!reduced[i] || *size == 1) continue;
    auto stride = m.strides[i].as_const();
    if (!stride || *stride <= 0) return std::nullopt;
    dims.emplace_back(*stride, i);
  }
  if (dims.empty()) return std::nullopt;
  std::sort(dims.begin(), dims.end());
  for (size_t i = 1; i < dims.size(); ++i)
    if (dims[i].first == dims[i - 1].first) return std::nullopt;
  std::vector<ReduceGroup> inner_first;
  for (const auto& [stride, d] : dims) {
    const int64_t size = *m.sizes[d].as_const();
    if (!inner_first.empty()) {
      ReduceGroup& g = inner_first.back();
      if (stride == g.stride * g.size) {  // contiguous with the block so far: one dim for torch
        g.dims.insert(g.dims.begin(), d);
        g.size *= size;
        continue;
      }
    }
    inner_first.push_back({{d}, size, stride});
  }
  return std::vector<ReduceGroup>(inner_first.rbegin(), inner_first.rend());
}

class Lowering {
 public:
  Lowering(const ir::Graph& g, loop::Program& p) : g_(g), p_(p), s_(p.exprs) {}

  bool run(std::string& error) {
    std::unordered_map<const ir::Node*, int> output_pos;
    for (size_t i = 0; i < g_.outputs().size(); ++i) output_pos.emplace(g_.outputs()[i], static_cast<int>(i));
    // Python ints as symbols: bound to the values the runtime passes (input -1, by position),
    // unless an input dim has the same symbol (read from it, like any size).
    for (size_t i = 0; i < g_.scalar_symbols.size(); ++i) p_.scalar_symbols.push_back(g_.scalar_symbols[i]);
    p_.scalar_args = g_.scalar_inputs;
    p_.input_updates = g_.input_updates;
    for (auto& up : g_.nodes()) {
      const ir::Node* n = up.get();
      if (n->meta.device != ir::TensorMeta{}.device && !n->meta.wrapped_number) p_.device = n->meta.device;
      if (!lower_node(n, error)) return false;
    }
    for (const ir::Node* o : g_.outputs()) {
      Value& v = values_.at(o);
      loop::Output out;
      if (o->op_name() == "placeholder") {
        out.input_alias = static_cast<int>(o->attrs.get_int("index"));
      } else if (o->op->kind == ops::OpKind::View) {
        out.view_op = true;
        out.view = strided_view(o);  // eager returns a view here too, with the view's strides
        std::vector<const ir::Node*> chain;
        const ir::Node* base = o;
        for (; base->op->kind == ops::OpKind::View; base = base->inputs[0]) chain.push_back(base);
        // The view's layout where it lies must be eager's (its meta strides): a backward
        // program that reads it as a saved value was compiled for those. Where the base is a
        // value eager makes anew but kiln reads in place (a cat of one tensor, whose input is a
        // slice of a matrix product: Hugging Face's cache update of an empty cache), it is not.
        bool strides_differ = false;
        for (size_t d = 0; d < o->meta.sizes.size() && d < out.view.strides.size(); ++d)
          if (!o->meta.sizes[d].is_const(1) && !(out.view.strides[d] - o->meta.strides[d]).is_const(0)) strides_differ = true;
        if ((p_.buffers[out.view.buffer].kind == BufferKind::Input || strides_differ) && base->op_name() != "placeholder") {
          // A view of a new tensor that reads an input in place (contiguous() of an input,
          // then .mT): eager's result owns its memory, never the caller's input's. The base is
          // made, and the views are taken again on it.
          realize(values_.at(base), BufferKind::Temp, base);
          for (auto it = chain.rbegin(); it != chain.rend(); ++it) lower_view(*it);
          out.view = strided_view(o);
        }
        if (p_.buffers[out.view.buffer].kind == BufferKind::Temp) p_.buffers[out.view.buffer].kind = BufferKind::Output;
      } else {
        if (v.buffer < 0 || p_.buffers[v.buffer].kind == BufferKind::Input) realize(v, BufferKind::Output, o);
        out.view = whole(v.buffer);
        if (p_.buffers[v.buffer].kind == BufferKind::Temp) p_.buffers[v.buffer].kind = BufferKind::Output;
      }
      p_.outputs.push_back(out);
    }
    for (Buffer& b : p_.buffers)
      if (b.kind == BufferKind::Output) b.io_index = 0;
    for (size_t i = 0; i < p_.scalar_symbols.size(); ++i) {
      bool bound = false;
      for (const loop::SymbolBinding& sb : p_.symbols) bound |= sb.symbol == p_.scalar_symbols[i];
      if (!bound) p_.symbols.push_back({p_.scalar_symbols[i], -1, static_cast<int>(i)});
    }
    return true;
  }

 private:
  bool lower_node(const ir::Node* n, std::string& error) {
    const ops::OpDef& op = *n->op;
    if (op.name == "placeholder") {
      Buffer b;
      b.name = "in" + std::to_string(p_.inputs.size());
      b.dtype = n->meta.dtype;
      b.device = n->meta.device;
      b.sizes = n->meta.sizes;
      b.strides = n->meta.strides;
      b.offset = n->meta.offset;
      b.kind = BufferKind::Input;
      b.io_index = static_cast<int>(n->attrs.get_int("index"));
      int id = p_.add_buffer(b);
      for (size_t d = 0; d < b.sizes.size(); ++d) {
        const Expr& e = b.sizes[d];
        if (!e.is_size_symbol()) continue;
        bool bound = false;
        for (const loop::SymbolBinding& sb : p_.symbols) bound |= sb.symbol == e;
        if (!bound) p_.symbols.push_back({e, static_cast<int>(p_.inputs.size()), static_cast<int>(d)});
      }
      p_.inputs.push_back(id);
      values_[n] = buffer_value(id);
      return true;
    }
    if (op.name == "arange") {  // element i: start + i*step, an index expression
      DType t = n->meta.dtype;
      Expr start = n->attrs.get_expr("start");
      const int64_t step = n->attrs.get_int("step", 1);
      loop::ScalarCtx* s = &s_;
      values_[n] = Value{n->meta.sizes, t, [s, start, step, t](const Exprs& idx) {
                           return s->size_value(start + idx[0] * Expr(step), t);
                         }, -1, {"arange"}};
      return true;
    }
    if (op.name == "full") {  // every element the one value
      DType t = n->meta.dtype;
      SRef c = value_attr(*n, t);
      values_[n] = Value{n->meta.sizes, t, [c](const Exprs&) { return c; }, -1, {"full"}};
      return true;
    }
    if (op.name == "size_value") {
      DType t = n->meta.dtype;
      SRef c = s_.size_value(n->attrs.get_expr("expr"), t);
      values_[n] = Value{{}, t, [c](const Exprs&) { return c; }, -1, {}};
      return true;
    }
    if (op.name == "scalar_input") {
      DType t = n->meta.dtype;
      SRef c = s_.arg(static_cast<int>(n->attrs.get_int("index")), t);
      values_[n] = Value{{}, t, [c](const Exprs&) { return c; }, -1, {}};
      return true;
    }
    if (op.name == "scalar") {
      DType t = n->meta.dtype;
      SRef c = value_attr(*n, t);
      values_[n] = Value{{}, t, [c](const Exprs&) { return c; }, -1, {}};
      return true;
    }
    switch (op.kind) {
      case ops::OpKind::Pointwise: return lower_pointwise(n);
      case ops::OpKind::View: return lower_view(n);
      case ops::OpKind::Reduction: return lower_reduction(n);
      case ops::OpKind::Extern: return lower_extern(n);
      case ops::OpKind::Gather: return lower_gather(n);
      default:
        error = "kiln: op " + op.name + " reached lowering undecomposed";
        return false;
    }
  }

  // A `value` attribute as a constant: an int exactly (2**63 - 1 has no double), else a number.
  SRef value_attr(const ir::Node& n, DType t) {
    const ir::AttrValue* v = n.attrs.find("value");
    if (v && std::holds_alternative<int64_t>(*v)) return s_.int_constant(std::get<int64_t>(*v), t);
    return s_.constant(n.attrs.get_float("value"), t);
  }

  Value buffer_value(int id) {
    const Buffer& b = p_.buffers[id];
    Exprs strides = b.strides;
    Expr offset = b.offset;
    DType t = b.dtype;
    loop::ScalarCtx* s = &s_;
    Value v{b.sizes, t, nullptr, id, {}};
    v.read = [s, id, strides, offset, t](const Exprs& idx) {
      Expr e = offset;
      for (size_t i = 0; i < idx.size(); ++i) e = e + idx[i] * strides[i];
      return s->load(id, e, t);
    };
    return v;
  }

  // Index of operand `in` (broadcast to `out_rank` dims) for the output index `idx`.
  static Exprs broadcast_index(const Exprs& in_sizes, const Exprs& out_sizes, const Exprs& idx) {
    size_t off = idx.size() - in_sizes.size();
    Exprs r(in_sizes.size());
    for (size_t k = 0; k < in_sizes.size(); ++k)
      r[k] = (in_sizes[k].is_const(1) && !out_sizes[k + off].is_const(1)) ? Expr(0) : idx[k + off];
    return r;
  }

  // A result of dtype t as a fused kernel holds it: in its computation type, and a 16-bit float
  // (living on in a float register) rounded as a store would round it.
  static SRef in_register(loop::ScalarCtx& s, SRef r, DType t) {
    r = s.cast(r, compute_dtype(t));
    if (t == DType::Float16) r = s.unary(loop::SOp::RoundF16, r);
    if (t == DType::BFloat16) r = s.unary(loop::SOp::RoundBF16, r);
    return r;
  }

  bool lower_pointwise(const ir::Node* n) {
    std::vector<Value> ins;
    std::vector<std::string> fused;
    for (const ir::Node* in : n->inputs) {
      ins.push_back(values_.at(in));
      for (auto& o : ins.back().ops) fused.push_back(o);
    }
    fused.push_back(n->op_name());
    Exprs out_sizes = n->meta.sizes;
    DType t = n->meta.dtype;
    loop::ScalarCtx* s = &s_;
    Value v{out_sizes, t, nullptr, -1, dedupe(fused)};
    // The closure shares its operands' values: copying a Value copies its read function, and a
    // closure holding its operands by value would copy the whole fused tree each time (quadratic
    // in the length of a chain of ops).
    auto operands = std::make_shared<const std::vector<Value>>(std::move(ins));
    v.read = [s, n, operands, out_sizes, t](const Exprs& idx) {
      std::vector<SRef> args;
      for (const Value& in : *operands) args.push_back(in.read(broadcast_index(in.sizes, out_sizes, idx)));
      return in_register(*s, n->op->scalar(*s, args, *n), t);
    };
    values_[n] = v;
    if (must_realize(n, v)) realize(values_[n], BufferKind::Temp, n);
    return true;
  }

  // A gather op reads its inputs at indices of its own (a pooling window): the inputs' values
  // are read, fused, wherever the window lands.
  bool lower_gather(const ir::Node* n) {
    std::vector<ops::GatherInput> ins;
    std::vector<std::string> fused;
    for (const ir::Node* in : n->inputs) {
      const Value& v = values_.at(in);
      ins.push_back({v.sizes, v.read});
      for (auto& o : v.ops) fused.push_back(o);
    }
    fused.push_back(n->op_name());
    DType t = n->meta.dtype;
    loop::ScalarCtx* s = &s_;
    Value v{n->meta.sizes, t, nullptr, -1, dedupe(fused)};
    auto operands = std::make_shared<const std::vector<ops::GatherInput>>(std::move(ins));
    v.read = [s, n, operands, t](const Exprs& idx) {
      return in_register(*s, n->op->gather(*s, idx, *operands, *n), t);
    };
    values_[n] = v;
    if (must_realize(n, v)) realize(values_[n], BufferKind::Temp, n);
    return true;
  }

  bool must_realize(const ir::Node* n, const Value& v) {
    bool is_output = false;
    for (const ir::Node* o : g_.outputs()) is_output |= o == n;
    if (is_output) return true;
    // Computed for its errors alone (an integer division on the CPU): a buffer of its own.
    if (n->users.empty() && n->op->keep_unused && n->op->keep_unused(*n)) return true;
    size_t users = n->users.size();
    for (const ir::Node* u : n->users)
      if (u->op->kind == ops::OpKind::Extern) return true;
    if (users <= 1) return false;
    return s_.count(v.read(probe_index(v.sizes))) > kInlineCostLimit;
  }

  Exprs probe_index(const Exprs& sizes) {
    Exprs idx;
    // Extents let the simplifier undo the div/mod of reshapes over the probe.
    for (size_t i = 0; i < sizes.size(); ++i) {
      idx.push_back(Expr::index_var("probe" + std::to_string(i), sizes[i]));
    }
    return idx;
  }

  bool lower_view(const ir::Node* n) {
    auto in = std::make_shared<const Value>(values_.at(n->inputs[0]));
    Value v{n->meta.sizes, n->meta.dtype, nullptr, -1, in->ops};
    auto view = n->op->view;
    v.read = [in, view, n](const Exprs& idx) { return in->read(view(idx, *n)); };
    values_[n] = v;
    return true;
  }

  Exprs fresh_vars(const std::string& prefix, const Exprs& ranges) {
    Exprs vars;
    for (size_t i = 0; i < ranges.size(); ++i) {
      vars.push_back(Expr::index_var(prefix + std::to_string(i), ranges[i]));
    }
    return vars;
  }

  int new_buffer(const ir::Node* n, BufferKind kind, const Exprs& sizes, DType t) {
    Buffer b;
    b.name = "buf" + std::to_string(p_.buffers.size());
    b.dtype = t;
    b.device = n->meta.device;
    b.sizes = sizes;
    // A node's own value is laid out as its shape rule says where that layout is dense (eager's
    // layout: a pointwise result of transposed inputs is transposed, a torch_call's is torch's);
    // anything else realized is row-major.
    const bool own_layout = sizes == n->meta.sizes && n->meta.strides.size() == sizes.size() &&
                            n->meta.strides == ops::preserved_strides(n->meta);
    b.strides = own_layout ? n->meta.strides : ir::contiguous_strides(sizes);
    b.kind = kind;
    return p_.add_buffer(b);
  }

  // Computes `v` into a new buffer with a kernel of its own: row-major, or in `n`'s own layout
  // where new_buffer keeps it (unless `row_major`).
  void realize(Value& v, BufferKind kind, const ir::Node* n, bool row_major = false) {
    int id = new_buffer(n, kind, v.sizes, v.dtype);
    if (row_major) p_.buffers[id].strides = ir::contiguous_strides(v.sizes);
    p_.buffers[id].keep = n->users.empty() && n->op->keep_unused && n->op->keep_unused(*n);
    Kernel k;
    k.vars = fresh_vars("n" + std::to_string(n->id) + "_", v.sizes);
    k.ranges = v.sizes;
    k.ops = v.ops.empty() ? std::vector<std::string>{"copy"} : v.ops;
    Stage st;
    SRef value = s_.cast(v.read(k.vars), v.dtype);
    st.stores.push_back({id, store_index(id, k.vars), value});
    k.stages.push_back(st);
    add_kernel(std::move(k));
    Value r = buffer_value(id);
    r.ops = {};
    v = r;
  }

  Expr store_index(int buffer, const Exprs& vars) {
    const Buffer& b = p_.buffers[buffer];
    Expr e = b.offset;
    for (size_t i = 0; i < vars.size(); ++i) e = e + vars[i] * b.strides[i];
    return e;
  }

  void add_kernel(Kernel k) {
    p_.kernels.push_back(std::move(k));
    p_.steps.push_back({loop::Step::Kind::Kernel, static_cast<int>(p_.kernels.size() - 1)});
  }

  bool lower_reduction(const ir::Node* n) {
    const ir::Node* x = n->inputs[0];
    Value in = values_.at(x);
    const Exprs& xs = x->meta.sizes;
    std::vector<int64_t> dims = n->attrs.get_ints("dim");
    std::vector<bool> reduced(xs.size(), dims.empty());
    const auto rank = static_cast<int64_t>(xs.size());
    if (rank > 0)  // a 0-d tensor takes dim 0 and -1, and reduces nothing
      for (int64_t d : dims) reduced[(d + rank) % rank] = true;
    bool keepdim = n->attrs.get_bool("keepdim");

    int id = new_buffer(n, BufferKind::Temp, n->meta.sizes, n->meta.dtype);
    Kernel k;
    k.vars = fresh_vars("n" + std::to_string(n->id) + "_", n->meta.sizes);
    k.ranges = n->meta.sizes;
    DType acc_t = compute_dtype(n->meta.dtype);
    Stage r;
    r.kind = Stage::Kind::Reduce;
    // The input index: reduced dims walk the inner loop, kept dims follow the outer space.
    Exprs idx(xs.size());
    // A product of floats shows the order of its factors in its last bits: it follows torch's
    // (see torch_reduce_order).
    std::optional<std::vector<ReduceGroup>> order;
    if (n->op->reduce == ops::ReduceOp::Prod && is_floating(acc_t)) order = torch_reduce_order(x->meta, reduced);
    if (order) {
      for (const ReduceGroup& g : *order) r.ranges.push_back(Expr(g.size));
      r.vars = fresh_vars("n" + std::to_string(n->id) + "_r", r.ranges);
      for (size_t gi = 0; gi < order->size(); ++gi) {
        const ReduceGroup& g = (*order)[gi];
        Expr inner = 1;  // elements per step of dims[j]
        for (size_t j = g.dims.size(); j-- > 0;) {
          const int64_t size = *xs[g.dims[j]].as_const();
          Expr q = inner.is_const(1) ? r.vars[gi] : sym::floordiv(r.vars[gi], inner);
          idx[g.dims[j]] = j == 0 ? q : sym::mod(q, Expr(size));
          inner = inner * Expr(size);
        }
      }
      r.torch_vector_block = order->back().stride == 1;
      for (size_t i = 0; i < xs.size(); ++i)
        if (reduced[i] && xs[i].is_const(1)) idx[i] = 0;
    } else {
      Exprs red_ranges;
      for (size_t i = 0; i < xs.size(); ++i)
        if (reduced[i]) red_ranges.push_back(xs[i]);
      r.ranges = red_ranges;
      r.vars = fresh_vars("n" + std::to_string(n->id) + "_r", red_ranges);
      size_t q = 0;
      for (size_t i = 0; i < xs.size(); ++i)
        if (reduced[i]) idx[i] = r.vars[q++];
    }
    size_t o = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (reduced[i]) {
        if (keepdim) ++o;
      } else {
        idx[i] = k.vars[o++];
      }
    }
    r.reduce = n->op->reduce;
    r.acc_dtype = acc_t;
    r.result_dtype = n->meta.dtype;
    r.acc = next_acc_++;
    r.value = s_.cast(in.read(idx), acc_t);
    Stage st;
    st.stores.push_back({id, store_index(id, k.vars), s_.cast(s_.acc(r.acc, acc_t), n->meta.dtype)});
    k.stages = {r, st};
    k.ops = dedupe(concat(in.ops, {n->op_name()}));
    add_kernel(std::move(k));
    values_[n] = buffer_value(id);
    return true;
  }

  // The value as a strided view of a buffer, if it is one (what extern ops can take).
  std::optional<loop::BufferView> as_view(const Value& v) {
    Exprs vars = probe_index(v.sizes);
    SRef r = v.read(vars);
    const loop::SNode& node = s_[r];
    if (node.op != loop::SOp::Load) return std::nullopt;
    auto aff = sym::affine(node.index, vars);
    if (!aff) return std::nullopt;
    loop::BufferView bv;
    bv.buffer = node.buffer;
    bv.sizes = v.sizes;
    bv.strides = aff->coeffs;
    bv.offset = aff->offset;
    return bv;
  }

  loop::BufferView whole(int buffer) {
    const Buffer& b = p_.buffers[buffer];
    return loop::BufferView{buffer, b.sizes, b.strides, b.offset};
  }

  // A chain of views whose index arithmetic the simplifier cannot fold back into strides
  // (view(-1) of a 4-d tensor reads through nested floordiv/mod): the strides eager gives it,
  // from the shape rules, hold on the base's buffer when that buffer has the base's layout.
  std::optional<loop::BufferView> view_from_meta(const ir::Node* n, const ir::Node* base) {
    for (const ir::Node* v = n; v != base; v = v->inputs[0])
      if (v->op->copies && v->op->copies(*v)) return std::nullopt;
    const Value& bv = values_.at(base);
    if (bv.buffer < 0) return std::nullopt;
    const Buffer& b = p_.buffers[bv.buffer];
    if (b.sizes != base->meta.sizes || b.strides != base->meta.strides || !(b.offset - base->meta.offset).is_const(0))
      return std::nullopt;
    return loop::BufferView{bv.buffer, n->meta.sizes, n->meta.strides, n->meta.offset};
  }

  // The value of `n` as a strided view of a buffer. When it is not one yet, the value under
  // its chain of views is realized (in its own iteration space, so it fuses with its
  // producers) and `n` becomes a view of that buffer, as in eager.
  loop::BufferView strided_view(const ir::Node* n) {
    loop::BufferView v = strided_view_of(n);
    // Strides of size-1 dims index nothing, but torch's overlap checks read them: eager's.
    if (n->meta.strides.size() == v.strides.size())
      for (size_t d = 0; d < v.sizes.size(); ++d)
        if (v.sizes[d].is_const(1)) v.strides[d] = n->meta.strides[d];
    return v;
  }

  loop::BufferView strided_view_of(const ir::Node* n) {
    if (auto v = as_view(values_.at(n))) return *v;
    std::vector<const ir::Node*> chain;
    const ir::Node* base = n;
    while (base->op->kind == ops::OpKind::View) {
      chain.push_back(base);
      base = base->inputs[0];
    }
    Value& bv = values_.at(base);
    if (bv.buffer < 0) realize(bv, BufferKind::Temp, base);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) lower_view(*it);
    if (auto v = as_view(values_.at(n))) return *v;
    if (auto v = view_from_meta(n, base)) return *v;
    Value& v = values_.at(n);
    realize(v, BufferKind::Temp, n);
    return whole(v.buffer);
  }

  // `n`'s value in a row-major buffer of its own, whatever layout its value has (one copy for
  // all the externs that want it: an attention and the gradients that call it again).
  loop::BufferView row_major_copy(const ir::Node* n) {
    if (auto it = row_major_copies_.find(n); it != row_major_copies_.end()) return it->second;
    Value v = values_.at(n);
    realize(v, BufferKind::Temp, n, /*row_major=*/true);
    return row_major_copies_[n] = whole(v.buffer);
  }
  std::map<const ir::Node*, loop::BufferView> row_major_copies_;

  bool lower_extern(const ir::Node* n) {
    loop::Extern e;
    e.op = n->op_name();
    e.aten = n->op->aten;
    e.attrs = n->attrs;
    for (const ir::Node* in : n->inputs) {
      if (!in) {
        e.inputs.push_back(loop::BufferView{});
        continue;
      }
      loop::BufferView view = strided_view(in);
      // An aten_vjp node calls its forward op's kernel (`of`) with the forward's inputs.
      const ops::OpDef* kernel = n->attrs.has("of") ? ops::find_op(n->attrs.get_str("of")) : n->op;
      static const std::vector<size_t> none;
      const auto& unit = kernel ? kernel->unit_stride_inputs : none;
      if (!view.sizes.empty() && !view.sizes.back().is_const(1) && !view.strides.back().is_const(1) &&
          std::find(unit.begin(), unit.end(), e.inputs.size()) != unit.end())
        view = row_major_copy(in);
      e.inputs.push_back(view);
    }
    e.output = new_buffer(n, BufferKind::Temp, n->meta.sizes, n->meta.dtype);
    // The extern makes this tensor itself, with torch's strides (those its meta run gave): a
    // view of an input (movedim, a sliced torch_call) keeps its holes and stays a view.
    if (n->meta.strides.size() == n->meta.sizes.size()) p_.buffers[e.output].strides = n->meta.strides;
    p_.externs.push_back(e);
    p_.steps.push_back({loop::Step::Kind::Extern, static_cast<int>(p_.externs.size() - 1)});
    values_[n] = buffer_value(e.output);
    return true;
  }

  static std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  static std::vector<std::string> dedupe(const std::vector<std::string>& xs) {
    std::vector<std::string> out;
    for (auto& x : xs)
      if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    return out;
  }

  const ir::Graph& g_;
  loop::Program& p_;
  loop::ScalarCtx& s_;
  std::unordered_map<const ir::Node*, Value> values_;
  int next_acc_ = 0;
};

}  // namespace

bool lower_graph(const ir::Graph& g, loop::Program& p, std::string& error) {
  Lowering l(g, p);
  return l.run(error);
}

}  // namespace kiln::lower
