// Reductions over dims. The shape rule is shared (infer_reduction); entries name the combine.
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

std::vector<OpDef> reduction_ops() {
  return {
      reduction("sum", ReduceOp::Sum, Promotion::BoolToLong,
                "sum(Tensor self, int[]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)",
                {"torch.sum", "Tensor.sum"}),
      reduction("prod", ReduceOp::Prod, Promotion::BoolToLong,
                "prod(Tensor self, int? dim=None, bool keepdim=False, *, ScalarType? dtype=None)",
                {"torch.prod", "Tensor.prod"}),
      reduction("amax", ReduceOp::Max, Promotion::Default, "amax(Tensor self, int[] dim=[], bool keepdim=False)",
                {"torch.amax", "Tensor.amax"}),
      reduction("amin", ReduceOp::Min, Promotion::Default, "amin(Tensor self, int[] dim=[], bool keepdim=False)",
                {"torch.amin", "Tensor.amin"}),
  };
}

}  // namespace kiln::ops
