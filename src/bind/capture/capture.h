// Capture: a symbolic interpreter over a function's CPython bytecode (3.11, 3.12) that
// records its tensor computation as a graph, plus the guards under which that graph holds.
//
// The interpreter walks instructions with a stack of value trackers (variables.h). Tensor
// operations become graph nodes through the op registry; Python values known at capture time
// are evaluated for real and guarded. What it cannot follow ends the capture with a reason and
// a source location; the caller then runs that code eagerly.
#pragma once
#include <Python.h>

#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bind/capture/variables.h"
#include "bind/guards/guards.h"
#include "core/ir/graph.h"

namespace kiln::bind {

// How the compiled function rebuilds a Python value after its graph ran: the return value,
// and at a graph break every value on the stack and in the locals.
struct OutSpec {
  enum class Kind {
    Graph,    // a graph output
    Const,    // a value fixed at capture time (immutable, or the very object guards pin)
    Copy,     // a mutable container made during capture: a fresh shallow copy per call
    Source,   // re-read from the frame (keeps the caller's object identity: lists, modules)
    Tuple,
    List,
    Dict,     // value: the keys (a tuple); items: the values
    Method,   // getattr(items[0], value): a bound method
    Null,     // the NULL of CALL's calling convention (stack only)
    Unbound,  // a local not assigned yet (locals only)
    Construct,  // value(**items[0]): a dataclass instance made anew (items[0] is a Dict spec)
    Bound,      // value (a function or C method) bound to items[0]: a method reached through super()
    Closure,    // a copy of the function `value` with new closure cells holding items (Unbound: empty)
    Int,        // the symbolic int `expr`, evaluated with this call's sizes (a counter stored back)
    Object,     // object.__new__(value), its __dict__ updated from items[0] (a Dict spec): an
                // instance of a plain class made during capture, without running __init__ again
    MakeDict,   // value[0](*value[1:], items[0]): an OrderedDict or defaultdict (value holds the
                // class, and a defaultdict's factory) of the dict items[0] (a Dict spec)
    Array,        // graph output `index` as an ndarray over its memory (Tensor.numpy())
    NumpyScalar,  // graph output `index` (0-d) as a NumPy scalar: Tensor.numpy()[()]
    ModeExit,     // value = (restore, enter), two mode setters (mode_setter.h): enter is called,
                  // restore handed out: a with block's __exit__ at a graph break inside it
  } kind = Kind::Const;
  int index = 0;                 // Graph: which graph output
  int memo = -1;                 // at a break: values one tracker stands for are one object
  PyObject* value = nullptr;     // Const / Copy: the object; Method: the name; Tuple: a structseq
                                 // type to build instead of a plain tuple, or nullptr (owned)
  std::vector<OutSpec> items;    // Tuple / List; Method: the receiver
  SourcePtr source;              // Source
  sym::Expr expr;                // Int
  OutSpec() = default;
  // The value re-read from the frame: the caller's own container, unchanged.
  static OutSpec from_source(SourcePtr src) {
    OutSpec s;
    s.kind = Kind::Source;
    s.source = std::move(src);
    return s;
  }
  OutSpec(const OutSpec& o)
      : kind(o.kind), index(o.index), memo(o.memo), value(o.value), items(o.items), source(o.source), expr(o.expr) {
    Py_XINCREF(value);
  }
  OutSpec& operator=(const OutSpec& o) {
    if (this != &o) {
      Py_XINCREF(o.value);
      Py_XDECREF(value);
      kind = o.kind, index = o.index, memo = o.memo, value = o.value, items = o.items, source = o.source, expr = o.expr;
    }
    return *this;
  }
  ~OutSpec() {
    if (Py_IsInitialized()) Py_XDECREF(value);
  }
};

// A graph break: the instruction kiln hands back to Python, and how the function goes on.
// The graph computes everything before it; then the runtime rebuilds the frame's values,
// runs the instruction for real and calls a resume function (resume.h) with the result.
struct GraphBreak {
  enum class Kind {
    Call,  // CALL kiln could not capture: call it for real, push its result, resume after it
    Jump,  // a conditional jump on a tensor: bool() it for real, resume at the branch taken
    // One instruction run for real by the runtime, then resume after it:
    Subscr,       // container[key] (BINARY_SUBSCR; BINARY_SLICE with a slice built here)
    StoreSubscr,  // container[key] = value (STORE_SUBSCR; STORE_SLICE)
    DeleteSubscr, // del container[key]
    StoreAttr,    // obj.name = value
    BinaryOp,     // a (op) b, in-place forms included
  } kind = Kind::Call;
  std::string reason;
  std::string location;
  std::vector<OutSpec> stack;    // the stack under the instruction's operands, bottom first
  std::vector<OutSpec> locals;   // one per co_varnames entry
  std::vector<OutSpec> operands; // the instruction's operands as on the stack, bottom first
  std::vector<OutSpec> cells;    // the values of the cells the resume function takes (ResumeShape::cells)
  PyObject* kwnames = nullptr;   // Call: keyword names (owned tuple) or nullptr
  PyObject* name = nullptr;      // StoreAttr: the attribute name (owned)
  std::string binary_op;         // BinaryOp: dis's name of the operator, "NB_INPLACE_ADD"
  bool jump_if_true = false;     // Jump: the jump is taken when bool(condition) == jump_if_true
  int memo_slots = 0;            // OutSpec::memo ids in use
  // Resume functions (owned): Call: [after]; Jump: [fall through, jump target].
  std::vector<PyObject*> resume;
  GraphBreak() = default;
  GraphBreak(const GraphBreak&) = delete;
  GraphBreak& operator=(const GraphBreak&) = delete;
  ~GraphBreak() {
    if (!Py_IsInitialized()) return;
    Py_XDECREF(kwnames);
    Py_XDECREF(name);
    for (PyObject* f : resume) Py_XDECREF(f);
  }
};

// An attribute store the captured code leaves done: setattr(object at `object`, name, value)
// (delattr when value is Unbound), after the graph ran and before the output is built. With
// `contents`, the object is a list or dict of the caller's that the code changed, and `value`
// its new contents (a list or dict) to put in it: l[:] = value, or d.clear(); d.update(value).
struct StoreReplay {
  SourcePtr object;
  std::string name;
  OutSpec value;
  bool contents = false;
  bool generic = false;  // object.__setattr__: past the class's own __setattr__, which capture ran
};

struct CaptureResult {
  bool ok = false;
  std::string reason;            // why capture stopped (when !ok)
  std::string location;          // "file.py:12" of the instruction it stopped at
  std::unique_ptr<ir::Graph> graph;
  std::vector<SourcePtr> input_sources;  // one per graph placeholder
  std::vector<SourcePtr> scalar_sources;  // one per Graph::scalar_symbols entry (a Python int)
  // One per Graph::scalar_inputs entry, read at every call: a Python float at `source`, or
  // (`counter`) the value of a 0-d CPU tensor there, an optimizer's step count, which the
  // runtime increments by one after the graph ran, as the optimizer's step does.
  struct ScalarInput {
    SourcePtr source;
    int counter = 0;  // a counter: the steps the graph takes (optimizer steps in one call), added after it
  };
  std::vector<ScalarInput> scalar_inputs;
  bool dynamic_floats = false;  // some are Python floats made dynamic (Interpreter::symbolic_float)
  // Where each guard symbol's value is read at run time, for symbolic ints handed out (Int
  // specs): an input's dim, or a scalar source. Empty when no spec needs them.
  struct SymbolSource {
    int input = -1, dim = 0;  // graph input and dim, or
    int scalar = -1;          // index into scalar_sources, or
    int64_t fixed = -1;       // the value a specialized symbol has
  };
  std::vector<SymbolSource> symbol_sources;
  GuardSet guards;
  OutSpec output;                // the return value, unless the capture ends in a break
  int output_memo_slots = 0;     // OutSpec::memo ids in output and replays (one object each)
  // Inputs the captured code updates in place: (input index, graph output) pairs; the runtime
  // copies each output into its input after the graph ran, before anything else sees them.
  std::vector<std::pair<int, int>> writebacks;
  std::vector<StoreReplay> replays;  // attribute stores to do after the graph, in program order
  // Branches on a tensor whose other side only raises (`assert (x > 0).all()`, a validation's
  // `if not ok: raise ValueError(...)`), captured as the side the call took: graph outputs, one
  // bool each, that must be true. Where one is false the call runs again eagerly, which raises
  // eager's error; capture keeps going past them instead of breaking the graph.
  std::vector<int> checks;
  // Grad mode and autocast as the function leaves them, where it left a with block a graph break
  // had entered for real (it called a mode setter, mode_setter.h): set before the graph runs.
  std::optional<ModeChange> modes_after;
  std::unique_ptr<GraphBreak> graph_break;
  std::string captured_text;     // the graph as captured, before any pass
  // An output autograd tracks (an input requires grad, grad mode is on): the entry also gets a
  // backward program. `tracked`: the nodes autograd would record (the eager backend runs the
  // others with grad mode off, as eager did).
  bool needs_backward = false;
  std::set<const ir::Node*> tracked;
  // Graph outputs that are `x.detach()` (or a view of it) of an input that requires grad: the
  // program hands back the input's memory, the runtime a tensor outside autograd over it.
  std::vector<int> detached_outputs;
  // Graph outputs through x.data: handed out as x.data is, a tensor with a version counter of its
  // own (an in-place update of it is not counted in x's version, as autograd's checks expect)
  std::vector<int> data_outputs;
};

// Which tensor dims capture makes symbolic (dynamic shapes). torch's own marks on a tensor
// (torch._dynamo.mark_dynamic / maybe_mark_dynamic / mark_static) are read as well.
struct DynamicDims {
  bool all = false;   // dynamic=True: every dim of size 2 or more
  bool none = false;  // no symbols at all, marked dims included (a shape-generic capture failed)
  // Automatic dynamic: dims of the inputs (by source) whose size changed between calls.
  std::map<std::string, std::set<int64_t>> by_source;
  bool empty() const { return !all && by_source.empty(); }
};

// The arguments of one call, bound to the code's parameters (positional, keyword, defaults).
struct BoundArgs {
  std::vector<PyObject*> locals;  // borrowed; one per parameter slot, then nullptr for the rest
  std::vector<std::string> names;
  // Parameters holding containers no one else holds (a resume function's lists and dicts,
  // rebuilt for it at the break): capture may change them like locals of its own.
  const std::vector<bool>* private_slots = nullptr;
  // What guard checks read from sources, reused by the input fetch of the same call.
  SourceMemo* memo = nullptr;
  // The inputs of the entry selected for this call, read by its guards' walk (guard_tree.h);
  // empty when its guards were checked one by one.
  FetchedValues* fetched = nullptr;
  // Dims to capture with symbolic sizes (nullptr: none, unless a tensor is marked dynamic).
  const DynamicDims* dynamic = nullptr;
};

// Binds args/kwargs to `fn`'s parameters like CPython does. False with a Python error set
// when the call itself is invalid (the caller then lets CPython raise it).
bool bind_arguments(PyObject* fn, PyObject* const* args, size_t nargs, PyObject* kwnames, BoundArgs& out,
                    std::vector<PyObject*>& owned);

// Captures a call of `fn` (a Python function; for a module, its forward with `self` bound
// first) with these bound arguments.
CaptureResult capture(PyObject* fn, const BoundArgs& args);

}  // namespace kiln::bind
