#include "bind/runtime/autograd_node.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <map>
#include <memory>
#include <type_traits>
#include <unordered_set>

#include "bind/runtime/executor.h"

namespace kiln::bind {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

namespace {

// torch holds autograd nodes by std::shared_ptr in older releases and by intrusive_ptr in
// newer ones; both are spelled through the type an Edge holds.
using NodePtr = decltype(torch::autograd::Edge::function);
constexpr bool kSharedNodes = std::is_same_v<NodePtr, std::shared_ptr<Node>>;

template <class N, class... Args>
NodePtr make_node(Args&&... args) {
  if constexpr (kSharedNodes) return std::make_shared<N>(std::forward<Args>(args)...);
  else return c10::make_intrusive<N>(std::forward<Args>(args)...);
}

template <class N>
NodePtr pointer_to(N* n) {
  if constexpr (kSharedNodes) return n->shared_from_this();
  else return c10::intrusive_ptr<Node>::unsafe_reclaim_from_nonowning(n);
}

// Releases the last reference to a program (which holds Python objects) with the GIL held:
// autograd may drop a node on any thread.
void release_with_gil(std::shared_ptr<BackwardProgram>& p) {
  if (!p) return;
  if (p.use_count() > 1 || !Py_IsInitialized()) {
    p.reset();
    return;
  }
  PyGILState_STATE s = PyGILState_Ensure();
  p.reset();
  PyGILState_Release(s);
}

// One backward pass through the stages of one call: which tangents autograd reached (the first
// stage tells the later ones: a gradient computed only from unreached ones is None, as eager's),
// and the values stages keep for later ones, per (stage, output).
struct StagedCall {
  std::vector<char> tangent_defined;
  std::vector<std::vector<at::Tensor>> kept;
};

// The grad_fn of a kiln training entry's outputs (named like torch.compile's), and the node of
// each later stage of its backward.
struct CompiledFunctionBackward final : Node {
  std::shared_ptr<BackwardProgram> program;
  size_t stage = 0;
  std::shared_ptr<StagedCall> call;
  std::vector<SavedVariable> saved;
  // Outputs that are results eager's autograd saves (BackwardProgram::result_witnesses): kept
  // as saved outputs so that unpacking them raises autograd's own error if one was changed in
  // place after the call.
  std::vector<SavedVariable> witnesses;
  std::vector<int64_t> scalars;  // the Python-int symbols' values of the forward call

  ~CompiledFunctionBackward() override { release_with_gil(program); }
  std::string name() const override { return "CompiledFunctionBackward"; }
  void release_variables() override {
    for (SavedVariable& s : saved) s.reset_data();
    for (SavedVariable& s : witnesses) s.reset_data();
  }

  // The program's inputs: this stage's saved values, then the tangents (first stage, zeros where
  // autograd reached none) or what earlier stages kept for it.
  std::vector<at::Tensor> program_inputs(const variable_list& grads) {
    const BackwardProgram& p = *program;
    const BackwardStageProgram& st = p.stages[stage];
    NodePtr self = pointer_to(this);
    std::vector<at::Tensor> ins;
    ins.reserve(st.saved.size() + grads.size() + st.receive.size());
    for (const SavedVariable& s : saved) ins.push_back(s.unpack(self));  // raises after the graph was freed
    if (stage == 0) {
      call->tangent_defined.assign(grads.size(), 0);
      for (size_t i = 0; i < grads.size(); ++i) {
        call->tangent_defined[i] = grads[i].defined();
        at::Tensor g = grads[i].defined() ? grads[i] : input_metadata(i).zeros_like();
        ins.push_back(g.contiguous());  // the program reads tangents row-major
      }
      if (p.stages.size() > 1) call->kept.assign(p.stages.size(), {});
      return ins;
    }
    for (const auto& [from, output] : st.receive) ins.push_back(call->kept.at(static_cast<size_t>(from)).at(static_cast<size_t>(output)));
    for (const auto& [from, output] : st.release) call->kept[static_cast<size_t>(from)][static_cast<size_t>(output)].reset();
    return ins;
  }

  // Whether autograd reached an output gradient `k` flows from (else eager's None).
  bool reached(size_t k) const {
    const BackwardProgram& p = *program;
    if (k >= p.grad_tangents.size() || p.grad_tangents[k].empty()) return true;
    for (int t : p.grad_tangents[k])
      if (static_cast<size_t>(t) < call->tangent_defined.size() && call->tangent_defined[static_cast<size_t>(t)]) return true;
    return false;
  }

  variable_list apply(variable_list&& grads) override {
    const BackwardProgram& p = *program;
    const BackwardStageProgram& st = p.stages[stage];
    if (stage == 0) {
      NodePtr self = pointer_to(this);
      for (const SavedVariable& w : witnesses) w.unpack(self);  // raises if changed in place since the call
      if (!p.backward_error.empty())
        for (int t : p.error_tangents)
          if (static_cast<size_t>(t) < grads.size() && grads[t].defined()) throw std::runtime_error(p.backward_error);
    }
    std::vector<at::Tensor> ins = program_inputs(grads);
    // Without retain_graph, autograd lets go of this node's saved values once it returns: let
    // go now, and the program frees each as soon as it has read it for the last time.
    const bool consume = !torch::autograd::get_current_graph_task_keep_graph();
    if (consume) {
      for (SavedVariable& s : saved) s.reset_data();
      grads.clear();
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    std::vector<PyObject*> wrapped, outs;
    for (const at::Tensor& t : ins) wrapped.push_back(THPVariable_Wrap(t));
    bool ok = true;
    for (PyObject* w : wrapped) ok = ok && w;
    if (ok) {
      torch::autograd::AutoGradMode no_grad(false);
      if (consume) {
        ins.clear();
        ok = run_program_consuming(*st.compiled, *st.prepared, wrapped.data(), outs, scalars.data());
        wrapped.clear();  // the program let them go
      } else {
        ok = run_program(*st.compiled, *st.prepared, wrapped.data(), outs, scalars.data());
      }
    }
    variable_list result(st.grad_wrt.size() + (st.feeds_next ? 1 : 0));
    if (ok) {
      for (size_t e = 0; e < st.grad_wrt.size(); ++e)
        if (st.grad_output[e] >= 0 && reached(static_cast<size_t>(st.grad_wrt[e])))
          result[e] = THPVariable_Unpack(outs[static_cast<size_t>(st.grad_output[e])]);
      // Eager's autograd gives every input a gradient of its own. The program may hand one
      // buffer out for several (equal gradients merged: a residual block's two batch-norm
      // biases); AccumulateGrad would keep both as .grad, and accumulating into one would
      // change the other.
      std::unordered_set<const void*> storages;
      for (size_t e = 0; e < st.grad_wrt.size(); ++e)
        if (result[e].defined() && !storages.insert(result[e].storage().unsafeGetStorageImpl()).second)
          result[e] = result[e].clone();
      if (!st.keep.empty()) {
        std::vector<at::Tensor>& kept = call->kept.at(stage);
        kept.resize(outs.size());
        for (int o : st.keep) kept[static_cast<size_t>(o)] = THPVariable_Unpack(outs[static_cast<size_t>(o)]);
      }
      if (st.feeds_next) {
        // The next stage's input learns the value's shape, dtype and stream now, when autograd
        // is about to check the value against it.
        at::Tensor token = THPVariable_Unpack(outs[0]);
        const torch::autograd::Edge& to = next_edge(st.grad_wrt.size());
        torch::autograd::InputMetadata& md = to.function->mutable_input_metadata(to.input_nr);
        std::destroy_at(&md);
        std::construct_at(&md, token);
        result.back() = std::move(token);
      }
    }
    for (PyObject* o : wrapped) Py_XDECREF(o);
    for (PyObject* o : outs) Py_XDECREF(o);
    if (!ok) {
      python_error err;
      err.persist();
      PyGILState_Release(gil);
      throw std::move(err);
    }
    PyGILState_Release(gil);
    // create_graph=True: the gradients are not differentiable again; a backward through them
    // raises (torch.compile's AOTAutograd does the same).
    if (torch::autograd::GradMode::is_enabled()) {
      torch::autograd::edge_list grad_edges(next_edges().begin(), next_edges().begin() + static_cast<std::ptrdiff_t>(st.grad_wrt.size()));
      NodePtr error = make_node<torch::autograd::Error>(
          "kiln: double backward through a kiln-compiled graph is not supported (its gradients were computed with "
          "create_graph=True); run this function eagerly for higher-order gradients",
          std::move(grad_edges));  // the gradients depend on the inputs
      for (size_t e = 0; e < st.grad_wrt.size(); ++e)
        if (result[e].defined()) {
          result[e] = result[e].detach();
          torch::autograd::set_history(result[e], error);
        }
    }
    return result;
  }
};

}  // namespace

BackwardProgram::~BackwardProgram() = default;

void plan_backward_stages(BackwardProgram& p, const std::vector<autodiff::BackwardStage>& cut) {
  std::map<int, int> wrt_of_grad;  // gradient (backward output) -> `wrt` edge
  for (size_t k = 0; k < p.grad_of.size(); ++k)
    if (p.grad_of[k] >= 0) wrt_of_grad[p.grad_of[k]] = static_cast<int>(k);
  if (cut.empty()) {
    BackwardStageProgram& st = p.stages.at(0);
    for (size_t j = 0; j < p.saved; ++j) st.saved.push_back(static_cast<int>(j));
    for (size_t k = 0; k < p.wrt.size(); ++k) {
      st.grad_wrt.push_back(static_cast<int>(k));
      st.grad_output.push_back(k < p.grad_of.size() ? p.grad_of[k] : -1);
    }
    return;
  }
  std::map<std::pair<int, int>, int> last_reader;
  for (size_t s = 0; s < cut.size(); ++s) {
    BackwardStageProgram& st = p.stages.at(s);
    st.saved = cut[s].saved;
    st.feeds_next = s + 1 < cut.size();
    for (const auto& r : cut[s].received) {
      st.receive.emplace_back(r.stage, r.output);
      last_reader[{r.stage, r.output}] = static_cast<int>(s);
      std::vector<int>& keep = p.stages.at(static_cast<size_t>(r.stage)).keep;
      if (std::find(keep.begin(), keep.end(), r.output) == keep.end()) keep.push_back(r.output);
    }
    for (size_t j = 0; j < cut[s].grads.size(); ++j) {
      st.grad_wrt.push_back(wrt_of_grad.at(cut[s].grads[j]));
      st.grad_output.push_back(static_cast<int>(j));
    }
  }
  for (const auto& [value, reader] : last_reader) p.stages[static_cast<size_t>(reader)].release.push_back(value);
  for (size_t k = 0; k < p.wrt.size(); ++k)  // inputs no gradient reaches: None, from the first stage
    if (k >= p.grad_of.size() || p.grad_of[k] < 0) {
      p.stages[0].grad_wrt.push_back(static_cast<int>(k));
      p.stages[0].grad_output.push_back(-1);
    }
}

bool run_forward_with_backward(const pipeline::CompiledGraph& forward, PreparedProgram& prep,
                               const std::shared_ptr<BackwardProgram>& backward, PyObject* const* inputs,
                               std::vector<PyObject*>& outputs, const int64_t* scalars, size_t scalar_count) {
  const BackwardProgram& bp = *backward;
  {
    torch::autograd::AutoGradMode no_grad(false);
    if (!run_program(forward, prep, inputs, outputs, scalars)) return false;
  }
  try {
    // One node per stage, made last stage first (each holds an edge to the next).
    const size_t n = bp.stages.size();
    auto call = std::make_shared<StagedCall>();
    std::vector<NodePtr> nodes(n);
    for (size_t s = n; s-- > 0;) {
      const BackwardStageProgram& st = bp.stages[s];
      nodes[s] = make_node<CompiledFunctionBackward>();
      auto* node = static_cast<CompiledFunctionBackward*>(nodes[s].get());
      node->program = backward;
      node->stage = s;
      node->call = call;
      // the forward's int symbols, the sizes the backward reads off the inputs, then the floats
      const size_t ints = std::min(bp.forward_int_symbols, scalar_count);
      node->scalars.assign(scalars, scalars + ints);
      for (const auto& [input, dim] : bp.symbol_dims) node->scalars.push_back(THPVariable_Unpack(inputs[input]).size(dim));
      node->scalars.insert(node->scalars.end(), scalars + ints, scalars + scalar_count);
      // An input no gradient reaches (read only through a detach, a comparison) has no edge, as
      // in eager's graph: an edge would lead backward() into the graph that made it, which
      // an earlier backward() may have freed ("backward through the graph a second time").
      torch::autograd::edge_list edges;
      for (size_t i = 0; i < st.grad_wrt.size(); ++i) {
        const at::Tensor& t = THPVariable_Unpack(inputs[bp.wrt[static_cast<size_t>(st.grad_wrt[i])]]);
        edges.push_back(st.grad_output[i] >= 0 ? torch::autograd::impl::gradient_edge(t) : torch::autograd::Edge());
      }
      if (st.feeds_next) edges.emplace_back(nodes[s + 1], 0);
      node->set_next_edges(std::move(edges));
      // A later stage's input is told its shape when the stage before it runs.
      if (s > 0) node->add_input_metadata(Node::undefined_input());
    }
    auto* first = static_cast<CompiledFunctionBackward*>(nodes[0].get());
    // The outputs autograd reaches through the first node, in tangent order. A view (of an input
    // or of the program's own buffer) becomes a tensor of its own first: a view made under
    // no_grad cannot take a grad_fn.
    // An output that views an input autograd tracks, or another output, is that tensor's view
    // in eager, which autograd knows as one: an in-place change of it reaches its base's history
    // (CopySlices). Such outputs are taken again from their base, as views, once the base
    // has its history (AOTAutograd's regenerated aliases).
    std::vector<std::pair<size_t, at::Tensor>> rebased;  // (output, base) with the view's layout
    auto base_of = [&](const at::Tensor& t) -> std::optional<std::pair<int, bool>> {  // (index, is output)
      if (!t.is_view()) return std::nullopt;
      const c10::Storage& st = t.storage();
      for (size_t k = 0; k < bp.wrt.size(); ++k) {
        const at::Tensor& in = THPVariable_Unpack(inputs[bp.wrt[k]]);
        if (in.requires_grad() && in.storage().is_alias_of(st)) return std::make_pair(static_cast<int>(bp.wrt[k]), false);
      }
      for (size_t j = 0; j < bp.outputs; ++j) {
        if (bp.tangent_of[j] < 0) continue;
        const at::Tensor& o = THPVariable_Unpack(outputs[j]);
        if (!o.is_view() && o.storage().is_alias_of(st)) return std::make_pair(static_cast<int>(j), true);
      }
      return std::nullopt;
    };
    std::vector<std::optional<std::pair<int, bool>>> view_base(bp.outputs);
    for (size_t i = 0; i < bp.outputs; ++i)
      if (bp.tangent_of[i] >= 0) view_base[i] = base_of(THPVariable_Unpack(outputs[i]));
    for (size_t i = 0; i < bp.outputs; ++i) {
      if (bp.tangent_of[i] < 0) continue;
      at::Tensor t = THPVariable_Unpack(outputs[i]);
      if (t.is_view() || t.requires_grad()) {
        t = t.detach();
        Py_SETREF(outputs[i], THPVariable_Wrap(t));
        if (!outputs[i]) throw python_error();
      }
      torch::autograd::set_history(t, nodes[0]);
    }
    for (size_t i = 0; i < bp.outputs; ++i) {
      if (!view_base[i]) continue;
      const auto [k, is_output] = *view_base[i];
      const at::Tensor& base = THPVariable_Unpack(is_output ? outputs[static_cast<size_t>(k)] : inputs[k]);
      const at::Tensor& t = THPVariable_Unpack(outputs[i]);
      at::Tensor v;
      {
        torch::autograd::AutoGradMode grad(true);
        v = base.as_strided(t.sizes(), t.strides(), t.storage_offset());
      }
      Py_SETREF(outputs[i], THPVariable_Wrap(std::move(v)));
      if (!outputs[i]) throw python_error();
    }
    for (int i : bp.result_witnesses) first->witnesses.emplace_back(THPVariable_Unpack(outputs[static_cast<size_t>(i)]), true);
    // Each stage keeps the saved values it reads. One that is also an output is saved as an
    // output (without its grad_fn, the first node: a later stage holding it would be a cycle).
    for (size_t s = 0; s < n; ++s)
      for (int j : bp.stages[s].saved) {
        PyObject* o = outputs[bp.outputs + static_cast<size_t>(j)];
        const int as_output = bp.saved_as_output[static_cast<size_t>(j)];
        at::Tensor t = THPVariable_Unpack(as_output >= 0 ? outputs[static_cast<size_t>(as_output)] : o);
        static_cast<CompiledFunctionBackward*>(nodes[s].get())->saved.emplace_back(t, as_output >= 0);
      }
  } catch (...) {
    for (PyObject* o : outputs) Py_XDECREF(o);
    outputs.clear();
    torch::translate_exception_to_python(std::current_exception());
    return false;
  }
  for (size_t j = bp.outputs; j < outputs.size(); ++j) Py_DECREF(outputs[j]);
  outputs.resize(bp.outputs);
  return true;
}

}  // namespace kiln::bind
