// Reductions over dims. The shape rule is shared (infer_reduction); entries name the combine.
#include "core/ops/derivatives.h"
#include "core/ops/registry.h"

namespace kiln::ops {
namespace {
OpDef reduction(const std::string& name, ReduceOp r, Promotion p, const std::string& schema, std::vector<std::string> py) {
  OpDef d;
  d.name = name;
  d.schema = Schema::parse(schema);
  d.kind = OpKind::Reduction;
  d.reduce = r;
  d.promotion = p;
  d.python = std::move(py);
  return d;
}
}  // namespace

// A reduction's result (or its gradient) with the reduced dims back as size 1, then expanded
// over the input's sizes: each input element sees its row's value.
static Node* spread_over_input(Graph& g, Node* reduced, const Node& n) {
  const TensorMeta& x = n.inputs[0]->meta;
  std::vector<int64_t> dims = n.attrs.get_ints("dim");
  std::vector<bool> gone(x.sizes.size(), dims.empty());
  // A 0-d input takes dim 0 or -1 (torch wraps dims against a rank of at least 1): none is gone.
  for (int64_t d : dims) {
    const int64_t at = d < 0 ? d + std::max<int64_t>(x.dim(), 1) : d;
    if (at >= 0 && at < x.dim()) gone[static_cast<size_t>(at)] = true;
  }
  std::vector<Expr> kept;
  for (size_t d = 0; d < x.sizes.size(); ++d) kept.push_back(gone[d] ? Expr(int64_t(1)) : x.sizes[d]);
  return grad_ops::expand(g, grad_ops::reshape(g, reduced, kept), x.sizes);
}

std::vector<OpDef> reduction_ops() {
  OpDef sum = reduction("sum", ReduceOp::Sum, Promotion::BoolToLong,
                        "sum(Tensor self, int[]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)",
                        {"torch.sum", "Tensor.sum"});
  sum.derivative = [](Graph& g, Node* n, Node* grad) { return std::vector<Node*>{spread_over_input(g, grad, *n)}; };
  std::vector<OpDef> ops = {
      sum,
      reduction("prod", ReduceOp::Prod, Promotion::BoolToLong,
                "prod(Tensor self, int? dim=None, bool keepdim=False, *, ScalarType? dtype=None)",
                {"torch.prod", "Tensor.prod"}),
      reduction("amax", ReduceOp::Max, Promotion::Default, "amax(Tensor self, int[] dim=[], bool keepdim=False)",
                {"torch.amax", "Tensor.amax"}),
      reduction("amin", ReduceOp::Min, Promotion::Default, "amin(Tensor self, int[] dim=[], bool keepdim=False)",
                {"torch.amin", "Tensor.amin"}),
  };
  // amax/amin: shared equally by the elements equal to the extreme, as torch's backward does.
  // torch's node keeps the result for that (AminBackward0, MaxBackward1 of torch.max(x)): a
  // result changed in place before backward() raises eager's version error.
  for (OpDef& d : ops) {
    if (d.reduce != ReduceOp::Max && d.reduce != ReduceOp::Min) continue;
    d.saves_result = true;
    d.derivative = [](Graph& g, Node* n, Node* grad) {
      using namespace grad_ops;
      Node* hit = g.must_add("eq", {n->inputs[0], spread_over_input(g, n, *n)});
      ir::Attrs as_float;
      as_float.set("dtype", grad->meta.dtype);
      Node* mask = g.must_add("convert", {hit}, as_float);
      // Over the same dims and keepdim as the node: the count has the result's (and grad's) sizes.
      Node* count = g.must_add("sum", {mask}, n->attrs);
      // (grad / count) * mask, as torch's: a NaN extreme matches nothing, so its slice gets
      // grad / 0 * 0, NaN, where a select would give zeros.
      return std::vector<Node*>{mul(g, spread_over_input(g, div(g, grad, count), *n), mask)};
    };
  }
  return ops;
}

}  // namespace kiln::ops
