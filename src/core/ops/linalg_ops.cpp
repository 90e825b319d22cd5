// Matrix products run as extern calls of torch's own kernels (BLAS/cuBLAS); kiln fuses around them.
#include "core/sym/shape_env.h"
#include "core/ops/derivatives.h"
#include "core/ops/registry.h"

namespace kiln::ops {
namespace {

// A matrix laid out column-major: a transposed view of a row-major one (linear's weight, as
// mm sees it).
bool column_major(const Node* x) {
  const TensorMeta& m = x->meta;
  return m.dim() == 2 && m.strides.size() == 2 && m.strides[0].is_const(1) && !m.strides[1].is_const(1) &&
         !m.sizes[0].is_const(1);
}

// The gradient of operand `which` of a @ b: grad @ b^T for a, a^T @ grad for b, computed in the
// operand's layout. For a column-major operand that is (b grad^T)^T or (grad^T a)^T: the same
// values, with a GEMM that writes them transposed, so that the weight of a linear layer gets its
// gradient row-major, as eager's autograd gives it (a transposed gradient is copied by
// AccumulateGrad to the parameter's layout, a copy per weight per step).
Node* mm_operand_gradient(Graph& g, Node* a, Node* b, Node* grad, int which) {
  using grad_ops::transpose;
  if (which == 0)
    return column_major(a) ? transpose(g, g.must_add("mm", {b, transpose(g, grad, 0, 1)}), 0, 1)
                           : g.must_add("mm", {grad, transpose(g, b, 0, 1)});
  return column_major(b) ? transpose(g, g.must_add("mm", {transpose(g, grad, 0, 1), a}), 0, 1)
                         : g.must_add("mm", {transpose(g, a, 0, 1), grad});
}

}  // namespace

// torch's matrix products take no bool, and on CUDA floating point only.
bool has_matmul_kernel(const TensorMeta& a, const std::string& op, std::string& err) {
  bool cuda = a.device.type == DeviceType::CUDA;
  if (a.dtype != DType::Bool && (!cuda || is_floating(a.dtype))) return true;
  err = "NotImplementedError: \"" + op + (cuda ? "_cuda" : "_impl_cpu_") + "\" not implemented for '" +
        torch_dtype_name(a.dtype) + "'";
  return false;
}

namespace {

std::string dims_str(const TensorMeta& m) {
  std::string s;
  for (size_t i = 0; i < m.sizes.size(); ++i) s += (i ? "x" : "") + m.sizes[i].str();
  return s;
}

bool same_dtype(const TensorMeta& a, const TensorMeta& b, std::string& err) {
  if (a.dtype != b.dtype) {
    err = std::string("RuntimeError: expected m1 and m2 to have the same dtype, but got: ") + dtype_name(a.dtype) +
          " != " + dtype_name(b.dtype);
    return false;
  }
  return has_matmul_kernel(a, "addmm", err);
}

bool same_device(const TensorMeta& a, const TensorMeta& b, std::string& err) {
  if (a.device == b.device) return true;
  err = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, " + a.device.str() +
        " and " + b.device.str() + "!";
  return false;
}


}  // namespace

std::vector<OpDef> linalg_ops() {
  std::vector<OpDef> ops;
  ops.push_back(extern_op(
      "mm", "mm(Tensor self, Tensor mat2)", "aten::mm",
      [](const std::vector<Node*>& in, const Attrs&, TensorMeta& out, std::string& err) {
        const TensorMeta &a = in[0]->meta, &b = in[1]->meta;
        if (a.dim() != 2) return err = "RuntimeError: self must be a matrix", false;
        if (b.dim() != 2) return err = "RuntimeError: mat2 must be a matrix", false;
        if (!same_device(a, b, err)) return false;
        if (!sym::same_size(a.sizes[1], b.sizes[0])) {
          err = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (" + dims_str(a) + " and " + dims_str(b) + ")";
          return false;
        }
        if (!same_dtype(a, b, err)) return false;
        out = TensorMeta{a.dtype, a.device, {a.sizes[0], b.sizes[1]}, {}, 0, false};
        out.strides = ir::contiguous_strides(out.sizes);
        return true;
      },
      {"torch.mm", "Tensor.mm"}));
  // d(a @ b): grad @ b^T and a^T @ grad (bmm: the same per batch).
  ops.back().keeps_inputs = {{1}, {0}};
  ops.back().derivative = [](Graph& g, Node* n, Node* grad) {
    return std::vector<Node*>{mm_operand_gradient(g, n->inputs[0], n->inputs[1], grad, 0),
                              mm_operand_gradient(g, n->inputs[0], n->inputs[1], grad, 1)};
  };
  ops.push_back(extern_op(
      "bmm", "bmm(Tensor self, Tensor mat2)", "aten::bmm",
      [](const std::vector<Node*>& in, const Attrs&, TensorMeta& out, std::string& err) {
        const TensorMeta &a = in[0]->meta, &b = in[1]->meta;
        if (a.dim() != 3) return err = "RuntimeError: batch1 must be a 3D tensor", false;
        if (b.dim() != 3) return err = "RuntimeError: batch2 must be a 3D tensor", false;
        if (!same_device(a, b, err)) return false;
        if (!sym::same_size(a.sizes[0], b.sizes[0]) || !sym::same_size(a.sizes[2], b.sizes[1])) {
          err = "RuntimeError: Expected size for first two dimensions of batch2 tensor to be: [" + a.sizes[0].str() + ", " +
                a.sizes[2].str() + "] but got: [" + b.sizes[0].str() + ", " + b.sizes[1].str() + "].";
          return false;
        }
        if (!same_dtype(a, b, err)) return false;
        out = TensorMeta{a.dtype, a.device, {a.sizes[0], a.sizes[1], b.sizes[2]}, {}, 0, false};
        out.strides = ir::contiguous_strides(out.sizes);
        return true;
      },
      {"torch.bmm", "Tensor.bmm"}));
  ops.back().keeps_inputs = {{1}, {0}};
  ops.back().derivative = [](Graph& g, Node* n, Node* grad) {
    using grad_ops::transpose;
    Node *a = n->inputs[0], *b = n->inputs[1];
    return std::vector<Node*>{g.must_add("bmm", {grad, transpose(g, b, 1, 2)}), g.must_add("bmm", {transpose(g, a, 1, 2), grad})};
  };
  auto infer_addmm = [](const std::vector<Node*>& in, const Attrs&, TensorMeta& out, std::string& err) {
    const TensorMeta &c = in[0]->meta, &a = in[1]->meta, &b = in[2]->meta;
    if (a.dim() != 2 || b.dim() != 2) return err = "RuntimeError: mat1 and mat2 must be matrices", false;
    if (!same_device(a, b, err) || !same_device(a, c, err)) return false;
    if (!sym::same_size(a.sizes[1], b.sizes[0])) {
      err = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (" + dims_str(a) + " and " + dims_str(b) + ")";
      return false;
    }
    if (!same_dtype(a, b, err) || !same_dtype(a, c, err)) return false;
    std::vector<Expr> bs;
    if (!broadcast_shapes({c.sizes, {a.sizes[0], b.sizes[1]}}, bs, err) || bs.size() != 2) return false;
    out = TensorMeta{a.dtype, a.device, {a.sizes[0], b.sizes[1]}, {}, 0, false};
    out.strides = ir::contiguous_strides(out.sizes);
    return true;
  };
  ops.push_back(extern_op("addmm", "addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1)",
                          "aten::addmm", infer_addmm, {"torch.addmm", "Tensor.addmm"}));
  // d(beta * c + alpha * a @ b): beta * grad (summed to c's shape), alpha * grad @ b^T, alpha * a^T @ grad.
  ops.back().keeps_inputs = {{}, {2}, {1}};
  ops.back().derivative = [](Graph& g, Node* n, Node* grad) {
    using grad_ops::transpose;
    Node *a = n->inputs[1], *b = n->inputs[2];
    const double beta = n->attrs.get_float("beta", 1), alpha = n->attrs.get_float("alpha", 1);
    auto times = [&](Node* x, double f) { return f == 1 ? x : grad_ops::scaled(g, x, f); };
    return std::vector<Node*>{times(grad, beta), times(mm_operand_gradient(g, a, b, grad, 0), alpha),
                              times(mm_operand_gradient(g, a, b, grad, 1), alpha)};
  };
  // addmm followed by relu, or by gelu(approximate="tanh") when use_gelu: on CUDA, cuBLASLt
  // applies the bias and the activation in the GEMM's epilogue (passes::gemm_epilogues makes
  // it); elsewhere torch runs addmm, then the activation.
  ops.push_back(extern_op(
      "addmm_activation",
      "_addmm_activation(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1, bool use_gelu=False)",
      "aten::_addmm_activation", infer_addmm, {"torch._addmm_activation"}));
  return ops;
}

}  // namespace kiln::ops
