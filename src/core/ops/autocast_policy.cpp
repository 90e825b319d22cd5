// torch.autocast's cast policy for kiln's ops, per device type, as torch's autocast kernels
// (aten/src/ATen/autocast_mode.cpp) define it. Under autocast, capture inserts the casts the
// policy makes before the op (bind/capture: Interpreter::autocast_inputs); ops not listed run in
// their inputs' dtypes, as they do under torch's autocast.
#include "core/ops/registry.h"

namespace kiln::ops {

void set_autocast_policies(std::map<std::string, OpDef>& ops) {
  using P = AutocastPolicy;
  struct Row {
    const char* op;
    P cuda, cpu;
  };
  static const Row table[] = {
      // matrix products and convolutions: in the lower precision type on both
      {"mm", P::LowerPrecision, P::LowerPrecision},
      {"bmm", P::LowerPrecision, P::LowerPrecision},
      {"addmm", P::LowerPrecision, P::LowerPrecision},
      {"baddbmm", P::LowerPrecision, P::LowerPrecision},
      {"matmul", P::LowerPrecision, P::LowerPrecision},
      {"linear", P::LowerPrecision, P::LowerPrecision},
      {"conv2d", P::LowerPrecision, P::LowerPrecision},
      {"scaled_dot_product_attention", P::LowerPrecision, P::LowerPrecision},  // on CPU since torch 2.3 (kiln takes 2.11+)
      // CUDA's float32 list: ops whose range or accuracy needs float32
      {"exp", P::Float32, P::None},
      {"expm1", P::Float32, P::None},
      {"log", P::Float32, P::None},
      {"log2", P::Float32, P::None},
      {"log1p", P::Float32, P::None},
      {"reciprocal", P::Float32, P::None},
      {"rsqrt", P::Float32, P::None},
      {"tan", P::Float32, P::None},
      {"pow", P::Float32, P::None},
      {"softplus", P::Float32, P::None},
      {"layer_norm", P::Float32, P::None},
      {"group_norm", P::Float32, P::None},
      {"rms_norm", P::Unknown, P::None},  // float32 on CUDA in some torch versions: not taken there
      // reductions that take a dtype: float32 unless the caller chose one (CPU: prod only)
      {"softmax", P::Float32DtypeArg, P::None},
      {"log_softmax", P::Float32DtypeArg, P::None},
      {"sum", P::Float32DtypeArg, P::None},
      {"prod", P::Float32DtypeArg, P::Float32DtypeArg},
  };
  for (const Row& r : table) {
    auto it = ops.find(r.op);
    if (it == ops.end()) throw std::logic_error(std::string("kiln: autocast policy for an unknown op ") + r.op);
    it->second.autocast_cuda = r.cuda;
    it->second.autocast_cpu = r.cpu;
  }
}

}  // namespace kiln::ops
