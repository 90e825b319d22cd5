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
  OpDef sv;
  sv.name = "size_value";
  sv.schema = Schema::parse("size_value(int expr, ScalarType dtype)");
  sv.kind = OpKind::Source;
  sv.doc = "a size as a number (a mean's count), symbolic under dynamic shapes";
  sv.infer = sc.infer;
  return {ph, sc, sv};
}

}  // namespace kiln::ops
