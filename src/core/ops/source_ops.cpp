// Ops with no tensor inputs: graph inputs and Python numbers.
#include "core/ops/registry.h"

namespace kiln::ops {

std::vector<OpDef> source_ops() {
  OpDef ph;
  ph.name = "placeholder";
  ph.schema = Schema::parse("placeholder()");
  ph.kind = OpKind::Source;
  ph.doc = "a graph input";

  OpDef sc;
  sc.name = "scalar";
  sc.schema = Schema::parse("scalar(Scalar value, ScalarType dtype)");
  sc.kind = OpKind::Source;
  sc.doc = "a Python number, promoted by category only";
  sc.infer = [](const std::vector<Node*>&, const Attrs& a, TensorMeta& out, std::string&) {
    out.dtype = *a.get_dtype("dtype");
    out.sizes = {};
    out.strides = {};
    out.wrapped_number = true;
    return true;
  };
  // A Python float read at each call rather than guarded (an optimizer's learning rate that a
  // scheduler changes every step): promoted as a Python number, its value a kernel argument.
  OpDef si;
  si.name = "scalar_input";
  si.schema = Schema::parse("scalar_input(int index, ScalarType dtype)");
  si.kind = OpKind::Source;
  si.doc = "a Python float read at each call (the program's scalar argument `index`)";
  si.infer = sc.infer;
  OpDef sv;
  sv.name = "size_value";
  sv.schema = Schema::parse("size_value(int expr, ScalarType dtype)");
  sv.kind = OpKind::Source;
  sv.doc = "a size as a number (a mean's count), symbolic under dynamic shapes";
  sv.infer = sc.infer;
  // torch.arange(start, end, step) over integers whose end is a size (arange(x.shape[1])): a
  // tensor whose element i is start + i*step, its length symbolic. Capture makes one only for
  // symbolic bounds; constant ones stay torch's factory.
  OpDef ar;
  ar.name = "arange";
  ar.schema = Schema::parse("arange(SymInt start, SymInt end, int step, ScalarType dtype, str device)");
  ar.kind = OpKind::Source;
  ar.doc = "integers start + i*step below end, for a symbolic end (its values are index expressions)";
  ar.infer = [](const std::vector<Node*>&, const Attrs& a, TensorMeta& out, std::string& err) {
    const int64_t step = a.get_int("step", 1);
    if (step <= 0) return err = "kiln: arange with a non-positive step", false;
    Expr len = sym::max(sym::floordiv(a.get_expr("end") - a.get_expr("start") + Expr(step - 1), Expr(step)), Expr(0));
    out.dtype = *a.get_dtype("dtype");
    out.device = Device::parse(a.get_str("device"));
    out.sizes = {len};
    out.strides = {Expr(1)};
    return true;
  };
  // torch.ones / zeros / full (and Tensor.new_*) over sizes at least one of which is symbolic:
  // every element `value`, in a dtype and on a device of its own. Constant sizes stay torch's
  // factory, as a torch_call.
  OpDef fu;
  fu.name = "full";
  fu.schema = Schema::parse("full(SymInt[] size, float value, ScalarType dtype, str device)");
  fu.kind = OpKind::Source;
  fu.doc = "a tensor of one value over symbolic sizes (ones, zeros, full)";
  fu.infer = [](const std::vector<Node*>&, const Attrs& a, TensorMeta& out, std::string& err) {
    out.sizes = a.get_exprs("size");
    for (const Expr& e : out.sizes)
      if (auto c = e.as_const(); c && *c < 0) return err = "RuntimeError: negative dimension " + std::to_string(*c), false;
    out.dtype = *a.get_dtype("dtype");
    out.device = Device::parse(a.get_str("device"));
    out.strides = ir::contiguous_strides(out.sizes);
    return true;
  };
  return {ph, sc, si, sv, ar, fu};
}

}  // namespace kiln::ops
