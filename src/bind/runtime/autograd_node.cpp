#include "bind/runtime/autograd_node.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <type_traits>

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

// The grad_fn of a kiln training entry's outputs (named like torch.compile's).
struct CompiledFunctionBackward final : Node {
  std::shared_ptr<BackwardProgram> program;
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

  variable_list apply(variable_list&& grads) override {
    const BackwardProgram& p = *program;
    std::vector<at::Tensor> ins;
    ins.reserve(p.saved + p.tangents);
    NodePtr self = pointer_to(this);
    for (const SavedVariable& w : witnesses) w.unpack(self);  // raises if changed in place since the call
    if (!p.backward_error.empty())
      for (int t : p.error_tangents)
        if (static_cast<size_t>(t) < grads.size() && grads[t].defined()) throw std::runtime_error(p.backward_error);
    for (const SavedVariable& s : saved) ins.push_back(s.unpack(self));  // raises after the graph was freed
    ins.resize(p.saved + p.tangents);
    for (size_t i = 0; i < grads.size(); ++i) {
      at::Tensor g = grads[i].defined() ? grads[i] : input_metadata(i).zeros_like();
      ins[p.saved + i] = g.contiguous();  // the program reads tangents row-major
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    std::vector<PyObject*> wrapped, outs;
    for (const at::Tensor& t : ins) wrapped.push_back(THPVariable_Wrap(t));
    bool ok = true;
    for (PyObject* w : wrapped) ok = ok && w;
    if (ok) {
      torch::autograd::AutoGradMode no_grad(false);
      ok = run_program(*p.compiled, *p.prepared, wrapped.data(), outs, scalars.data());
    }
    variable_list result(p.wrt.size());
    if (ok)
      for (size_t k = 0; k < p.wrt.size(); ++k) {
        if (p.grad_of[k] < 0) continue;
        // None where autograd reached none of the outputs this gradient flows from (a value
        // handed out at a break that nothing used), as eager's None, not zeros
        bool reached = k >= p.grad_tangents.size() || p.grad_tangents[k].empty();
        if (!reached)
          for (int t : p.grad_tangents[k]) reached = reached || (static_cast<size_t>(t) < grads.size() && grads[t].defined());
        if (reached) result[k] = THPVariable_Unpack(outs[static_cast<size_t>(p.grad_of[k])]);
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
      NodePtr error = make_node<torch::autograd::Error>(
          "kiln: double backward through a kiln-compiled graph is not supported (its gradients were computed with "
          "create_graph=True); run this function eagerly for higher-order gradients",
          torch::autograd::edge_list(next_edges()));  // the gradients depend on the inputs
      for (at::Tensor& r : result)
        if (r.defined()) {
          r = r.detach();
          torch::autograd::set_history(r, error);
        }
    }
    return result;
  }
};

}  // namespace

BackwardProgram::~BackwardProgram() = default;

bool run_forward_with_backward(const pipeline::CompiledGraph& forward, PreparedProgram& prep,
                               const std::shared_ptr<BackwardProgram>& backward, PyObject* const* inputs,
                               std::vector<PyObject*>& outputs, const int64_t* scalars, size_t scalar_count) {
  const BackwardProgram& bp = *backward;
  {
    torch::autograd::AutoGradMode no_grad(false);
    if (!run_program(forward, prep, inputs, outputs, scalars)) return false;
  }
  try {
    NodePtr node_ptr = make_node<CompiledFunctionBackward>();
    auto* node = static_cast<CompiledFunctionBackward*>(node_ptr.get());
    node->program = backward;
    node->scalars.assign(scalars, scalars + scalar_count);
    std::vector<at::Tensor> wrt;
    for (int i : bp.wrt) wrt.push_back(THPVariable_Unpack(inputs[i]));
    node->set_next_edges(torch::autograd::collect_next_edges(wrt));
    // The outputs autograd reaches through the node, in tangent order. A view (of an input or
    // of the program's own buffer) becomes a tensor of its own first: a view made under no_grad
    // cannot take a grad_fn.
    for (size_t i = 0; i < bp.outputs; ++i) {
      if (bp.tangent_of[i] < 0) continue;
      at::Tensor t = THPVariable_Unpack(outputs[i]);
      if (t.is_view() || t.requires_grad()) {
        t = t.detach();
        Py_SETREF(outputs[i], THPVariable_Wrap(t));
        if (!outputs[i]) throw python_error();
      }
      torch::autograd::set_history(t, node_ptr);
    }
    for (int i : bp.result_witnesses) node->witnesses.emplace_back(THPVariable_Unpack(outputs[static_cast<size_t>(i)]), true);
    for (size_t j = 0; j < bp.saved; ++j) {
      PyObject* o = outputs[bp.outputs + j];
      const int as_output = bp.saved_as_output[j];
      at::Tensor t = THPVariable_Unpack(as_output >= 0 ? outputs[static_cast<size_t>(as_output)] : o);
      node->saved.emplace_back(t, as_output >= 0);
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
