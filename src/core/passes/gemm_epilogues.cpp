// GEMM epilogues on the GPU.
//
// A linear layer is addmm(bias, x, w^T), and torch's CUDA addmm already adds a vector bias in
// cuBLASLt's epilogue. This pass also moves the activation that follows into the epilogue:
//
//   relu(addmm(b, x, w))                  ->  _addmm_activation(b, x, w)
//   gelu(addmm(b, x, w), approximate=tanh) ->  _addmm_activation(b, x, w, use_gelu=True)
//
// (through one reshape between them: a linear over [batch, seq, features]), so the activation
// is not a kernel of its own reading and writing the GEMM's result again. cuBLASLt's GELU
// epilogue is the tanh approximation, so the exact GELU (approximate="none") keeps its kernel.
//
// With max-autotune's measurements (ExternTiming) each candidate is timed on inputs of the
// node's sizes and layouts, and the winners are kept in the disk cache:
//   - the activation epilogue is taken unless cuBLASLt's epilogue kernel is slower than the
//     plain addmm by more than the separate activation kernel would cost (kEpilogueSlack);
//   - an addmm whose result only feeds pointwise ops may run as mm with the bias added in the
//     kernel those ops fuse into (cuBLASLt's bias epilogue is slower than cuBLAS's plain GEMM
//     at some shapes), when that is faster.
// Without measurements, a float32 addmm feeding pointwise ops runs as mm (as TorchInductor's
// default does); 16-bit ones keep the epilogue, which measured as fast as mm.
//
// Convolutions likewise: torch's CUDA convolution adds a bias with a kernel of its own after
// cuDNN's (aten::_convolution's add_), a broadcast add over the whole result. Where the result
// feeds pointwise ops alone (a folded batch norm's bias before its ReLU or residual add), the
// convolution runs without the bias and the add joins the kernel those ops fuse into: resnet18's
// 20 folded convolutions spent 136 of 674 µs a call (H200, fp32) in those adds.
#include "core/compile/disk_cache.h"
#include "core/ops/registry.h"
#include "core/passes/passes.h"
#include "core/support/hash.h"
#include "core/support/log.h"

namespace kiln::passes {
namespace {

constexpr const char* kGemmTuneVersion = "kiln-gemm-tune-2";
// The epilogue's GEMM may be this much slower than plain addmm and still win: the activation
// kernel it saves reads and writes the whole result once more.
constexpr double kEpilogueSlack = 0.10;
// mm replaces addmm only when this much faster (timing noise must not flip choices).
constexpr double kMinGain = 0.03;

bool half_or_float(DType t) { return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16; }

bool default_scale(const ir::Node* n, const char* key) {
  const ir::AttrValue* v = n->attrs.find(key);
  return !v || n->attrs.get_float(key) == 1.0;
}

bool is_output(ir::Graph& g, const ir::Node* n) {
  for (const ir::Node* o : g.outputs())
    if (o == n) return true;
  return false;
}

// The node that carries n's value on to its single consumer: n itself, or the one reshape
// between them. Null when the value has other uses (or is a graph output).
ir::Node* carried(ir::Graph& g, ir::Node* n, const ops::OpDef* reshape) {
  if (is_output(g, n) || n->users.size() != 1) return nullptr;
  ir::Node* u = n->users[0];
  if (u->op != reshape) return n;
  if (is_output(g, u) || u->users.size() != 1) return nullptr;
  return u;
}

std::string inputs_key(const ir::Node* n) {
  std::string k = n->op_name() + "(";
  for (const ir::Node* in : n->inputs) {
    k += in->meta.str() + "/";
    for (const sym::Expr& s : in->meta.strides) k += s.str() + ",";
    k += ";";
  }
  return k + ")" + n->attrs.str() + "@" + n->meta.device.str();
}

// The winner of the decision `key` the disk cache holds, else what `decide` (which times the
// candidates) picks, then stored; "" when timing failed.
std::string choose(ExternTiming& t, const std::string& key, const std::function<std::string()>& decide) {
  const std::string file = hex64(hash_str(key, hash_str(std::string(kGemmTuneVersion) + "|" + t.device_key))) + ".gemm";
  if (auto cached = compile::read_decision(file)) {
    ++t.from_disk;
    return *cached;
  }
  std::string winner = decide();
  if (winner.empty()) return winner;
  ++t.timed;
  compile::write_decision(file, winner);
  return winner;
}

bool pointwise_users_only(ir::Graph& g, const ir::Node* n) {
  if (is_output(g, n) || n->users.empty()) return false;
  for (const ir::Node* u : n->users)
    if (u->op->kind != ops::OpKind::Pointwise) return false;
  return true;
}

// conv2d(x, W, b) -> conv2d(x, W) + b[:, None, None] where only pointwise ops read the result.
bool conv_biases_into_kernels(ir::Graph& g, const ops::OpDef* reshape) {
  static const ops::OpDef* conv = ops::find_op("conv2d");
  std::vector<ir::Node*> convs;
  for (auto& n : g.nodes())
    if (n->op == conv && n->meta.device.type == DeviceType::CUDA && half_or_float(n->meta.dtype) &&
        n->inputs.size() > 2 && n->inputs[2] && n->inputs[2]->meta.dim() == 1 && pointwise_users_only(g, n.get()))
      convs.push_back(n.get());
  bool changed = false;
  for (ir::Node* n : convs) {
    const size_t tail = g.nodes().size();
    std::string error;
    ir::Node* plain = g.add(conv, {n->inputs[0], n->inputs[1], nullptr}, n->attrs, error);
    ir::Attrs per_channel;
    per_channel.set("shape", std::vector<int64_t>{-1, 1, 1});
    ir::Node* bias = plain ? g.add(reshape, {n->inputs[2]}, per_channel, error) : nullptr;
    ir::Node* sum = bias ? g.add("add", {plain, bias}, {}, error) : nullptr;
    changed = changed || plain != nullptr;  // a candidate left behind is dead code
    if (!sum || plain->meta.strides != n->meta.strides || sum->meta.dtype != n->meta.dtype ||
        sum->meta.sizes != n->meta.sizes || sum->meta.strides != n->meta.strides)
      continue;
    g.move_tail_before(tail, n);
    g.replace_all_uses(n, sum);
  }
  return changed;
}

}  // namespace

void gemm_epilogues(ir::Graph& g, ExternTiming* timing) {
  const ops::OpDef* addmm = ops::find_op("addmm");
  const ops::OpDef* relu = ops::find_op("relu");
  const ops::OpDef* gelu = ops::find_op("gelu");
  const ops::OpDef* reshape = ops::find_op("reshape");
  const ops::OpDef* with_activation = ops::find_op("addmm_activation");
  g.recompute_users();
  std::vector<ir::Node*> gemms;
  for (auto& n : g.nodes())
    if (n->op == addmm && n->meta.device.type == DeviceType::CUDA && half_or_float(n->meta.dtype) &&
        n->inputs[0]->meta.dim() == 1 && default_scale(n.get(), "beta") && default_scale(n.get(), "alpha"))
      gemms.push_back(n.get());
  bool changed = false;
  for (ir::Node* n : gemms) {
    ir::Node* value = carried(g, n, reshape);
    ir::Node* act = value ? value->users.empty() ? nullptr : value->users[0] : nullptr;
    const bool epilogue = act && act->meta.dtype == n->meta.dtype &&
                          (act->op == relu || (act->op == gelu && act->attrs.get_str("approximate", "none") == "tanh"));
    const size_t tail = g.nodes().size();
    std::string error;
    if (epilogue) {
      ir::Attrs attrs;
      attrs.set("use_gelu", act->op == gelu);
      ir::Node* fused = g.add(with_activation, n->inputs, attrs, error);
      if (!fused) continue;
      if (timing && timing->time) {
        const std::string pick = choose(*timing, "act:" + inputs_key(fused), [&]() -> std::string {
          const double t_fused = timing->time(*fused), t_plain = timing->time(*n);
          if (t_fused < 0 || t_plain < 0) return "";
          log("autotune", "addmm " + n->meta.str() + ": with its activation in the epilogue " + std::to_string(t_fused * 1e3) +
                              " us, plain " + std::to_string(t_plain * 1e3) + " us");
          return t_fused <= t_plain * (1 + kEpilogueSlack) ? "epilogue" : "kernel";
        });
        if (pick == "kernel") {
          changed = true;  // dead code elimination removes the candidate
          continue;
        }
      }
      ir::Node* result = fused;
      if (value != n) {
        result = g.add(reshape, {fused}, value->attrs, error);
        if (!result || result->meta.sizes != act->meta.sizes || result->meta.strides != act->meta.strides) continue;
      }
      g.move_tail_before(tail, act);
      g.replace_all_uses(act, result);
      changed = true;
      continue;
    }
    // The bias added by the kernel the result's pointwise users fuse into: timed under
    // max-autotune; otherwise taken in float32, where cuBLAS's plain GEMM was never slower than
    // the addmm in the measurements (BERT-base, H100: at 8 rows torch's addmm runs a GEMV-like
    // kernel where mm splits K, 20 against 14 µs for the feed-forward layers).
    if (!value || !pointwise_users_only(g, value)) continue;
    const bool timed = timing && timing->time;
    if (!timed && n->meta.dtype != DType::Float32) continue;
    ir::Node* plain = g.add("mm", {n->inputs[1], n->inputs[2]}, {}, error);
    if (!plain) continue;
    changed = true;
    const std::string pick = !timed ? "mm" : choose(*timing, "bias:" + inputs_key(n), [&]() -> std::string {
      const double t_mm = timing->time(*plain), t_addmm = timing->time(*n);
      if (t_mm < 0 || t_addmm < 0) return "";
      log("autotune", "addmm " + n->meta.str() + ": bias in the epilogue " + std::to_string(t_addmm * 1e3) + " us, mm " +
                          std::to_string(t_mm * 1e3) + " us and the bias in the next kernel");
      return t_mm < t_addmm * (1 - kMinGain) ? "mm" : "addmm";
    });
    if (pick != "mm") continue;
    ir::Node* sum = g.add("add", {plain, n->inputs[0]}, {}, error);
    if (!sum || sum->meta.dtype != n->meta.dtype || sum->meta.sizes != n->meta.sizes) continue;
    g.move_tail_before(tail, n);
    g.replace_all_uses(n, sum);
  }
  changed = conv_biases_into_kernels(g, reshape) || changed;
  if (changed) dead_code_elimination(g);
}

}  // namespace kiln::passes
