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
  return {ph, sc};
}

}  // namespace kiln::ops
