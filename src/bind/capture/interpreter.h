// The symbolic interpreter behind capture() (capture.h): one instance per frame it interprets,
// the root one for the function being compiled and a child for each inlined call.
//
// Its member functions live in files by topic: interpreter.cpp (the frame loop and the opcode
// dispatch), calls.cpp (calls, inlining, builtins, extern calls of torch operators), modules.cpp
// (nn.Module calls: hooks, torch.nn layers as ops, containers),
// objects.cpp (attributes, modules, closures, super()), containers.cpp (dicts, lists, tuples),
// operators.cpp (Python operators and in-place updates) and graph_break.cpp (breaks and the
// values a resume function is handed).
#pragma once
#include <Python.h>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bind/capture/bytecode.h"
#include "bind/capture/capture.h"
#include "bind/capture/torch_ops.h"
#include "bind/capture/variables.h"
#include "core/ops/registry.h"

namespace kiln::bind::detail {

// Ctrl-C (a KeyboardInterrupt kept by clear_error): capture stops at once, with no graph break.
struct Interrupted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void unsupported(const std::string& why) { throw Unsupported(why); }

// A Python exception the captured code raises (an operation on constants raised, a `raise`):
// what eager raises there. A handler of the frame (try/except) or of a caller takes it; one that
// reaches the function kiln compiles ends capture like any Unsupported.
struct Raised : Unsupported {
  Raised(PyObject* e, const std::string& why) : Unsupported(why), exc(e) {}
  PyObject* exc;  // the exception instance (kept alive by the root's keep_)
};

inline bool is_python_scalar(PyObject* o) { return PyBool_Check(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o); }
// A class's own Python function for a dunder, along its MRO (borrowed), or nullptr (absent, or a
// C slot): what capture inlines (user_objects.cpp).
PyObject* python_function(PyTypeObject* t, const char* name);

class Interpreter {
  friend struct ModuleRules;  // modules.cpp: torch.nn layers as ops
  friend struct CallRules;    // call_rules.cpp: calls dispatched on the callee object
  friend struct NumpyRules;   // numpy.cpp: NumPy functions, methods and operators

 public:
  // Capture's tensor hook (Var::tensor_hook): keeps the trackers that hold views (retake_views).
  void note_tensor(const VarPtr& v) {
    if (is_view(v->node())) view_vars_.push_back(v);
    else trackers_[v->node()].push_back(v);
  }
  // Guards the Python floats a symbolic float's node is made of by their values (its value was
  // read as a Python object).
  void specialize_floats(const ir::Node* n);
  // A node whose result shares its first input's memory in eager (a registry view, or a torch
  // call marked as returning a view).
  // (A reshape of memory no strides describe is a copy in eager: no view.)
  static bool is_view(const ir::Node* n) {
    if (n->op->copies && n->op->copies(*n)) return false;
    return n->op->aliases() || n->attrs.get_bool("view");
  }
  // The root interpreter of a capture, or (with `parent`) one that inlines a call: it shares
  // the graph, the guards and the graph inputs of the root.
  Interpreter(PyObject* fn, CaptureResult& out, Interpreter* parent = nullptr, SourcePtr fn_source = nullptr)
      : fn_(fn), out_(out), code_(PyFunction_GET_CODE(fn)), globals_(PyFunction_GET_GLOBALS(fn)),
        parent_(parent), fn_source_(std::move(fn_source)) {
    builtins_ = PyEval_GetBuiltins();
    if (!parent) out_.graph = std::make_unique<ir::Graph>();
    g_ = out_.graph.get();
    depth_ = parent ? parent->depth_ + 1 : 0;
    auto* co = reinterpret_cast<PyCodeObject*>(code_);
    filename_ = PyUnicode_AsUTF8(co->co_filename);
    locals_.assign(co->co_nlocalsplus, nullptr);
  }

  // Captures a call of the root function with these arguments.
  void run(const BoundArgs& args);

  // Interprets the frame until it returns; the value it returns.
  VarPtr run_frame();

  Interpreter* root();

  // Where capture is: the innermost instruction, inlined calls included.
  std::string location() const;

  // The nodes autograd would record: inputs that require grad, and what grad mode computed
  // from them.
  const std::unordered_set<const ir::Node*>& tracked() const { return needs_grad_; }

 private:
  static constexpr int kReturn = -2;
  static constexpr int kYield = -3;  // a generator frame run by generator_context stops at its yield
  using KwArgs = std::vector<std::pair<std::string, VarPtr>>;

  // ---- values read from the frame: wrap and guard ----
  VarPtr wrap(PyObject* v, SourcePtr src);

  static bool is_nn_module(PyObject* v);
  static bool own_forward_of(PyObject* module, PyObject* f);
  VarPtr autograd_function_apply(const VarPtr& fn, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  VarPtr differentiable_function_apply(const VarPtr& cls_var, const std::vector<VarPtr>& args, const KwArgs& kwargs,
                                       const std::function<bool(const VarPtr&)>& tracked);

  // Objects guarded by their type and the attributes capture reads (instances of user classes)
  // rather than by identity, until capture uses the object itself as a value (const_obj).
  static bool by_structure(PyObject* v);
  static bool structural(const VarPtr& v);
  // A bound method of such an object (guarded by its function and the receiver's type), or a C
  // method bound to any object but a module, read from the frame: handed on, it is re-read for
  // the call's own receiver.
  static bool bound_to_structure(const VarPtr& v);
  // The class of the tensor a graph input was read from (its tensor guard checks it), or nullptr.
  PyObject* input_type(const ir::Node* placeholder);
  PyObject* input_object(const ir::Node* placeholder);  // the caller's tensor at capture (borrowed)
  // Whether a Python module's attributes are taken as fixed (torch's, the standard library's,
  // NumPy's); other modules' are guarded where read.
  static bool stable_module(PyObject* module);

  // ---- the stack ----
  VarPtr pop();

  void push(VarPtr v);

  VarPtr& peek(size_t i);

  // ---- graph building ----
  // `autocast`: false where the caller has made autocast's casts already (a torch_call cast as
  // the registry entry of its function says).
  ir::Node* add_node(const ops::OpDef* op, std::vector<ir::Node*> inputs, ir::Attrs attrs, bool autocast = true);

  ir::Node* add_node(const std::string& op, std::vector<ir::Node*> inputs, ir::Attrs attrs = {});

  // Under torch.autocast: the casts autocast makes before `op` (its policy in the registry)
  // become convert nodes on its inputs, or a dtype argument; an op whose policy kiln does not
  // know stops capture when it has floating inputs.
  void autocast_inputs(const ops::OpDef* op, std::vector<ir::Node*>& inputs, ir::Attrs& attrs);
  void autocast_inputs(ops::AutocastPolicy cuda, ops::AutocastPolicy cpu, const std::string& what,
                       std::vector<ir::Node*>& inputs, ir::Attrs& attrs);

  ir::Node* as_node(const VarPtr& v, const char* what);

  // Python value of a constant, or capture stops.
  PyObject* const_obj(const VarPtr& v, const char* what);

  // ---- 0-d tensors of known value: an op on Python numbers alone (LED's
  // torch.div(seq_len, w, rounding_mode="trunc")) runs at capture, as torch's fake tensors keep
  // such small constants, and its result is a `full` node whose value capture knows: where a
  // size is wanted (view, new_zeros), the Python int it holds ----
  VarPtr known_tensor(PyObject* real);     // a node holding real (a CPU 0-d tensor); nullptr: not one
  PyObject* known_value(const VarPtr& v);  // the real 0-d tensor behind tracker v, or nullptr
  VarPtr known_int(const VarPtr& v);       // v, or the Python int a known integral 0-d tensor holds

  // ---- tensors as dict keys and set items (hashed by identity, as eager's are) ----
  // A key object standing for tensor `v` (one per graph node: the same tensor, the same key);
  // other values as const_obj gives them.
  PyObject* key_obj(const VarPtr& v, const char* what, const VarPtr& caller_dict = nullptr);
  // The value a dict key or set item stands for: the tensor behind a key object, else k.
  VarPtr key_var(PyObject* k);
  // Whether a Python value holds a key object (a set or dict handed out would show it).
  bool holds_tensor_key(PyObject* o);

  // ---- dicts made in the frame: constant keys, tracked values ----
  static Py_ssize_t dict_find(const VarPtr& d, PyObject* key);

  static void dict_set(const VarPtr& d, PyObject* key, VarPtr v);

  // The entries of a dict value: a tracker's, or a real dict's. Values of a dict read from
  // the frame are guarded like any read (and so is its length).
  std::vector<std::pair<PyObject*, VarPtr>> dict_entries(const VarPtr& d);

  bool is_dict(const VarPtr& v);

  VarPtr call_dict_method(const VarPtr& d, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs);

  // d.keys() / values() / items(): a List tracker with self = the dict and name = the method. A
  // view is live, so its items are read from the dict again each time it is taken off the stack.
  void refresh_dict_view(const VarPtr& view);

  // Runs a real Python operation on constants: it is what the eager code would compute.
  VarPtr real(PyObject* r);
  // f(*args, **kwargs) run for real on the Python values the trackers stand for (capture stops
  // at one that is not a Python value): a new reference, or nullptr with Python's error set.
  PyObject* call_for_real(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs, const char* what = "argument");

  // ---- binding Python arguments to an op's schema ----
  bool to_int_list(PyObject* o, std::vector<int64_t>& out);

  std::vector<ir::Node*> without_skipped_empties(const std::vector<ir::Node*>& items);
  VarPtr call_op(const OpBinding& b, std::vector<VarPtr> args, const std::vector<std::pair<std::string, VarPtr>>& kwargs);
  // F.batch_norm(training=True): the op on the batch's statistics, and the running statistics
  // updated in place (written back), as torch's kernel does.
  VarPtr batch_norm_training(const std::vector<ir::Node*>& inputs, std::vector<VarPtr> vars, const ir::Attrs& attrs);
  // F.dropout / torch.dropout: in training mode a `dropout` node whose mask comes from kiln's
  // generator (random_ops.cpp), keyed by the graph's seed input.
  VarPtr dropout(const std::vector<VarPtr>& args, const KwArgs& kwargs, bool functional);
  // torch.rand / randn / randint and their _like forms: kiln's draws (random_ops.cpp), or
  // nullptr where the call is not one capture takes (a generator, another layout...).
  VarPtr random_draw(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  // Why running torch call `f` again in the backward (its gradient, aten_vjp) would not repeat
  // the forward (a random draw, an in-place update of an input); empty when it would.
  std::string rerun_differs(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  // Uniform [0, 1) float32s of `sizes` on `device`, a draw of its own (bernoulli's masks).
  ir::Node* uniform_draw(const std::vector<sym::Expr>& sizes, const std::string& device);
  ir::Node* normal_draw(const std::vector<sym::Expr>& sizes, const std::string& device, DType dtype);  // standard normal
  int64_t next_draw_offset();  // the counters of the graph's next random draw
  // x.normal_(mean, std) / x.uniform_(from, to) from kiln's draws; nullptr: left to torch
  VarPtr random_fill(const VarPtr& self, bool normal, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  VarPtr add_product(const VarPtr& self, const std::string& name, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  // str(torch.device(device)) ("cpu", "cuda:0"), torch's default device for None or nullptr
  std::optional<std::string> device_name(PyObject* device);
  // torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False): fn(*args) inlined, the
  // nodes it makes marked `checkpoint`, so the backward recomputes them instead of reading
  // them saved (autodiff/partition.h).
  VarPtr checkpointed_call(const VarPtr& fn, std::vector<VarPtr> args, KwArgs kwargs);
  // The graph's int64 seed input: drawn from torch's default generator on every call (one per
  // graph, however many draws use it).
  VarPtr rng_seed();

  // ---- calls ----

  VarPtr call(VarPtr fn, std::vector<VarPtr> args, KwArgs kwargs);

  // Inlines a call of a Python function: its frame is interpreted into the same graph.
  // `cells`: for a function made in the frame, its closure cells (trackers).
  VarPtr inline_call(PyObject* f, SourcePtr f_source, std::vector<VarPtr> args, const KwArgs& kwargs,
                     const std::vector<VarPtr>* cells = nullptr);
  // inline_call's frame for f with the arguments bound, not yet run.
  std::unique_ptr<Interpreter> bound_frame(PyObject* f, SourcePtr f_source, std::vector<VarPtr> args, const KwArgs& kwargs,
                                           const std::vector<VarPtr>* cells);

  // ---- context managers written in Python (python_contexts.cpp) ----
  // A call of a @contextlib.contextmanager function (its `helper`): a Context tracker holding the
  // generator's frame, or nullptr where f is not one.
  VarPtr generator_context(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs, const std::vector<VarPtr>* cells);
  // The context manager a call of generator function `gen` (its closure `cells` where it was
  // made in the frame) under @contextmanager makes.
  VarPtr make_generator_context(PyObject* gen, const std::vector<VarPtr>* cells, const std::vector<VarPtr>& args,
                                const KwArgs& kwargs);
  // `with ctx` of a context manager written in Python: runs its __enter__ (or the generator to
  // its yield), pushes the exit tracker and what `as` binds. False where ctx is not one.
  bool enter_python_context(const VarPtr& ctx);
  // The block's end: __exit__(None, None, None), or the generator run on from its yield.
  VarPtr exit_python_context(const ContextExitV& exit, std::vector<VarPtr> args, const KwArgs& kwargs);
  // The block left by exception `exc`: __exit__(type, exc, tb), or exc thrown into the generator;
  // whether it is suppressed (an exception the exit raises instead propagates).
  bool exit_python_context_raising(const ContextExitV& exit, const VarPtr& exc);
  // A call of a function decorated with a @contextmanager object: in a fresh manager made as
  // that one was (ContextDecorator's _recreate_cm).
  VarPtr call_in_fresh_context(const FunctionV& f, std::vector<VarPtr> args, const KwArgs& kwargs);
  // What enter_python_context pushes: the exit tracker and what `as` binds (nullptr: not one).
  std::pair<VarPtr, VarPtr> enter_python_context_values(const VarPtr& ctx);

  // The items of a value that a loop could walk at capture time.
  std::vector<VarPtr> items_of(const VarPtr& v);
  VarPtr iterate(const VarPtr& seq);  // iter(seq): a list's iterator reads the list as it steps
  void sync_list_iterator(IteratorV& it);  // a list iterator's items as the list holds them now
  // items_of, by something that iterates to the end (list(it), unpacking, extend): an iterator
  // is left exhausted, as Python leaves it.
  std::vector<VarPtr> drain(const VarPtr& v);
  // sorted/min/max(items, key=..., reverse=...) over items known here.
  VarPtr order_by_key(PyObject* f, const VarPtr& iterable, const KwArgs& kwargs);
  // Whether a torch call's result on meta tensors (meta_result) has other sizes or dtypes than
  // the call run for real gives: on small CPU inputs of fixed sizes, or, for a Python function of
  // torch's (which may ask a tensor's device), dtypes at two points a dim (`call` runs it on the
  // given tensors).
  bool meta_disagrees(PyObject* f, PyObject*& meta_result, const std::vector<ir::Node*>& inputs,
                      const std::function<PyObject*(const std::vector<PyObject*>&)>& call);
  // collections.OrderedDict(...) and defaultdict(factory, ...) called in the frame: dict trackers
  // that remember their class (and factory), rebuilt as such (containers.cpp). nullptr: cls is
  // neither.
  VarPtr make_typed_dict(PyObject* cls, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  OutSpec typed_dict_spec(const DictV& d, bool at_break);
  // A value re-read from the frame at `src` (OutSpec::from_source); an object the frame built
  // (Source::Made) is not there to read: not captured.
  static OutSpec source_spec(const SourcePtr& src) {
    if (src && src->made_in_frame()) unsupported("an object built in the function is handed out of it: " + src->str());
    return OutSpec::from_source(src);
  }
  // dict.update(other) into the dict tracker `d`: a mapping, or an iterable of key-value pairs.
  void dict_merge(const VarPtr& d, const VarPtr& other);
  // items[slice] = values, or del items[slice] (values null), as list does; false where list
  // raises ValueError (an extended slice given another number of values).
  static bool replace_slice(std::vector<VarPtr>& items, PyObject* slice, const std::vector<VarPtr>* values);

  // zip / enumerate / reversed over values known at capture time: tuples of trackers.
  VarPtr iteration_builtin(PyObject* f, const std::vector<VarPtr>& args);

  static bool is_torch_internal(PyObject* f);
  static bool torch_optim_function(PyObject* f);  // defined in torch.optim's modules
  static PyObject* dynamo_disabled_torch_function(PyObject* f);

  VarPtr call_const(VarPtr fn, std::vector<VarPtr> args, KwArgs kwargs);
  // torch.div(16, 4, rounding_mode="trunc"): a pointwise registry op on Python numbers alone
  // (and 0-d tensors capture knows), run now; its 0-d result a known_tensor (nullptr: not such a call)
  VarPtr pointwise_of_numbers(PyObject* f, const OpBinding& b, const std::vector<VarPtr>& args, const KwArgs& kwargs);

  // The rule for this callee object, if call_rules.cpp has one that takes these arguments.
  VarPtr call_rule(const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs);

  // torch calls with an answer at capture time, and what it is
  enum class Known { False, True, None, Zero, NoOp, GradEnabled, Assert, StateQuery, AutocastQuery, Dropout, AsTensor,
                     Deterministic, DeterministicWarnOnly };
  static const std::unordered_map<PyObject*, Known>& known_torch_calls();
  VarPtr known_torch_call(Known k, PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs, bool any_tensor);

  // ---- grad mode and autocast (modes.cpp) ----
  // torch.no_grad(), torch.autocast(...), nullcontext() and friends: a Context tracker of the
  // modes it sets (nullptr: f is not one of them).
  VarPtr mode_context(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  // The modes a context-manager object made outside the function sets (`with self.ctx:`).
  ModeChange modes_of_object(PyObject* ctx);
  static bool is_autocast_object(PyObject* ctx);  // an object of torch.autocast or its amp spellings
  // Sets the modes `m` names for the ops captured from here on; returns the modes before.
  ModeChange enter_modes(const ModeChange& m);
  // A with block's exit (or set_grad_enabled's decorator call) putting back the modes `m`; a
  // mode a set_grad_enabled call left set for the caller is undone with it.
  void restore_modes(const ModeChange& m);
  ModeChange current_modes();
  // The autocast state inside torch.autocast(device, dtype, enabled) entered here.
  AutocastState autocast_region(const std::string& device, PyObject* dtype, bool enabled);
  // torch.is_autocast_enabled() and the autocast dtype queries, answered for where capture is.
  VarPtr autocast_query(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs);

  // Builtins applied to lists, tuples, dicts and iterators of trackers.
  VarPtr builtin_over_trackers(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs);

  // A method of a list, dict or set made during capture (no source: nobody else holds it): it
  // may change that object for real, which is the value the frame then holds.
  static bool private_container_method(PyObject* f);

  // Builtins and math functions whose result depends only on their arguments.
  bool pure_callable(PyObject* f);
  static bool is_enum_class(PyObject* o);  // an enum.Enum subclass (its metaclass is EnumMeta)
  static bool is_namedtuple_class(PyObject* f);
  PyObject* tuple_maker(PyObject* type);
  static Py_ssize_t namedtuple_field(PyObject* fields, const std::string& name);
  VarPtr make_namedtuple(PyObject* cls, const std::vector<VarPtr>& args, const KwArgs& kwargs);

  PyObject* builtin(const char* name);

  PyObject* resolve_torch(const std::string& attr);

  std::string callable_name(PyObject* f);

  VarPtr size_const(const sym::Expr& e);
  // The value of a size at capture. A symbolic one is specialized: the entry then holds only
  // for inputs where it has that value (a fact its guards check).
  int64_t concrete_size(const sym::Expr& e);
  void guard_hasattr(const VarPtr& obj, PyObject* name, bool present) { root()->out_.guards.add_hasattr(obj->source, name, present); }
  VarPtr make_slice(const VarPtr& start, const VarPtr& stop, const VarPtr& step);
  // A `full` node over `size` (ints, symbolic ints, or one tuple/list of them) when a size is
  // symbolic; nullptr otherwise (torch's factory then). `infer_dtype`: torch.full's rule (the
  // fill value's type); else the default float dtype. dtype/device: Python objects or nullptr.
  VarPtr full_node(const std::vector<VarPtr>& size, const VarPtr& value, bool infer_dtype, PyObject* dtype,
                   PyObject* device);
  VarPtr symint_binary(const std::string& base, const VarPtr& a, const VarPtr& b);
  VarPtr symint_compare(const std::string& op, const VarPtr& a, const VarPtr& b);
  VarPtr object_compare(const std::string& op, const VarPtr& a, const VarPtr& b);
  // Python arithmetic with a symbolic float (s * 2, 1 - s, s / 4): a graph node, still symbolic.
  // nullptr: not such an operation (the value is read instead, which specializes it).
  VarPtr symfloat_binary(const std::string& base, const VarPtr& a, const VarPtr& b);
  VarPtr symfloat_negative(const VarPtr& a);
  ir::Node* as_double(ir::Node* n);  // a float64 0-d tensor (not a wrapped number) of a number

  VarPtr shape_tuple(const ir::TensorMeta& m);

  VarPtr call_tensor_method(VarPtr self, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs);
  // Whether a tensor of `m` is contiguous in memory format `fmt` (torch.contiguous_format or
  // torch.channels_last, torch's rule); unsupported for other formats.
  bool in_memory_format(const ir::TensorMeta& m, PyObject* fmt);
  // `x` laid out in memory format `fmt` (torch.preserve_format: as it is): x itself where it
  // already is, else a copy (Tensor.contiguous(memory_format=...), Tensor.to(memory_format=...)).
  VarPtr in_layout(const VarPtr& x, PyObject* fmt);
  // x.split(k or sections, dim) / x.chunk(n, dim) as slices of x (nullptr: left to torch).
  VarPtr split_tensor(const VarPtr& x, bool chunk, const std::vector<VarPtr>& args, const KwArgs& kwargs);

  // ModuleDict and ParameterDict (and subclasses): containers whose iteration yields keys.
  // ModuleList, Sequential, ParameterList or a keyed container: what iterating a module walks.
  static bool is_container_module(PyObject* m);
  static bool is_keyed_container(PyObject* m);

  // Number of children of a container module, guarded.
  Py_ssize_t module_children(const VarPtr& mod);

  // The names of a container module's children (ModuleList, Sequential, ModuleDict,
  // ParameterList, ParameterDict: its parameters), in order, their count guarded; each read
  // through module_attr, so guarded, unless guard_children is false (the caller reads one).
  std::vector<std::string> module_keys(const VarPtr& mod, bool guard_children = true);

  // self.helper(x) on a module: the class's function, inlined with the module as self.
  VarPtr call_module_method(VarPtr mod, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs);
  VarPtr module_members(const VarPtr& mod, PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  // module.to(...) that converts nothing: the module itself; nullptr otherwise (modules.cpp).
  VarPtr module_to_no_op(const VarPtr& mod, PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs);

  VarPtr module_attr(const VarPtr& mod, const char* name);

  // A module call as nn.Module.__call__ makes it: forward pre-hooks, forward, forward hooks
  // (each inlined; the hook dicts are guarded, so adding or removing a hook recompiles).
  VarPtr call_module(VarPtr mod, std::vector<VarPtr> args, const KwArgs& kwargs);

  VarPtr call_module_body(VarPtr mod, std::vector<VarPtr> args, const KwArgs& kwargs);

  PyObject* resolve_torch_path(const std::string& path);

  // ---- attributes ----
  // ---- closures and functions made in the frame ----
  bool is_own_cell(int slot) const;

  // A free variable of a real closure (the root function's, or an inlined real function's).
  VarPtr read_free_var(const Instr& in);
  // A call of a function marked torch._dynamo.assume_constant_result, with constant
  // arguments: run now, its result a constant; nullptr for any other call.
  VarPtr assumed_constant_call(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  // locals() (and vars()) in this frame: a new dict of its bound locals, cells and free
  // variables by name, in the order CPython's snapshot has them. (Run at a graph break instead,
  // the call would read the locals of the frame that runs the break.)
  VarPtr frame_locals();

  // def / lambda / comprehension inside the frame. The real function object carries code,
  // globals and constant defaults; the cells stay trackers (their contents may be tensors).
  VarPtr make_function(const VarPtr& code, const VarPtr& defaults, const VarPtr& kwdefaults, const VarPtr& closure);

  void store_subscript(const VarPtr& container, const VarPtr& key, const VarPtr& value);

  // super() and super(cls, self): a real super object that remembers the receiver's tracker,
  // so that super().forward(x) inlines the base class's function with the same `self`.
  VarPtr make_super(const std::vector<VarPtr>& args);

  VarPtr super_attr(const VarPtr& sup, const std::string& name);

  VarPtr getattr(VarPtr base, const std::string& name);
  // object.__getattribute__(obj, name), as a class's own __getattribute__ calls it through
  // super(): the generic lookup, past the class's override (nullptr: not that call).
  VarPtr generic_getattr(PyObject* f, const VarPtr& obj, const std::vector<VarPtr>& args, const KwArgs& kwargs);

  // Methods of lists and tuples. A list only this frame can see changes in the trackers; one the
  // caller can see (a global, an argument) changes for real, so that call runs in Python.
  VarPtr call_sequence_method(const VarPtr& seq, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs);
  // A deque's own methods (appendleft, popleft, rotate, ...; maxlen respected); nullptr: the
  // method is a list's too.
  VarPtr call_deque_method(const VarPtr& dq, const std::string& name, const std::vector<VarPtr>& args, const KwArgs& kwargs);

  // ---- attribute stores on objects kiln does not track (attr_stores.cpp) ----
  // `obj.name = value` on a config, a module or a global object is logged, not done: later reads
  // in the capture see the logged value. A store the function undoes before it returns (the
  // try/finally that sets a flag and restores it) leaves nothing to do; one that leaves the
  // object changed becomes a StoreReplay, done for real after the graph ran (before the
  // instruction at a graph break), on the object re-read from its source.
  struct AttrStore {
    PyObject* obj;      // owned by keep_
    std::string name;
    VarPtr value;       // nullptr: deleted
    SourcePtr source;   // where the object was read from (nullptr: nowhere kiln can re-read)
    bool generic = false;  // object.__setattr__ (a class's own __setattr__ passed it on): replayed so
  };
  // obj.name = value (value nullptr: del). `generic`: object.__setattr__(obj, name, value), past
  // the class's own __setattr__ (which a plain store inlines where it is Python).
  void store_attr(const VarPtr& obj, const std::string& name, VarPtr value, bool generic = false);

  // The logged value of obj.name, if a store in this capture set it. `deleted`: a del did.
  const AttrStore* logged_attr(PyObject* obj, const std::string& name);

  // ---- the caller's lists and dicts changed in place (caller_containers.cpp) ----
  // A list or dict of the caller's (an argument, a module's or a cache's attribute) is one
  // tracker however capture reaches it (wrap: a second path is guarded to be the same object).
  // An update (append, d[k] = v, pop, del, +=, |=) changes the tracker, as for a container the
  // function made; the caller's object is given the tracker's final contents after the graph
  // ran (before the instruction at a graph break), as TorchDynamo's side effects are.
  void note_mutation(const VarPtr& container, const std::string& what);
  // Whether a dict subclass leaves `name` and its iteration to dict's (or OrderedDict's) own C
  // methods, which read its storage.
  static bool dict_storage_reads(PyTypeObject* type, const std::string& name);
  // The tracker a list or dict of the caller's already has, guarded to be that object at `src`.
  VarPtr known_container(PyObject* v, const SourcePtr& src);
  // A new tracker of no source holding what a list or dict tracker holds now (the items shared).
  static VarPtr contents_of(const VarPtr& c);
  // Gives `to` the contents `from` holds (a list's items, a dict's entries).
  static void set_contents(Var& to, const Var& from);
  // The replays that give each changed container of the caller's its contents.
  std::vector<StoreReplay> container_replays(bool at_break);

  // The stores among the first `upto` logged that leave their object changed, as replays
  // (values built by output_spec, or by break_spec at a graph break). Unsupported where an
  // object has no source to re-read it from.
  std::vector<StoreReplay> store_replays(size_t upto, bool at_break);

  // ---- dataclass instances made in the frame (records.cpp) ----
  // cls(...) of a dataclass with the generated __init__: a Record tracker of its fields. A
  // dataclass that is also a dict (transformers' ModelOutput protocol) maps its non-None fields,
  // in field order, and indexes like the tuple of them. nullptr: cls is not such a class.
  VarPtr make_record(PyObject* cls, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  VarPtr record_attr(const VarPtr& rec, const std::string& name);
  void record_store(const VarPtr& rec, PyObject* name, VarPtr value, bool item);
  VarPtr record_subscript(const VarPtr& rec, const VarPtr& key);
  VarPtr call_record_method(const VarPtr& rec, const std::string& name, const std::vector<VarPtr>& args,
                            const KwArgs& kwargs);
  OutSpec record_spec(const VarPtr& rec, bool at_break);

  // ---- private copies (copy.deepcopy of a config) ----
  // The copy of a Python object made at capture time (its source object pinned by identity):
  // nobody else holds it, so the capture uses it as a Python object of its own: its methods
  // run for real and stores on it are done for real. Only constants derived from it reach
  // the graph; handing the copy itself out ends the capture.
  VarPtr private_copy(PyObject* copier, const VarPtr& of);
  bool is_private(PyObject* o) { return root()->private_.count(o) > 0; }

  // torch.nn's own module classes built in the frame from constants (nn.Softmax(dim=-1), an
  // nn.Sequential of activations): built for real at capture, as every call would build them,
  // and tracked as a module with a Made source (modules.cpp). nullptr: not such a call. A
  // module that would own parameters or buffers (nn.Linear: a random draw per call) is not.
  VarPtr make_torch_module(PyObject* cls, const std::vector<VarPtr>& args, const KwArgs& kwargs);

  // ---- instances of plain user classes made in the frame (user_objects.cpp) ----
  // Why cls's instances are not plain Python objects kiln can model (nullptr: they are).
  static const char* plain_class_problem(PyObject* cls);
  // cls(...): a plain Record tracker, with cls.__init__ inlined on it. nullptr: not a plain class.
  VarPtr make_object(PyObject* cls, std::vector<VarPtr> args, const KwArgs& kwargs);
  // cls(...) of a user nn.Module subclass: made for real without its __init__, which is then
  // inlined on it (a private object: its stores are done at once). nullptr: not such a class.
  VarPtr make_user_module(PyObject* cls, std::vector<VarPtr> args, const KwArgs& kwargs);
  // What a module made during capture owns that eager makes afresh at every call (its
  // children's too): "parameters", "buffers", with `tensor_attributes` "tensors"; nullptr: none.
  static const char* fresh_state(PyObject* module, bool tensor_attributes);
  VarPtr object_attr(const VarPtr& rec, const std::string& name);
  VarPtr python_descriptor_get(PyObject* descriptor, const VarPtr& rec);
  VarPtr record_dict_view(const VarPtr& rec);
  static bool is_profiler_range(const VarPtr& ctx);
  static bool is_thread_lock(PyObject* o);
  static void fill_dict_view(const VarPtr& rec, const VarPtr& d);
  std::vector<std::pair<VarPtr, VarPtr>> dict_views_;  // the root's: (object made in the frame, its __dict__)
  bool object_has_attr(const VarPtr& rec, const std::string& name);
  // value nullptr: del; generic: object.__setattr__'s store, past the class's own __setattr__
  PyObject* frozen_record_object(const VarPtr& v, const char* what);
  void exact_result_dtype(const VarPtr& target, const VarPtr& result, const std::string& what);
  void object_store(const VarPtr& rec, const std::string& name, VarPtr value, bool generic = false);
  // type(obj).name(obj, *args) inlined, or nullptr when the class has no such method.
  VarPtr object_dunder(const VarPtr& obj, const char* name, std::vector<VarPtr> args);
  // The class whose Python dunders capture inlines for `v` (an object made in the frame by its
  // class's constructor, or a caller's object guarded by its structure), or nullptr.
  PyTypeObject* dunder_class(const VarPtr& v);
  // The same for any value whose class is `type`: nullptr also where the method is not a
  // Python function (a builtin's, called for real by the caller).
  VarPtr python_dunder(const VarPtr& self, PyTypeObject* type, const char* name, std::vector<VarPtr> args);
  OutSpec object_spec(const VarPtr& rec, bool at_break);

  // ---- in-place updates ----
  // An in-place op on a tensor only the graph can see is the out-of-place op whose result
  // every name of that tensor now holds: the tracker is shared by all its aliases (locals,
  // containers), so rebinding it updates them all. An input's update is written back after the
  // graph; an update through a view is scattered into its base (view_target).
  void check_inplace_target(const VarPtr& a, const std::string& what);
  // An input's own checks before an update of it (grad, expanded memory, memory shared with
  // another input); and for a view, the tracker of the tensor it views, or why it is refused
  // (operators.cpp).
  void check_input_update(const ir::Node* placeholder, const std::string& what);
  VarPtr view_target(const VarPtr& a, const std::string& what);
  // The one live tracker holding `base` (a fresh one where none does: nothing but views then
  // sees the tensor); refuses where several do.
  VarPtr tracker_of(ir::Node* base, const std::string& what);

  VarPtr mutate(const VarPtr& a, ir::Node* result);

  // ---- NumPy (numpy.cpp): arrays are graph nodes with NumPy's semantics ----
  // An np.ndarray or NumPy scalar read from the frame (nullptr: v is neither).
  VarPtr wrap_numpy(PyObject* v, SourcePtr src);
  VarPtr array_attr(const VarPtr& a, const std::string& name);
  VarPtr call_array_method(const VarPtr& a, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs);
  // A call of a NumPy function (or of torch.from_numpy and friends on an array); nullptr: fn is
  // none kiln maps.
  VarPtr numpy_call(const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs);
  // Python operators where an operand is an array: NumPy's dtype rules. `base`: "ADD", ...
  VarPtr array_binary(const std::string& base, bool inplace, const VarPtr& a, const VarPtr& b);
  VarPtr array_compare(const std::string& op, const VarPtr& a, const VarPtr& b);
  VarPtr array_unary(const std::string& op, const VarPtr& a);  // "neg", "pos", "invert", "abs"
  VarPtr array_subscript(const VarPtr& a, const VarPtr& key);
  void array_store_subscript(const VarPtr& a, const VarPtr& key, const VarPtr& value);
  VarPtr tensor_to_array(const VarPtr& t, const KwArgs& kwargs);  // t.numpy()
  PyObject* array_type(const VarPtr& a);  // type(a): np.ndarray, or the NumPy scalar type

  // ---- operators ----
  VarPtr binary(const std::string& nb, VarPtr a, VarPtr b);
  // a + b where an operand is an object made in the frame: its class's __add__ / __radd__ /
  // __iadd__, inlined (nullptr: neither operand is one).
  VarPtr object_operator(const std::string& base, bool inplace, const VarPtr& a, const VarPtr& b);

  VarPtr compare(const std::string& op, VarPtr a, VarPtr b);

  bool truth(const VarPtr& v);

  VarPtr positive(const VarPtr& a);  // unary +

  VarPtr subscript(VarPtr base, VarPtr index);

  // ---- graph breaks ----
  // Only the function kiln was asked to run breaks; a failure inside an inlined call surfaces
  // at the CALL of its outermost caller, which then runs that call in Python.
  static bool breakable(const Instr& in);

  // Whether normal control flow (exception handlers aside: 3.12 jumps back from a with
  // block's handler) can come back to instruction pc.
  // Per instruction: 1 where it falls through to the next one and lies on a loop (the next
  // instruction reaches it again).
  static std::vector<char> falls_into_loop(const CodeInfo& ci);
  // Which of the first `nlocals` locals some path from the instructions `from` reads before
  // storing them (liveness, exception handlers included).
  static std::vector<bool> live_locals(PyObject* code, const CodeInfo& ci, const std::vector<size_t>& from, int nlocals);

  struct Snapshot {
    std::vector<VarPtr> stack, locals;
    std::vector<std::string> kwnames;
    size_t attr_stores = 0;  // the root's log of attribute stores, as long as it was
    size_t checks = 0;       // the root's checks (checks_), as many as there were
    std::optional<ModeChange> modes_after;  // the root's out_.modes_after then (a set_grad_enabled call's)
    // the root's caller containers changed so far, each with a copy of its contents then
    std::vector<std::pair<VarPtr, VarPtr>> containers;
    std::vector<std::pair<size_t, ir::Node*>> mutations;  // input_mutations() then
    size_t guards = 0;  // the root's guards, as many as there were
  };

  // ---- branches on tensors whose other side raises (CaptureResult::checks) ----
  // POP_JUMP_IF_TRUE/FALSE on a one-element tensor: where exactly one side of the branch only
  // raises, the jump target or -1 (fall through) of the other side, the condition kept as a
  // check; else truth() refuses it.
  int tensor_jump(const VarPtr& cond, const Instr& in, const CodeInfo& ci, bool jump_if_true);
  // Makes the checks so far graph outputs (at the end of capture or at a break).
  void output_checks();
  std::vector<ir::Node*> checks_;  // the root's: bool nodes that must hold

  // ---- in-place updates of inputs (functionalized, written back) ----
  // The inputs an in-place op has changed so far: (input index, the node holding its value).
  std::vector<std::pair<size_t, ir::Node*>> input_mutations();
  // Makes those values graph outputs written back into their inputs after the graph, and
  // guards that no other input shares their memory. Outputs that are those values then
  // re-read the input (the caller's tensor, as eager hands it back).
  void write_back(const std::vector<std::pair<size_t, ir::Node*>>& mutations);

  // Trackers are shared and updated in place (in-place ops, list appends), so a snapshot copies
  // them, keeping aliases among them aliases.
  static VarPtr clone(const VarPtr& v, std::unordered_map<const Var*, VarPtr>& memo);

  Snapshot snapshot() const;

  // How the runtime rebuilds a value of the frame at a break. A mutable container tracked by
  // one tracker becomes one object, however many names and stack slots hold it.
  OutSpec break_spec(const VarPtr& v);

  OutSpec break_spec_of(const VarPtr& v);
  // A dict, list, set, bytearray or deque (or a subclass): a new object per call at a break.
  static bool mutable_container(PyObject* o);

  // Ends the capture at `in` with a graph break, if the frame can resume after it; false
  // leaves the original failure to end the capture (the whole call then runs eagerly).
  bool graph_break(const Instr& in, const CodeInfo& ci, size_t pc, const Snapshot& before, const std::string& why);

  // A dict of these entries (a dict made in the frame, an object's attributes), made anew.
  OutSpec dict_spec(const Entries& d, bool at_break);
  // A function made in the frame: itself, or for a closure, a new function per call around
  // cells of this call's values.
  OutSpec function_spec(const VarPtr& v, bool at_break);
  // A module handed out: the caller's, re-read from where the frame found it; one of torch.nn's
  // built in the frame from constants and not changed after, built again by the same call (one
  // object however often the program hands it out).
  OutSpec module_spec(const VarPtr& v);

  // x[...] with ints, slices, None and Ellipsis: a chain of select / slice / unsqueeze views.
  // Tensor and list indices (advanced indexing) are not captured yet.
  VarPtr index_tensor(const VarPtr& base, const VarPtr& index);

  // A torch operator with no registry entry: an extern `torch_call` node in the graph. Its
  // result's layout comes from running it on meta tensors now; the runtime calls it for real.
  // nullptr: `f` is a Python function whose result is not tensors (the caller inlines it).
  VarPtr torch_extern(PyObject* f, const std::string& name, const std::vector<VarPtr>& args, const KwArgs& kwargs);
  // Under autocast, a torch call kiln has no entry for: the cast torch's autocast makes for it,
  // found by running it on one-element tensors of each floating input's rank and device, once
  // in float32 and once in autocast's dtype (float32 in, 16-bit out: the lower precision; 16-bit
  // in, float32 out: float32; else none). nullopt where a probe raises or an input is not
  // floating (index tensors made of ones could be out of range).
  std::optional<ops::AutocastPolicy> probe_autocast(PyObject* f, PyObject* targs, PyObject* tkw,
                                                    const std::vector<ir::Node*>& inputs,
                                                    const std::vector<sym::Expr>& sym_args);
  // An in-place update kept out of place as a torch_call on `target` (its first tensor): the
  // operator's in-place form `inplace_fn` goes with it, for the executor to update an input
  // where it lies when nothing else reads its old value (passes::reinplace_input_updates).
  void offer_in_place(const VarPtr& result, const VarPtr& target, PyObject* inplace_fn);

  // ---- torch.optim (optimizers.cpp) ----
  // opt.step() of SGD / Adam / AdamW and opt.zero_grad(): their update math as graph nodes,
  // written back into the parameters and state. nullptr: `fn` is not such a method.
  VarPtr optimizer_method(const VarPtr& fn, std::vector<VarPtr>& args, KwArgs& kwargs);
  VarPtr optimizer_zero_grad(PyObject* self, const SourcePtr& self_src, std::vector<VarPtr>& args, KwArgs& kwargs);
  void optimizer_step(PyObject* self, const SourcePtr& self_src, bool sgd, bool adamw);
  // Each parameter of the optimizer's groups, the group list and each group's params guarded:
  // `on_group` (if any) for each group first, then `on_param` for each parameter whose .grad is
  // not None (a None is guarded and skipped, as eager skips it).
  void each_optimizer_param(PyObject* self, const SourcePtr& self_src,
                            const std::function<void(PyObject* group, const SourcePtr& group_src)>& on_group,
                            const std::function<void(PyObject* p, const SourcePtr& p_src, PyObject* grad,
                                                     const SourcePtr& grad_src)>& on_param);
  // `body` under no_grad (and, with `autocast_off`, outside autocast), the modes restored after.
  void without_grad(const std::function<void()>& body, bool autocast_off = true);
  // A Python float (or, `counter`, a 0-d CPU tensor's value) at `src`, read at each call: a
  // scalar_input node (one per source), its type guarded rather than its value.
  ir::Node* scalar_input(const SourcePtr& src, bool counter);
  ir::Node* counter_step(const SourcePtr& src);
  // torch.nn.utils.clip_grad_norm_: the gradients' norm and their in-place scaling, as nodes.
  VarPtr clip_grad_norm(std::vector<VarPtr>& args, KwArgs& kwargs);

  // The results' sizes and strides (each result's sizes then strides, in order) as expressions in
  // the size symbols of the inputs, found by probing the operator on meta tensors at other
  // values of the symbols (sym::fit_multilinear). nullopt: the inputs have no symbols, or the
  // layouts fit no polynomial; the symbols are then specialized to this call's sizes.
  using MakeMetas = std::function<bool(const std::function<int64_t(const sym::Expr&)>&, std::vector<PyObject*>&)>;
  using CallOnMetas = std::function<PyObject*(const std::vector<PyObject*>&)>;
  std::optional<std::vector<sym::Expr>> symbolic_layouts(const std::vector<ir::Node*>& inputs,
                                                         const std::vector<TensorInfo>& results,
                                                         const MakeMetas& make_metas, const CallOnMetas& call_on);

  // ---- output ----
  OutSpec output_spec(const VarPtr& v);
  OutSpec input_view_spec(const VarPtr& v, OutSpec base);  // operators.cpp

  // ---- the dispatch: one handler per opcode (opcodes.cpp) ----
  int step(const Instr& in, const CodeInfo& ci);
  using Handler = int (Interpreter::*)(const Instr& in, const CodeInfo& ci);
  static const std::array<Handler, OP_UNKNOWN + 1>& handlers();
  int op_nop(const Instr& in, const CodeInfo& ci);
  int op_make_cell(const Instr& in, const CodeInfo& ci);
  int op_load_closure(const Instr& in, const CodeInfo& ci);
  int op_load_fast(const Instr& in, const CodeInfo& ci);
  int op_store_fast(const Instr& in, const CodeInfo& ci);
  int op_load_deref(const Instr& in, const CodeInfo& ci);
  int op_store_deref(const Instr& in, const CodeInfo& ci);
  int op_delete_deref(const Instr& in, const CodeInfo& ci);
  int op_make_function(const Instr& in, const CodeInfo& ci);
  int op_return_generator(const Instr& in, const CodeInfo& ci);
  int op_yield_value(const Instr& in, const CodeInfo& ci);
  int op_get_yield_from_iter(const Instr& in, const CodeInfo& ci);
  int op_send(const Instr& in, const CodeInfo& ci);
  int op_end_send(const Instr& in, const CodeInfo& ci);
  int op_load_build_class(const Instr& in, const CodeInfo& ci);
  int op_before_with(const Instr& in, const CodeInfo& ci);
  int op_format_value(const Instr& in, const CodeInfo& ci);
  int op_build_string(const Instr& in, const CodeInfo& ci);
  int op_jump_if_true_or_pop(const Instr& in, const CodeInfo& ci);
  int op_unpack_ex(const Instr& in, const CodeInfo& ci);
  int op_store_subscr(const Instr& in, const CodeInfo& ci);
  int op_build_set(const Instr& in, const CodeInfo& ci);
  int op_set_add(const Instr& in, const CodeInfo& ci);
  int op_map_add(const Instr& in, const CodeInfo& ci);
  int op_load_assertion_error(const Instr& in, const CodeInfo& ci);
  int op_raise_varargs(const Instr& in, const CodeInfo& ci);
  int op_store_attr(const Instr& in, const CodeInfo& ci);
  int op_delete_attr(const Instr& in, const CodeInfo& ci);
  int op_import_name(const Instr& in, const CodeInfo& ci);
  int op_import_from(const Instr& in, const CodeInfo& ci);
  int op_store_slice(const Instr& in, const CodeInfo& ci);
  int op_delete_subscr(const Instr& in, const CodeInfo& ci);
  int op_delete_fast(const Instr& in, const CodeInfo& ci);
  int op_load_const(const Instr& in, const CodeInfo& ci);
  int op_return_const(const Instr& in, const CodeInfo& ci);
  int op_return_value(const Instr& in, const CodeInfo& ci);
  int op_push_null(const Instr& in, const CodeInfo& ci);
  int op_load_global(const Instr& in, const CodeInfo& ci);
  int op_store_global(const Instr& in, const CodeInfo& ci);
  int op_load_attr(const Instr& in, const CodeInfo& ci);
  int op_kw_names(const Instr& in, const CodeInfo& ci);
  int op_call(const Instr& in, const CodeInfo& ci);
  int op_load_super_attr(const Instr& in, const CodeInfo& ci);
  int op_build_map(const Instr& in, const CodeInfo& ci);
  int op_build_const_key_map(const Instr& in, const CodeInfo& ci);
  int op_dict_merge(const Instr& in, const CodeInfo& ci);
  int op_call_function_ex(const Instr& in, const CodeInfo& ci);
  int op_binary_op(const Instr& in, const CodeInfo& ci);
  int op_compare_op(const Instr& in, const CodeInfo& ci);
  int op_is_op(const Instr& in, const CodeInfo& ci);
  int op_contains_op(const Instr& in, const CodeInfo& ci);
  int op_unary_negative(const Instr& in, const CodeInfo& ci);
  int op_unary_positive(const Instr& in, const CodeInfo& ci);
  int op_unary_not(const Instr& in, const CodeInfo& ci);
  int op_unary_invert(const Instr& in, const CodeInfo& ci);
  int op_call_intrinsic_1(const Instr& in, const CodeInfo& ci);
  int op_build_tuple(const Instr& in, const CodeInfo& ci);
  int op_list_extend(const Instr& in, const CodeInfo& ci);
  int op_list_append(const Instr& in, const CodeInfo& ci);
  int op_list_to_tuple(const Instr& in, const CodeInfo& ci);
  int op_unpack_sequence(const Instr& in, const CodeInfo& ci);
  int op_binary_subscr(const Instr& in, const CodeInfo& ci);
  int op_build_slice(const Instr& in, const CodeInfo& ci);
  int op_binary_slice(const Instr& in, const CodeInfo& ci);
  int op_pop_top(const Instr& in, const CodeInfo& ci);
  int op_copy(const Instr& in, const CodeInfo& ci);
  int op_swap(const Instr& in, const CodeInfo& ci);
  int op_pop_jump_if_false(const Instr& in, const CodeInfo& ci);
  int op_pop_jump_if_true(const Instr& in, const CodeInfo& ci);
  int op_pop_jump_if_none(const Instr& in, const CodeInfo& ci);
  int op_pop_jump_if_not_none(const Instr& in, const CodeInfo& ci);
  int op_get_iter(const Instr& in, const CodeInfo& ci);
  int op_for_iter(const Instr& in, const CodeInfo& ci);
  int op_end_for(const Instr& in, const CodeInfo& ci);
  int op_jump_forward(const Instr& in, const CodeInfo& ci);
  int op_push_exc_info(const Instr& in, const CodeInfo& ci);
  int op_check_exc_match(const Instr& in, const CodeInfo& ci);
  int op_pop_except(const Instr& in, const CodeInfo& ci);
  int op_reraise(const Instr& in, const CodeInfo& ci);
  int op_with_except_start(const Instr& in, const CodeInfo& ci);

  PyObject* fn_;
  CaptureResult& out_;
  PyObject* code_;
  PyObject* globals_;
  PyObject* builtins_;
  ir::Graph* g_;
  std::string filename_;
  std::vector<VarPtr> locals_;
  std::vector<VarPtr> stack_;
  std::vector<std::string> kwnames_;
  std::vector<PyObject*> keep_;
  int current_line_ = 0;
  size_t steps_ = 0;
  Interpreter* parent_ = nullptr;
  SourcePtr fn_source_;   // where the inlined function came from (closure cells are read through it)
  int depth_ = 0;
  VarPtr return_value_;
  std::vector<VarPtr> handling_;  // exceptions being handled (PUSH_EXC_INFO / POP_EXCEPT), innermost last
  // Raises `exc` (an exception instance) from the captured code.
  [[noreturn]] void raise(PyObject* exc);
  // Raises a new `type(*args)` (args: a tuple, or one str argument), as eager's operation would.
  [[noreturn]] void raise_new(PyObject* type, PyObject* args);
  [[noreturn]] void raise_new(PyObject* type, const std::string& message);
  // The exception being handled here or in a calling frame (sys.exc_info's), or nullptr.
  PyObject* handled_exception();
  std::vector<VarPtr> yields_;        // a generator's values, produced all at once
  // A @contextmanager generator's frame (GeneratorContext): it stops at each yield (run_frame
  // returns the yielded value with `yielded_` set) and goes on from `resume_pc_`.
  bool stops_at_yield_ = false;
  bool yielded_ = false;
  size_t resume_pc_ = 0;
  PyObject* thrown_ = nullptr;  // raised at the yield it stopped at when it goes on (gen.throw)
  friend struct GeneratorContext;
  // break_spec's tracker (or, for a container copied from capture's object, that object) -> object ids
  std::unordered_map<const void*, int> break_memo_;
  std::unordered_set<const Var*> building_;  // root: objects whose spec is being built (cycles)
  std::unordered_set<PyObject*> private_;  // root: private copies (kept alive by keep_)
  bool symbolic_outputs_ = false;  // root: an Int spec hands out a symbolic int
 public:
  // Where the runtime reads each size symbol (CaptureResult::symbol_sources), when a symbolic
  // int is handed out.
  void locate_symbols();

 private:
  std::vector<VarPtr> input_vars_;      // root: per graph input, the one tracker all reads of its source share
  std::vector<std::weak_ptr<Var>> view_vars_;  // root: trackers made holding a view (retake_views)
  // root: the trackers made holding each node that is no view, or rebound to it by an update
  // (tracker_of); a tracker here may since hold another node
  std::unordered_map<const ir::Node*, std::vector<std::weak_ptr<Var>>> trackers_;
  // After an in-place op replaced `old` by the node `a` now holds: every live tracker of a
  // view of `old` takes its view again from the new node, as eager's views see the update.
  void retake_views(const ir::Node* old, const VarPtr& a);
  void retake(const VarPtr& v, const ir::Node* old_base, ir::Node* new_base);  // v's view, from new_base
  VarPtr rng_seed_;                     // root: the seed input, once a draw needs it
  int64_t rng_draws_ = 0;               // root: random draws so far (each gets its own counters)
  std::vector<PyObject*> input_objects_;  // root: per graph input, the tensor at capture (kept alive by keep_)
  // root: the user objects guarded by structure (wrap), each tracker with its object (kept alive
  // by keep_): one object met again by another path is the same tracker.
  std::unordered_map<PyObject*, VarPtr> structured_;
  std::unordered_map<const ir::Node*, size_t> written_back_;  // root: final value of a mutated input -> input
  std::unordered_map<const ir::Node*, PyObject*> tensor_keys_;  // root: key_obj's objects (owned by keep_)
  std::vector<VarPtr> hashed_inputs_;  // root: tensors read from the frame that key_obj hashed (guarded distinct)
  std::unordered_map<PyObject*, VarPtr> key_tensors_;           // root: and the tensors they stand for
  std::unordered_map<PyObject*, VarPtr> input_keys_;  // root: input tensors used as keys, and their trackers
  std::unordered_map<const ir::Node*, PyObject*> known_values_;  // root: known_tensor's values (owned by keep_)
  bool grad_mode_ = true;             // root: torch.is_grad_enabled() where capture is
  AutocastState autocast_;            // root: torch.autocast's state where capture is
  bool global_hooks_checked_ = false; // root: the global module hook dicts are guarded
  std::unordered_set<const ir::Node*> needs_grad_;  // root: nodes autograd would track
  std::vector<AttrStore> attr_stores_;  // root: the attribute-store log, in program order
  std::unordered_map<PyObject*, VarPtr> containers_;  // root: caller's list or dict -> its tracker (kept by keep_)
  std::vector<VarPtr> mutated_;  // root: those of them changed so far, in the order first changed
  std::vector<VarPtr> replayed_contents_;  // root: container_replays' trackers of their contents
  std::unordered_set<PyObject*> wrapping_;  // root: containers wrap is reading the items of
  bool module_state_ = false;  // root: wrap is reading a module's attribute (static under dynamic=True)
  // root: each torch.nn module built in the frame from constants alone -> its constructor call
  // (functools.partial of its class, owned by keep_), which builds it again where it is handed out
  std::unordered_map<PyObject*, PyObject*> module_makers_;
  std::unordered_map<std::string, ir::Node*> scalar_input_nodes_;  // root: scalar_input node by its source
  const DynamicDims* dynamic_ = nullptr;  // root: which input dims get size symbols
  std::vector<std::pair<int64_t, sym::Expr>> duck_;  // root: size -> its symbol (equal sizes share one)

  // Symbolic sizes for the dims of a tensor input the policy makes dynamic: fills meta's sizes
  // and strides and the guard's symbol indices. Only for dense layouts (strides are then
  // products of sizes); other inputs stay static.
  void symbolic_sizes(PyObject* v, const Source& src, TensorInfo& info, ir::TensorMeta& m);
  // A Python int argument as a size symbol (dynamic=True, or automatic dynamic after it changed),
  // or nullptr: guarded by value as any constant.
  // Whether the policy makes a Python number at `src` dynamic: an argument under dynamic=True,
  // or a value that changed between calls under automatic dynamic.
  bool dynamic_scalar(const Source& src) const;
  VarPtr symbolic_int(PyObject* v, const SourcePtr& src);
  // A Python float argument or attribute as a scalar_input node (dynamic=True, or automatic
  // dynamic after its value changed), or nullptr: guarded by value as any constant.
  VarPtr symbolic_float(PyObject* v, const SourcePtr& src);
  std::unordered_map<const ir::Node*, PyObject*> symfloat_values_;  // root: a float's scalar_input -> its value now

 public:
  ~Interpreter() {
    for (PyObject* o : keep_) Py_DECREF(o);
  }};

// The generator of a @contextlib.contextmanager function, interpreted into the graph: run to its
// yield when its with block is entered and on to its end at the block's exit. The frame outlives
// the call that made it (a helper may return the context manager), so it is re-parented to the
// frame that steps it.
struct GeneratorContext {
  std::unique_ptr<Interpreter> frame;
  bool entered = false;
  // What made it, to make another (a decorator's fresh manager per call)
  PyObject* gen = nullptr;  // the generator function (kept by the root interpreter)
  std::vector<VarPtr> cells, args;
  bool has_cells = false;
  std::vector<std::pair<std::string, VarPtr>> kwargs;
  // Runs the frame from where it stopped under `by`; the value it yielded or returned.
  VarPtr step(Interpreter* by) {
    frame->parent_ = by;
    frame->yielded_ = false;
    return frame->run_frame();
  }
  // gen.throw(exc): the exception raised at the yield the frame stopped at; the value it
  // yields or returns after handling it (a Raised propagates where it does not).
  VarPtr throw_in(Interpreter* by, PyObject* exc) {
    frame->thrown_ = exc;
    return step(by);
  }
  bool yielded() const { return frame->yielded_; }
};

}  // namespace kiln::bind::detail
