// Views: no data moves. Each entry has a shape/stride rule and an index remapping that the
// lowering composes into the reads of its consumers, so a transpose or broadcast costs nothing.
#include <algorithm>
#include <numeric>

#include "core/sym/shape_env.h"
#include "core/ops/derivatives.h"
#include "core/ops/registry.h"

namespace kiln::ops {
namespace {

using Exprs = std::vector<Expr>;

// x[start:end:step] over a dim of `size`, Python's clamping: (start, length). Exact for a
// symbolic size too (min/max expressions the simplifier folds where the size's bounds decide).
std::pair<Expr, Expr> slice_window(const Expr& size, const Attrs& a) {
  const int64_t step = std::max<int64_t>(a.get_int("step", 1), 1);
  auto clamp = [&](const Expr& bound) -> Expr {
    if (auto v = bound.as_const()) {
      if (auto c = size.as_const()) return Expr(std::clamp<int64_t>(*v < 0 ? *v + *c : *v, 0, *c));
      return *v < 0 ? sym::max(size + bound, Expr(0)) : sym::min(bound, size);
    }
    // A symbolic bound (x[:, :T]): its sign for the sizes at hand is a fact of the entry.
    if (sym::known_less(Expr(-1), bound)) return sym::min(bound, size);
    if (sym::known_less(bound, Expr(0))) return sym::max(size + bound, Expr(0));
    throw std::runtime_error("kiln: a slice bound of unknown sign");
  };
  Expr start = a.has("start") ? clamp(a.get_expr("start")) : Expr(0);
  Expr end = a.has("end") ? clamp(a.get_expr("end")) : size;
  if (auto c = (end - start).as_const()) {
    int64_t n = *c > 0 ? (*c + step - 1) / step : 0;
    return {start, Expr(n)};
  }
  return {start, sym::max(sym::floordiv(end - start + Expr(step - 1), Expr(step)), Expr(0))};
}

// Strides that let `new_sizes` view memory laid out by (sizes, strides), or nullopt when the
// reshape needs a copy. Walks dims from the innermost, matching chunks of contiguous memory.
// Symbolic sizes: which view dims a chunk takes is decided at the sizes at hand
// (sym::size_hint), and each chunk's element count equal to its view dims' is a fact the entry
// relies on (sym::same_size), so the strides hold for every size its guards admit.
std::optional<Exprs> view_strides(const Exprs& sizes, const Exprs& strides, const Exprs& new_sizes) {
  if (strides == ir::contiguous_strides(sizes)) return ir::contiguous_strides(new_sizes);
  auto h = [](const Expr& e) { return sym::size_hint(e); };
  for (const Expr& e : sizes)
    if (!h(e)) return std::nullopt;
  for (const Expr& e : strides)
    if (!h(e)) return std::nullopt;
  for (const Expr& e : new_sizes)
    if (!h(e)) return std::nullopt;
  if (*h(sym::product(sizes)) == 0) return ir::contiguous_strides(new_sizes);
  Exprs out(new_sizes.size());
  if (sizes.empty()) {
    for (auto& o : out) o = 1;
    return out;
  }
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  Expr chunk_base = strides.back();
  Expr tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel = tensor_numel * sizes[d];
    if (d == 0 || (*h(sizes[d - 1]) != 1 && !sym::same_size(strides[d - 1], tensor_numel * chunk_base))) {
      while (view_d >= 0 && (*h(view_numel) < *h(tensor_numel) || *h(new_sizes[view_d]) == 1)) {
        out[view_d] = view_numel * chunk_base;
        view_numel = view_numel * new_sizes[view_d];
        --view_d;
      }
      if (!sym::same_size(view_numel, tensor_numel)) return std::nullopt;
      if (d > 0) {
        chunk_base = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

bool infer_shape_arg(const TensorMeta& x, const Exprs& shape, Exprs& out, std::string& err) {
  int64_t infer_at = -1;
  Expr known = 1;
  out.clear();
  for (size_t i = 0; i < shape.size(); ++i) {
    auto c = shape[i].as_const();
    if (c && *c == -1) {
      if (infer_at >= 0) {
        err = "RuntimeError: only one dimension can be inferred";
        return false;
      }
      infer_at = static_cast<int64_t>(i);
      out.push_back(Expr(1));
    } else if (c && *c < 0) {
      err = "RuntimeError: invalid shape dimension " + std::to_string(*c);
      return false;
    } else {
      out.push_back(shape[i]);
      known = known * shape[i];
    }
  }
  Expr numel = x.numel();
  if (infer_at >= 0) {
    // The other dims' product must be positive, for every size the entry takes (a fact capture
    // records where it is symbolic): with 0 elements there, -1 could be anything, and eager raises.
    const auto kc = known.as_const();
    if (kc ? *kc <= 0 : sym::current_shape_env() && !sym::known_less(Expr(0), known)) {
      const auto n = sym::size_hint(numel);
      err = n && *n == 0 ? "RuntimeError: cannot reshape tensor of 0 elements into shape " + sym::str(shape) +
                               " because the unspecified dimension size -1 can be any value and is ambiguous"
                         : "RuntimeError: shape '" + sym::str(shape) + "' is invalid for input of size " + numel.str();
      return false;
    }
    auto k = known.as_const(), n = numel.as_const();
    if (k && n && (*k == 0 || *n % *k != 0)) {
      err = "RuntimeError: shape '" + sym::str(shape) + "' is invalid for input of size " + std::to_string(*n);
      return false;
    }
    if (!k || !n) {
      // A symbolic count: the inferred dim is numel / known, which must divide evenly.
      Expr q = sym::floordiv(numel, known);
      if (!sym::same_size(q * known, numel)) {
        err = "RuntimeError: shape '" + sym::str(shape) + "' is invalid for input of size " + numel.str();
        return false;
      }
      out[infer_at] = q;
      return true;
    }
    out[infer_at] = sym::floordiv(numel, known);
    return true;
  }
  if (!sym::same_size(numel, known)) {
    err = "RuntimeError: shape '" + sym::str(shape) + "' is invalid for input of size " + numel.str();
    return false;
  }
  return true;
}

OpDef reshape_like(const std::string& name, bool must_view, std::vector<std::string> py) {
  OpDef d;
  d.name = name;
  d.schema = Schema::parse(name + "(Tensor self, SymInt[] shape)");
  d.kind = OpKind::View;
  d.infer = [must_view, name](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    const TensorMeta& x = in[0]->meta;
    out = x;
    if (!infer_shape_arg(x, a.get_exprs("shape"), out.sizes, err)) return false;
    auto st = view_strides(x.sizes, x.strides, out.sizes);
    if (!st) {
      if (must_view) {
        err = "RuntimeError: view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces). Use .reshape(...) instead.";
        return false;
      }
      out.strides = ir::contiguous_strides(out.sizes);
      out.offset = 0;
    } else {
      out.strides = *st;
    }
    return true;
  };
  d.view = [](const Exprs& idx, const Node& n) {
    const Exprs& in_sizes = n.inputs[0]->meta.sizes;
    Exprs out_cs = ir::contiguous_strides(n.meta.sizes), in_cs = ir::contiguous_strides(in_sizes);
    Expr lin = 0;
    for (size_t i = 0; i < idx.size(); ++i) lin = lin + idx[i] * out_cs[i];
    Exprs r(in_sizes.size());
    for (size_t j = 0; j < in_sizes.size(); ++j)
      r[j] = j == 0 ? sym::floordiv(lin, in_cs[j]) : sym::mod(sym::floordiv(lin, in_cs[j]), in_sizes[j]);
    return r;
  };
  if (!must_view) d.copies = reshape_copies;
  d.python = std::move(py);
  return d;
}

// Whether a size is 1. A symbolic one is decided by the inputs at hand, and the decision is a
// fact of the entry (== 1; else >= 2, or == 0), as torch.compile guards squeeze's sizes: an
// entry captured where a slice's length was 3 must not squeeze it on a call where it is 1.
bool size_is_one(const Expr& e) {
  if (auto c = e.as_const()) return *c == 1;
  sym::ShapeEnv* env = sym::current_shape_env();
  std::optional<int64_t> h = env ? env->hint(e) : std::nullopt;
  if (!h) return false;
  if (*h == 1) return env->assume_equal(e, Expr(1));
  if (*h == 0) env->assume_equal(e, Expr(0));
  else env->assume_nonnegative(e - Expr(2));
  return false;
}

// Which dims squeeze drops: the size-1 dims among those named (all dims when none are).
std::vector<bool> squeeze_mask(const TensorMeta& x, const Attrs& a) {
  std::vector<bool> drop(x.dim(), false);
  if (!a.has("dim")) {
    for (int64_t i = 0; i < x.dim(); ++i) drop[i] = size_is_one(x.sizes[i]);
    return drop;
  }
  for (int64_t d : a.get_ints("dim")) {
    if (d < 0) d += x.dim();
    if (d >= 0 && d < x.dim()) drop[d] = size_is_one(x.sizes[d]);
  }
  return drop;
}

}  // namespace

bool reshape_copies(const Node& n) {
  // a copy where its shape rule found no view strides (its strides are then row-major from
  // offset 0), whatever the sizes at hand would allow now
  const TensorMeta& x = n.inputs[0]->meta;
  const auto st = view_strides(x.sizes, x.strides, n.meta.sizes);
  return !st || !(*st == n.meta.strides) || n.meta.offset != x.offset;
}

std::vector<OpDef> view_ops() {
  std::vector<OpDef> ops;
  // Views that only regroup dims: the gradient takes the input's sizes back.
  const DerivativeFn regroup = [](Graph& g, Node* n, Node* grad) {
    return std::vector<Node*>{grad_ops::reshape(g, grad, n->inputs[0]->meta.sizes)};
  };
  ops.push_back(reshape_like("reshape", false, {"torch.reshape", "Tensor.reshape"}));
  ops.back().derivative = regroup;
  ops.push_back(reshape_like("view", true, {"Tensor.view"}));
  ops.back().derivative = regroup;

  OpDef permute;
  permute.name = "permute";
  permute.schema = Schema::parse("permute(Tensor self, int[] dims)");
  permute.kind = OpKind::View;
  permute.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    const TensorMeta& x = in[0]->meta;
    std::vector<int64_t> dims = a.get_ints("dims");
    if (static_cast<int64_t>(dims.size()) != x.dim()) {
      err = "RuntimeError: permute: number of dims don't match";
      return false;
    }
    std::vector<bool> seen(x.dim());
    out = x;
    for (size_t i = 0; i < dims.size(); ++i) {
      int64_t d = dims[i];
      if (!wrap_dim(d, x.dim(), err)) return false;
      if (seen[d]) {
        err = "RuntimeError: permute(): duplicate dims are not allowed.";
        return false;
      }
      seen[d] = true;
      out.sizes[i] = x.sizes[d];
      out.strides[i] = x.strides[d];
    }
    return true;
  };
  permute.view = [](const Exprs& idx, const Node& n) {
    std::vector<int64_t> dims = n.attrs.get_ints("dims");
    Exprs r(idx.size());
    int64_t rank = static_cast<int64_t>(idx.size());
    for (size_t i = 0; i < dims.size(); ++i) r[(dims[i] + rank) % rank] = idx[i];
    return r;
  };
  permute.python = {"torch.permute", "Tensor.permute"};
  permute.derivative = [](Graph& g, Node* n, Node* grad) {
    std::vector<int64_t> dims = n->attrs.get_ints("dims"), back(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) back[static_cast<size_t>(dims[i] < 0 ? dims[i] + int64_t(dims.size()) : dims[i])] = int64_t(i);
    ir::Attrs a;
    a.set("dims", back);
    return std::vector<Node*>{g.must_add("permute", {grad}, a)};
  };
  ops.push_back(permute);

  OpDef transpose;
  transpose.name = "transpose";
  transpose.schema = Schema::parse("transpose(Tensor self, int dim0, int dim1)");
  transpose.kind = OpKind::View;
  transpose.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    const TensorMeta& x = in[0]->meta;
    int64_t d0 = a.get_int("dim0"), d1 = a.get_int("dim1");
    if (!wrap_dim(d0, x.dim(), err) || !wrap_dim(d1, x.dim(), err)) return false;
    out = x;
    if (x.dim() == 0) return true;
    std::swap(out.sizes[d0], out.sizes[d1]);
    std::swap(out.strides[d0], out.strides[d1]);
    return true;
  };
  transpose.view = [](const Exprs& idx, const Node& n) {
    Exprs r = idx;
    if (r.empty()) return r;
    int64_t rank = static_cast<int64_t>(idx.size());
    std::swap(r[(n.attrs.get_int("dim0") + rank) % rank], r[(n.attrs.get_int("dim1") + rank) % rank]);
    return r;
  };
  transpose.python = {"torch.transpose", "Tensor.transpose", "torch.swapaxes", "Tensor.swapaxes"};
  transpose.derivative = [](Graph& g, Node* n, Node* grad) {
    return std::vector<Node*>{grad_ops::transpose(g, grad, n->attrs.get_int("dim0"), n->attrs.get_int("dim1"))};
  };
  ops.push_back(transpose);

  OpDef expand;
  expand.name = "expand";
  expand.schema = Schema::parse("expand(Tensor self, SymInt[] size)");
  expand.kind = OpKind::View;
  expand.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    const TensorMeta& x = in[0]->meta;
    const Exprs size = a.get_exprs("size");
    auto is = [](const Expr& e, int64_t v) { return e.is_const(v); };
    if (static_cast<int64_t>(size.size()) < x.dim()) {
      err = "RuntimeError: expand(torch.FloatTensor{" + sym::str(x.sizes) + "}, size=" + sym::str(size) +
            "): the number of sizes provided (" + std::to_string(size.size()) +
            ") must be greater or equal to the number of dimensions in the tensor (" + std::to_string(x.dim()) + ")";
      return false;
    }
    size_t off = size.size() - x.dim();
    out = x;
    out.sizes.assign(size.size(), Expr(1));
    out.strides.assign(size.size(), Expr(0));
    for (size_t i = 0; i < size.size(); ++i) {
      auto c = size[i].as_const();
      if (i < off) {
        if (c && *c < 0) {
          err = "RuntimeError: The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension " + std::to_string(i);
          return false;
        }
        out.sizes[i] = size[i];
        continue;
      }
      const Expr& have = x.sizes[i - off];
      if (is(size[i], -1) || have == size[i] || (!is(size[i], 1) && !is(have, 1) && sym::same_size(have, size[i]))) {
        out.sizes[i] = have;
        out.strides[i] = x.strides[i - off];
      } else if (have.is_const(1)) {
        out.sizes[i] = size[i];
      } else {
        err = "RuntimeError: The expanded size of the tensor (" + size[i].str() +
              ") must match the existing size (" + have.str() + ") at non-singleton dimension " + std::to_string(i) +
              ".  Target sizes: " + sym::str(size) + ".  Tensor sizes: " + sym::str(x.sizes);
        return false;
      }
    }
    return true;
  };
  expand.view = [](const Exprs& idx, const Node& n) {
    const Exprs& in_sizes = n.inputs[0]->meta.sizes;
    size_t off = idx.size() - in_sizes.size();
    Exprs r(in_sizes.size());
    for (size_t k = 0; k < in_sizes.size(); ++k)
      r[k] = (in_sizes[k].is_const(1) && !n.meta.sizes[k + off].is_const(1)) ? Expr(0) : idx[k + off];
    return r;
  };
  expand.python = {"Tensor.expand"};
  // Summed over what the expand repeated (build_joint's reduce_to does it).
  expand.derivative = [](Graph&, Node*, Node* grad) { return std::vector<Node*>{grad}; };
  ops.push_back(expand);

  // x[:], x[...], x[()]: a new tensor over the same memory (aten::alias). Capture makes one so
  // that an in-place update through either name is seen as an update of memory with views.
  OpDef alias;
  alias.name = "alias";
  alias.schema = Schema::parse("alias(Tensor self)");
  alias.kind = OpKind::View;
  alias.infer = [](const std::vector<Node*>& in, const Attrs&, TensorMeta& out, std::string&) {
    out = in[0]->meta;
    out.wrapped_number = false;
    return true;
  };
  alias.view = [](const Exprs& idx, const Node&) { return idx; };
  alias.python = {"torch.ops.aten.alias.default"};
  alias.derivative = [](Graph&, Node*, Node* grad) { return std::vector<Node*>{grad}; };
  ops.push_back(alias);

  OpDef unsq;
  unsq.name = "unsqueeze";
  unsq.schema = Schema::parse("unsqueeze(Tensor self, int dim)");
  unsq.kind = OpKind::View;
  unsq.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    const TensorMeta& x = in[0]->meta;
    int64_t d = a.get_int("dim");
    if (!wrap_dim(d, x.dim() + 1, err)) return false;
    out = x;
    Expr st = d < x.dim() ? x.strides[d] * x.sizes[d] : Expr(1);
    out.sizes.insert(out.sizes.begin() + d, Expr(1));
    out.strides.insert(out.strides.begin() + d, st);
    return true;
  };
  unsq.view = [](const Exprs& idx, const Node& n) {
    int64_t d = n.attrs.get_int("dim");
    if (d < 0) d += static_cast<int64_t>(idx.size());
    Exprs r = idx;
    r.erase(r.begin() + d);
    return r;
  };
  unsq.python = {"torch.unsqueeze", "Tensor.unsqueeze"};
  unsq.derivative = regroup;
  ops.push_back(unsq);

  OpDef sq;
  sq.name = "squeeze";
  sq.schema = Schema::parse("squeeze(Tensor self, int[]? dim=None)");
  sq.kind = OpKind::View;
  sq.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    const TensorMeta& x = in[0]->meta;
    for (int64_t d : a.get_ints("dim"))
      if (!wrap_dim(d, x.dim(), err)) return false;
    std::vector<bool> drop = squeeze_mask(x, a);
    out = x;
    out.sizes.clear();
    out.strides.clear();
    for (int64_t i = 0; i < x.dim(); ++i)
      if (!drop[i]) out.sizes.push_back(x.sizes[i]), out.strides.push_back(x.strides[i]);
    return true;
  };
  sq.view = [](const Exprs& idx, const Node& n) {
    const TensorMeta& x = n.inputs[0]->meta;
    std::vector<bool> drop = squeeze_mask(x, n.attrs);
    Exprs r;
    size_t j = 0;
    for (int64_t i = 0; i < x.dim(); ++i) r.push_back(drop[i] ? Expr(0) : idx[j++]);
    return r;
  };
  sq.python = {"torch.squeeze", "Tensor.squeeze"};
  sq.derivative = regroup;
  ops.push_back(sq);

  // x[a:b:c] along one dim (and torch.narrow): a strided window, start folded into the offset.
  OpDef slice;
  slice.name = "slice";
  slice.schema = Schema::parse("slice(Tensor self, int dim=0, SymInt? start=None, SymInt? end=None, int step=1)");
  slice.kind = OpKind::View;
  slice.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    const TensorMeta& x = in[0]->meta;
    int64_t d = a.get_int("dim");
    if (x.dim() == 0) {
      err = "IndexError: slice() cannot be applied to a 0-dim tensor.";
      return false;
    }
    if (!wrap_dim(d, x.dim(), err)) return false;
    int64_t step = a.get_int("step", 1);
    if (step <= 0) {
      err = "ValueError: step must be greater than zero";
      return false;
    }
    auto [start, len] = slice_window(x.sizes[d], a);
    out = x;
    out.offset = x.offset + x.strides[d] * start;
    out.sizes[d] = len;
    out.strides[d] = x.strides[d] * Expr(step);
    return true;
  };
  slice.view = [](const Exprs& idx, const Node& n) {
    const TensorMeta& x = n.inputs[0]->meta;
    int64_t d = n.attrs.get_int("dim");
    if (d < 0) d += x.dim();
    // start as the shape rule normalized it
    Expr start = slice_window(x.sizes[d], n.attrs).first;
    Exprs r = idx;
    r[d] = start + idx[d] * Expr(n.attrs.get_int("step", 1));
    return r;
  };
  slice.python = {"torch.ops.aten.slice.Tensor"};
  // The gradient between zeros, at the slice's window. A step s > 1 first interleaves s - 1
  // zeros after each element (each gradient with its zeros along a new dim, then the two dims
  // merged) and cuts what runs past the input's end.
  slice.derivative = [](Graph& g, Node* n, Node* grad) {
    const TensorMeta& x = n->inputs[0]->meta;
    int64_t d = n->attrs.get_int("dim");
    std::string err;
    if (!wrap_dim(d, x.dim(), err)) throw std::runtime_error(err);
    const size_t dd = static_cast<size_t>(d);
    auto [start, len] = slice_window(x.sizes[dd], n->attrs);
    const int64_t step = n->attrs.get_int("step", 1);
    if (step != 1) {
      auto have = len.as_const(), room = (x.sizes[dd] - start).as_const();
      if (!have || !room) throw std::runtime_error("no derivative for a strided slice of a symbolic size");
      Attrs at;
      at.set("dim", d + 1);
      Node* column = g.must_add("unsqueeze", {grad}, at);
      Node* spread = g.must_add("cat", {column, grad_ops::zeros_along(g, column->meta, d + 1, Expr(step - 1))}, at);
      std::vector<Expr> sizes = grad->meta.sizes;
      sizes[dd] = Expr(*have * step);
      grad = grad_ops::reshape(g, spread, sizes);
      if (*have * step > *room) {
        Attrs cut;
        cut.set("dim", d);
        cut.set("start", Expr(0));
        cut.set("end", Expr(*room));
        grad = g.must_add("slice", {grad}, cut);
      }
    }
    return std::vector<Node*>{grad_ops::pad_along(g, grad, x, d, start)};
  };
  ops.push_back(slice);

  // x[i] along one dim: that dim goes, i folded into the offset.
  OpDef select;
  select.name = "select";
  select.schema = Schema::parse("select(Tensor self, int dim, int index)");
  select.kind = OpKind::View;
  select.infer = [](const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& err) {
    const TensorMeta& x = in[0]->meta;
    int64_t d = a.get_int("dim"), i = a.get_int("index");
    if (x.dim() == 0) {
      err = "IndexError: select() cannot be applied to a 0-dim tensor.";
      return false;
    }
    if (!wrap_dim(d, x.dim(), err)) return false;
    auto size = x.sizes[d].as_const();
    if (!size) {
      // A symbolic dim: the index must lie inside it (a fact of the entry).
      if (!(i >= 0 ? sym::known_less(Expr(i), x.sizes[d]) : sym::known_less(Expr(-i - 1), x.sizes[d]))) {
        err = "IndexError: index " + std::to_string(i) + " is out of bounds for dimension " + std::to_string(d) +
              " with size " + x.sizes[d].str();
        return false;
      }
      out = x;
      out.offset = x.offset + x.strides[d] * (i < 0 ? x.sizes[d] + Expr(i) : Expr(i));
      out.sizes.erase(out.sizes.begin() + d);
      out.strides.erase(out.strides.begin() + d);
      return true;
    }
    if (i < -*size || i >= *size) {
      err = "IndexError: index " + std::to_string(i) + " is out of bounds for dimension " + std::to_string(d) +
            " with size " + std::to_string(*size);
      return false;
    }
    if (i < 0) i += *size;
    out = x;
    out.offset = x.offset + x.strides[d] * Expr(i);
    out.sizes.erase(out.sizes.begin() + d);
    out.strides.erase(out.strides.begin() + d);
    return true;
  };
  select.view = [](const Exprs& idx, const Node& n) {
    const TensorMeta& x = n.inputs[0]->meta;
    int64_t d = n.attrs.get_int("dim"), i = n.attrs.get_int("index");
    if (d < 0) d += x.dim();
    Exprs r = idx;
    r.insert(r.begin() + d, i < 0 ? x.sizes[d] + Expr(i) : Expr(i));
    return r;
  };
  select.python = {"torch.select", "Tensor.select"};
  select.derivative = [](Graph& g, Node* n, Node* grad) {
    const TensorMeta& x = n->inputs[0]->meta;
    int64_t d = n->attrs.get_int("dim"), i = n->attrs.get_int("index");
    std::string err;
    if (!wrap_dim(d, x.dim(), err)) throw std::runtime_error(err);
    ir::Attrs at;
    at.set("dim", d);
    auto size = x.sizes[static_cast<size_t>(d)].as_const();
    if (i < 0 && !size) throw std::runtime_error("no derivative for select at a negative index of a symbolic dim");
    if (i < 0) i += *size;
    return std::vector<Node*>{grad_ops::pad_along(g, g.must_add("unsqueeze", {grad}, at), x, d, Expr(i))};
  };
  ops.push_back(select);
  return ops;
}

}  // namespace kiln::ops
