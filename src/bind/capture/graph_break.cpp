#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"
#include "bind/capture/mode_setter.h"
#include "bind/capture/resume.h"
#include "bind/capture/torch_call.h"
#include "bind/runtime/compiled_function.h"
#include "bind/torch/tensor_bridge.h"

namespace kiln::bind::detail {

bool Interpreter::breakable(const Instr& in) {
  switch (in.op) {
    case OP_BINARY_SUBSCR:
    case OP_BINARY_SLICE:
    case OP_STORE_SUBSCR:
    case OP_STORE_SLICE:
    case OP_DELETE_SUBSCR:
    case OP_STORE_ATTR:
    case OP_BINARY_OP:
    case OP_CALL:
    case OP_POP_JUMP_IF_FALSE:
    case OP_POP_JUMP_IF_TRUE:
    case OP_POP_JUMP_FORWARD_IF_FALSE:
    case OP_POP_JUMP_FORWARD_IF_TRUE: return true;
    default: return false;
  }
}

std::vector<char> Interpreter::falls_into_loop(const CodeInfo& ci) {
  // Strongly connected components of the control flow (Tarjan's algorithm, iterative): an
  // instruction that falls through to the next one is on a loop exactly when both share a
  // component. Linear in the code's length.
  const size_t n = ci.instrs.size();
  std::vector<std::vector<size_t>> succ(n);
  std::vector<char> falls(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const std::string& name = ci.opnames[i];
    const Instr& x = ci.instrs[i];
    const bool jumps = name.find("JUMP") != std::string::npos || name == "FOR_ITER";
    if (jumps && x.jump_target >= 0)
      if (auto t = ci.by_offset.find(x.jump_target); t != ci.by_offset.end()) succ[i].push_back(t->second);
    const bool ends = name == "JUMP_FORWARD" || name == "JUMP_BACKWARD" || name == "JUMP_BACKWARD_NO_INTERRUPT" ||
                      name == "RETURN_VALUE" || name == "RETURN_CONST" || name == "RAISE_VARARGS" || name == "RERAISE";
    if (!ends && i + 1 < n) succ[i].push_back(i + 1), falls[i] = 1;
  }
  constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> index(n, kNone), low(n, 0), comp(n, kNone), stack;
  std::vector<char> on_stack(n, 0);
  std::vector<std::pair<size_t, size_t>> work;  // (instruction, next successor to visit)
  size_t next_index = 0, components = 0;
  for (size_t root = 0; root < n; ++root) {
    if (index[root] != kNone) continue;
    work.emplace_back(root, 0);
    while (!work.empty()) {
      auto& [v, k] = work.back();
      if (k == 0 && index[v] == kNone) {
        index[v] = low[v] = next_index++;
        stack.push_back(v);
        on_stack[v] = 1;
      }
      if (k < succ[v].size()) {
        const size_t w = succ[v][k++];
        if (index[w] == kNone) work.emplace_back(w, 0);
        else if (on_stack[w]) low[v] = std::min(low[v], index[w]);
        continue;
      }
      if (low[v] == index[v]) {
        for (size_t w = kNone; w != v;) {
          w = stack.back();
          stack.pop_back();
          on_stack[w] = 0;
          comp[w] = components;
        }
        ++components;
      }
      const size_t done = v;
      work.pop_back();
      if (!work.empty()) low[work.back().first] = std::min(low[work.back().first], low[done]);
    }
  }
  std::vector<char> looped(n, 0);
  for (size_t i = 0; i + 1 < n; ++i) looped[i] = falls[i] && comp[i] == comp[i + 1];
  return looped;
}

std::vector<bool> Interpreter::live_locals(PyObject* code, const CodeInfo& ci, const std::vector<size_t>& from, int nlocals) {
  // Backward dataflow over the instructions: a local is live where some path reads it (a load,
  // a del, a cell operation) before storing it. Successors: the next instruction unless the
  // instruction ends the block, its jump target, and the handler of the try block it is in.
  const size_t n = ci.instrs.size();
  std::vector<std::vector<size_t>> succ(n);
  std::vector<int> use(n, -1), def(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const std::string& name = ci.opnames[i];
    const Instr& x = ci.instrs[i];
    const bool ends = name == "RETURN_VALUE" || name == "RETURN_CONST" || name == "RAISE_VARARGS" || name == "RERAISE" ||
                      name == "JUMP_FORWARD" || name == "JUMP_BACKWARD" || name == "JUMP_BACKWARD_NO_INTERRUPT" ||
                      name == "JUMP";
    if (!ends && i + 1 < n) succ[i].push_back(i + 1);
    // (jump_target holds any integer argument: only jumps branch there)
    const bool jumps = name.find("JUMP") != std::string::npos || name == "FOR_ITER" || name == "SEND";
    if (jumps && x.jump_target >= 0)
      if (auto t = ci.by_offset.find(x.jump_target); t != ci.by_offset.end()) succ[i].push_back(t->second);
    ExceptionHandler h = exception_handler(code, x.offset);
    if (h.target >= 0)
      if (auto t = ci.by_offset.find(h.target); t != ci.by_offset.end()) succ[i].push_back(t->second);
    if (x.arg >= 0 && x.arg < nlocals) {
      if (name == "STORE_FAST") def[i] = x.arg;
      else if (name.find("FAST") != std::string::npos || name.find("DEREF") != std::string::npos ||
               name == "LOAD_CLOSURE" || name == "MAKE_CELL")
        use[i] = x.arg;
    }
  }
  std::vector<std::vector<bool>> live(n, std::vector<bool>(static_cast<size_t>(nlocals), false));
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = n; i-- > 0;) {
      std::vector<bool> in(static_cast<size_t>(nlocals), false);
      for (size_t s : succ[i])
        for (int l = 0; l < nlocals; ++l) in[l] = in[l] || live[s][l];
      if (def[i] >= 0) in[def[i]] = false;
      if (use[i] >= 0) in[use[i]] = true;
      if (in != live[i]) live[i] = std::move(in), changed = true;
    }
  }
  std::vector<bool> out(static_cast<size_t>(nlocals), false);
  for (size_t f : from)
    for (int l = 0; f < n && l < nlocals; ++l) out[l] = out[l] || live[f][l];
  return out;
}

VarPtr Interpreter::clone(const VarPtr& v, std::unordered_map<const Var*, VarPtr>& memo) {
  if (!v) return v;
  switch (v->kind()) {
    case Var::Kind::Const:
    case Var::Kind::Module:
    case Var::Kind::Function:
    case Var::Kind::Null: return v;
    default: break;
  }
  auto it = memo.find(v.get());
  if (it != memo.end()) return it->second;
  auto c = std::make_shared<Var>(NullV{}, v->source);
  memo[v.get()] = c;
  auto cl = [&](VarPtr& x) { x = clone(x, memo); };
  std::visit(
      [&](const auto& d) {
        using T = std::decay_t<decltype(d)>;
        T n = d;  // Python objects are owned anew by the copy, trackers in it are cloned
        if constexpr (std::is_same_v<T, ConstV>) Py_XINCREF(n.value), cl(n.super_self);
        if constexpr (std::is_same_v<T, ModuleV>) Py_XINCREF(n.module);
        if constexpr (std::is_same_v<T, FunctionV>) Py_XINCREF(n.fn);
        if constexpr (std::is_same_v<T, TupleV>) Py_XINCREF(n.structseq);
        if constexpr (std::is_same_v<T, TupleV> || std::is_same_v<T, ListV>)
          for (VarPtr& x : n.items) cl(x);
        if constexpr (std::is_same_v<T, IteratorV>)
          if (n.list) {  // a list's iterator: over the cloned list, at the same index
            cl(n.list);
            n.all = std::make_shared<const std::vector<VarPtr>>(n.list->seq());
          } else if (!n.immutable) {  // the items left, cloned; constants stay shared
            n.remake = nullptr;  // (an enumerate/zip over lists: what is left of it, as it is now)
            std::vector<VarPtr> left = n.left();
            for (VarPtr& x : left) cl(x);
            n.all = std::make_shared<const std::vector<VarPtr>>(std::move(left));
            n.next = 0;
          }
        if constexpr (std::is_same_v<T, ListV>)
          if (n.view) cl(n.view->dict);
        if constexpr (std::is_same_v<T, IteratorV>)
          if (n.returned) cl(n.returned);
        if constexpr (std::is_same_v<T, MethodV>) Py_XINCREF(n.fn), cl(n.self);
        if constexpr (std::is_same_v<T, CellV>) cl(n.content);
        if constexpr (std::is_same_v<T, RecordV>) Py_XINCREF(n.cls);
        if constexpr (std::is_same_v<T, DictV>) Py_XINCREF(n.cls), Py_XINCREF(n.factory), cl(n.made_factory);
        if constexpr (std::is_base_of_v<Entries, T>) {
          for (PyObject* k : n.keys) Py_INCREF(k);
          for (VarPtr& x : n.values) cl(x);
        }
        c->data = std::move(n);
      },
      v->data);
  return c;
}

Interpreter::Snapshot Interpreter::snapshot() const {
  Snapshot s;
  std::unordered_map<const Var*, VarPtr> memo;
  for (const VarPtr& v : stack_) s.stack.push_back(clone(v, memo));
  for (const VarPtr& v : locals_) s.locals.push_back(clone(v, memo));
  s.kwnames = kwnames_;
  s.attr_stores = parent_ ? 0 : attr_stores_.size();
  s.checks = parent_ ? 0 : checks_.size();
  if (!parent_) s.modes_after = out_.modes_after;
  if (!parent_)
    for (const VarPtr& c : mutated_) s.containers.emplace_back(c, contents_of(c));
  if (!parent_) s.mutations = const_cast<Interpreter*>(this)->input_mutations();
  s.guards = out_.guards.guards().size();
  return s;
}

bool Interpreter::mutable_container(PyObject* o) {
  static PyObject* deque = object_at("collections.deque");
  return PyDict_Check(o) || PyList_Check(o) || PySet_Check(o) || PyByteArray_Check(o) ||
         (deque && PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject*>(deque)));
}

OutSpec Interpreter::break_spec(const VarPtr& v) {
  OutSpec s = break_spec_of(v);
  if (s.kind == OutSpec::Kind::List || s.kind == OutSpec::Kind::Dict || s.kind == OutSpec::Kind::Copy ||
      s.kind == OutSpec::Kind::Construct || s.kind == OutSpec::Kind::Object || s.kind == OutSpec::Kind::MakeDict) {
    // A container copied from capture's object is one object per call, however many trackers
    // or bound methods (d.update on the stack, d in a local) reach it.
    const void* key = s.kind == OutSpec::Kind::Copy ? static_cast<const void*>(s.value) : v.get();
    auto [it, fresh] = break_memo_.emplace(key, static_cast<int>(break_memo_.size()));
    s.memo = it->second;
  }
  return s;
}

OutSpec Interpreter::break_spec_of(const VarPtr& v) {
  OutSpec s;
  switch (v->kind()) {
    case Var::Kind::Tensor: return output_spec(v);
    case Var::Kind::Tuple:
    case Var::Kind::List:
      // A container read from the frame must stay the caller's object.
      if (v->source) return source_spec(v->source);
      if (v->dict_view()) unsupported("a dict view (dict.keys(), values(), items()) at a graph break");
      if (auto* l = v->get_if<ListV>(); l && l->deque) unsupported("a deque made in the function at a graph break: not captured yet");
      s.kind = v->kind() == Var::Kind::Tuple ? OutSpec::Kind::Tuple : OutSpec::Kind::List;
      if (auto* t = v->get_if<TupleV>(); t && t->structseq) s.value = tuple_maker(t->structseq);  // its type's maker
      for (auto& item : v->seq()) s.items.push_back(break_spec(item));
      return s;
    case Var::Kind::Const:
    case Var::Kind::Module:
      if (v->is_const() && v->as<ConstV>().super_self) unsupported("a super() object at a graph break");
      if (sym::Expr e = v->symint(); e.valid()) return output_spec(v);  // evaluated per call
      if (ir::Node* f = v->symfloat(); f && v->source && f->op_name() == "scalar_input") return source_spec(v->source);
      if (v->is_const() && is_private(v->known())) unsupported("an object kiln copied during capture at a graph break");
      if (v->kind() == Var::Kind::Module && is_private(v->obj()))
        unsupported("a module the function made (a user nn.Module) at a graph break");  // its state is this capture's
      // A torch module the function built with parameters (nn.Linear(2, 2)): built again for
      // this call by its maker, drawing them as eager does (capture's object drew them once)
      if (v->kind() == Var::Kind::Module && v->source && v->source->per_call()) return source_spec(v->source);
      if (!v->source && v->is_const() && PyCFunction_Check(v->obj()))
        if (PyObject* self = PyCFunction_GET_SELF(v->obj()); self && mutable_container(self)) {
          // A method of a container the function made (d.update): bound to this call's copy.
          s.kind = OutSpec::Kind::Method;
          s.value = PyUnicode_FromString(reinterpret_cast<PyCFunctionObject*>(v->obj())->m_ml->ml_name);
          s.items.push_back(break_spec(Var::constant(self)));
          return s;
        }
      if (structural(v) || bound_to_structure(v)) return source_spec(v->source);  // this call's object, not capture's
      // A set or dict made here with tensors as keys holds capture's stand-ins for them, which
      // the code after the break would compare with the real tensors ({x, y}.add(x) grew it).
      if (v->is_const() && !v->source && holds_tensor_key(v->obj()))
        unsupported("a set or dict holding tensors as keys at a graph break");
      // A mutable container is one object per call: the caller's, read again where the frame
      // found it, or one the function made, copied from capture's. (Handed on as capture's
      // object, a set guarded by equality, or a defaultdict made in the function, was the first
      // call's, and each call's changes piled up in it.)
      if (mutable_container(v->obj())) {
        if (v->source) return source_spec(v->source);
        s.kind = OutSpec::Kind::Copy;
      } else {
        s.kind = OutSpec::Kind::Const;
      }
      Py_INCREF(v->obj());
      s.value = v->obj();
      return s;
    case Var::Kind::Null: s.kind = OutSpec::Kind::Null; return s;
    case Var::Kind::Method: {
      const MethodV& m = v->as<MethodV>();
      if (m.fn) {  // a class's function or C method (through super()): bound to this call's receiver
        s.kind = OutSpec::Kind::Bound;
        s.value = Py_NewRef(m.fn);
        s.items.push_back(break_spec(m.self));
        return s;
      }
      s.kind = OutSpec::Kind::Method;
      s.value = PyUnicode_FromString(m.name.c_str());
      s.items.push_back(break_spec(m.self));
      return s;
    }
    case Var::Kind::Iterator: unsupported("graph break inside a loop kiln unrolls");
    case Var::Kind::Dict:
      if (v->source) return source_spec(v->source);
      return typed_dict_spec(v->as<DictV>(), true);
    case Var::Kind::Cell:
      // A cell of the frame: the resume function makes a new one (MAKE_CELL) around this.
      if (!v->as<CellV>().content) unsupported("an empty closure cell at a graph break");
      return break_spec(v->as<CellV>().content);
    case Var::Kind::Record: return v->as<RecordV>().plain ? object_spec(v, true) : record_spec(v, true);
    case Var::Kind::Function: return function_spec(v, true);
    case Var::Kind::ContextExit: {
      // The __exit__ of a with block the break is inside: at run time the block's modes are set
      // for real (the instruction and the resume function run in them) and the resume function
      // gets a callable that restores the modes before the block, as __exit__ would.
      const ContextExitV& c = v->as<ContextExitV>();
      if (c.python_exit || c.generator)  // as under TorchDynamo: its exit would run half in the graph
        unsupported("a graph break inside the with block of a context manager written in Python");
      if (!c.entered) unsupported("a with block's exit without its modes at a graph break");
      s.kind = OutSpec::Kind::ModeExit;
      s.value = Py_BuildValue("(OO)", mode_setter(*c.mode), mode_setter(*c.entered));
      if (!s.value) real(nullptr);
      return s;
    }
  }
  unsupported("a value kiln cannot rebuild at a graph break");
}

bool Interpreter::graph_break(const Instr& in, const CodeInfo& ci, size_t pc, const Snapshot& before, const std::string& why) {
  if (PyErr_Occurred()) clear_error();
  if (pc + 1 >= ci.instrs.size()) return false;
  // (run_frame never calls it on a loop, where each iteration would resume anew: falls_into_loop)
  if (!break_leaves_handlers_intact(code_, in.offset)) return false;
  // The instruction runs for real at the break: its own logged stores are dropped; those of
  // the graph before it are replayed before it runs. Identity guards its attempt put on
  // objects (a C method's arguments, pinned) hold nothing the graph needs: an object the caller
  // makes anew at every call (a ContextVar token) would make every call capture again.
  attr_stores_.resize(before.attr_stores);
  out_.guards.drop_instance_identities(before.guards);
  // and the caller's containers hold what they held before it (those it changed first: nothing
  // to put back; it changes them itself)
  for (const auto& [tracker, then] : before.containers) set_contents(*tracker, *then);
  mutated_.resize(before.containers.size());
  auto* co = reinterpret_cast<PyCodeObject*>(code_);
  const int nv = co->co_nlocals;
  // A bound cell of the frame: the resume function makes a new cell around its value, so a
  // closure made before the break over the old one (still reachable: a lambda in a local, on the
  // stack, stored on an object) would no longer see the variable. One consumed already (a
  // comprehension's function, run where it was made) is no obstacle.
  // The resume function does not take a cell's value either: one code after the break uses
  // (reads, stores, closes over) declines the break.
  // Where the resume function goes on (after the instruction; for a branch, at its target too)
  // and what code from there uses: locals handed on, cells that decline the break.
  std::vector<size_t> resumes_at{pc + 1};
  if (in.op != OP_CALL && in.op != OP_BINARY_OP)  // a branch on the value (GraphBreak::Kind::Jump)
    if (auto t = ci.by_offset.find(in.jump_target); t != ci.by_offset.end()) resumes_at.push_back(t->second);
  std::vector<bool> live = live_locals(code_, ci, resumes_at, co->co_nlocalsplus);
  // A bound cell code after the break uses is handed on by value (the resume function's new
  // cell takes it); any bound cell a closure made before the break still holds declines it.
  std::unordered_set<const Var*> cells;
  std::vector<int> live_cells;
  for (int i = nv; i < co->co_nlocalsplus - co->co_nfreevars; ++i) {
    if (!before.locals[i]) continue;
    // (a cell not bound yet at the break, `k = 3; def inner(): return k` after it: the resume
    // function's own MAKE_CELL makes it empty, as it is here)
    const auto* cell = before.locals[i]->get_if<CellV>();
    if (live[static_cast<size_t>(i)] && !(cell && !cell->content)) live_cells.push_back(i);
    if (static_cast<size_t>(i) < locals_.size() && locals_[i]) cells.insert(locals_[i].get());
  }
  if (!cells.empty()) {
    std::unordered_set<const Var*> seen;
    bool closes = false;
    std::function<void(const VarPtr&)> walk = [&](const VarPtr& v) {
      if (!v || closes || !seen.insert(v.get()).second) return;
      switch (v->kind()) {
        case Var::Kind::Function:
          for (const VarPtr& c : v->as<FunctionV>().cells) closes = closes || cells.count(c.get());
          break;
        case Var::Kind::Tuple:
        case Var::Kind::List:
          for (const VarPtr& x : v->seq()) walk(x);
          break;
        case Var::Kind::Dict:
        case Var::Kind::Record:
          for (const VarPtr& x : v->entries().values) walk(x);
          break;
        case Var::Kind::Method: walk(v->as<MethodV>().self); break;
        case Var::Kind::Cell: walk(v->as<CellV>().content); break;
        case Var::Kind::Iterator:
          for (const VarPtr& x : v->as<IteratorV>().left()) walk(x);
          break;
        default: break;
      }
    };
    for (const VarPtr& v : before.stack) walk(v);
    for (const VarPtr& v : before.locals) walk(v);
    for (size_t i = 0; i < before.attr_stores && i < attr_stores_.size(); ++i) walk(attr_stores_[i].value);
    for (const auto& [tracker, then] : before.containers) walk(then);
    if (closes) return false;
  }
  auto brk = std::make_unique<GraphBreak>();
  brk->reason = why;
  brk->location = location();
  size_t operands;
  if (in.op == OP_CALL) {
    brk->kind = GraphBreak::Kind::Call;
    operands = static_cast<size_t>(in.arg) + 2;
    if (!before.kwnames.empty()) {
      brk->kwnames = PyTuple_New(static_cast<Py_ssize_t>(before.kwnames.size()));
      for (size_t k = 0; k < before.kwnames.size(); ++k)
        PyTuple_SET_ITEM(brk->kwnames, k, PyUnicode_FromString(before.kwnames[k].c_str()));
    }
  } else if (in.op == OP_BINARY_SUBSCR || in.op == OP_BINARY_SLICE) {
    brk->kind = GraphBreak::Kind::Subscr;
    operands = in.op == OP_BINARY_SLICE ? 3 : 2;
  } else if (in.op == OP_STORE_SUBSCR || in.op == OP_STORE_SLICE) {
    brk->kind = GraphBreak::Kind::StoreSubscr;
    operands = in.op == OP_STORE_SLICE ? 4 : 3;
  } else if (in.op == OP_DELETE_SUBSCR) {
    brk->kind = GraphBreak::Kind::DeleteSubscr;
    operands = 2;
  } else if (in.op == OP_STORE_ATTR) {
    brk->kind = GraphBreak::Kind::StoreAttr;
    operands = 2;
    brk->name = Py_NewRef(in.argval);
  } else if (in.op == OP_BINARY_OP) {
    brk->kind = GraphBreak::Kind::BinaryOp;
    operands = 2;
    if (in.arg < 0 || static_cast<size_t>(in.arg) >= ci.nb_ops.size()) return false;
    brk->binary_op = ci.nb_ops[in.arg];
  } else {
    brk->kind = GraphBreak::Kind::Jump;
    operands = 1;
    if (before.stack.empty() || !before.stack.back()->in_graph()) return false;  // bool() of a tensor or NumPy value
    brk->jump_if_true = in.op == OP_POP_JUMP_IF_TRUE || in.op == OP_POP_JUMP_FORWARD_IF_TRUE;
  }
  if (before.stack.size() < operands) return false;
  if (in.op == OP_CALL) {
    // Calls that read the frame they run in (super() without arguments, globals(), dir(),
    // sys._getframe()) cannot run from outside it: the whole call runs eagerly instead.
    static PyObject* getframe = object_at("sys._getframe");
    static PyObject* currentframe = object_at("inspect.currentframe");
    const VarPtr& f = before.stack[before.stack.size() - operands];
    const VarPtr& g = before.stack[before.stack.size() - operands + 1];
    for (const VarPtr& c : {f, g}) {
      if (!c->is_const()) continue;
      PyObject* k = c->known();
      if (k == builtin("super") || (k && (k == getframe || k == currentframe))) return false;
      if (in.arg == 0 && (k == builtin("globals") || k == builtin("dir") || k == builtin("locals") || k == builtin("vars")))
        return false;
    }
  }
  const size_t below = before.stack.size() - operands;
  ResumeShape shape;
  try {
    write_back(before.mutations);  // the updates of inputs done before the instruction
    checks_.resize(before.checks);  // and the checks made before it
    output_checks();
    // modes a call inside the instruction set (torch.set_grad_enabled in an inlined optimizer
    // step) are set when it runs for real, not before the graph
    out_.modes_after = before.modes_after;
    for (size_t i = 0; i < before.stack.size(); ++i) {
      OutSpec spec = break_spec(before.stack[i]);
      if (i < below) {
        shape.stack_is_null.push_back(spec.kind == OutSpec::Kind::Null);
        brk->stack.push_back(std::move(spec));
      } else {
        brk->operands.push_back(std::move(spec));
      }
    }
    // Locals no path after the break reads are not handed on, as in TorchDynamo: a value only
    // they hold is no output of the graph (an unused `(-1.5) ** x` that requires grad would
    // otherwise take a zero gradient into a backward that multiplies it by nan).
    // Zero-argument super() reads the frame's first argument with no instruction of its own:
    // a method that uses it (its code has the __class__ cell) hands that argument on.
    if (auto* co = reinterpret_cast<PyCodeObject*>(code_); co->co_argcount > 0 && !live.empty()) {
      PyObject* frees = PyCode_GetFreevars(co);
      for (Py_ssize_t i = 0; frees && i < PyTuple_GET_SIZE(frees); ++i)
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(frees, i), "__class__") == 0) live[0] = true;
      Py_XDECREF(frees);
    }
    for (int i = 0; i < nv; ++i) {
      OutSpec spec;
      if (before.locals[i] && live[static_cast<size_t>(i)]) spec = break_spec(before.locals[i]);
      else spec.kind = OutSpec::Kind::Unbound;
      shape.local_unbound.push_back(spec.kind == OutSpec::Kind::Unbound);
      brk->locals.push_back(std::move(spec));
    }
    for (int i : live_cells) {
      brk->cells.push_back(break_spec(before.locals[i]));  // a Cell tracker: its content
      shape.cells.push_back(i);
    }
    out_.replays = store_replays(attr_stores_.size(), true);
  } catch (const Unsupported&) {
    return false;
  }
  std::vector<int> targets = {ci.instrs[pc + 1].offset};
  switch (brk->kind) {
    case GraphBreak::Kind::Call:
    case GraphBreak::Kind::Subscr:
    case GraphBreak::Kind::BinaryOp: shape.stack_is_null.push_back(false); break;  // the result
    case GraphBreak::Kind::Jump: targets.push_back(in.jump_target); break;
    default: break;
  }
  for (int t : targets) {
    std::string error;
    shape.offset = t;
    PyObject* f = make_resume_function(fn_, shape, error);
    if (!f) return false;
    brk->resume.push_back(f);
  }
  brk->memo_slots = static_cast<int>(break_memo_.size());
  locate_symbols();
  out_.graph_break = std::move(brk);
  return true;
}

OutSpec Interpreter::function_spec(const VarPtr& v, bool at_break) {
  const FunctionV& f = v->as<FunctionV>();
  OutSpec s;
  if (f.cells.empty()) {  // code, globals and constant defaults: the same function every call
    s.kind = OutSpec::Kind::Const;
    s.value = Py_NewRef(f.fn);
    return s;
  }
  // A closure: made anew per call around cells holding this call's values (what the cells hold
  // may come from the frame: the object of this call, not of the capture).
  s.kind = OutSpec::Kind::Closure;
  s.value = Py_NewRef(f.fn);
  for (const VarPtr& c : f.cells) {
    // a closure over the caller's cell, rebuilt around a new cell, would not write the caller's
    if (c->as<CellV>().callers) unsupported("a function closing over a variable of the caller is handed out");
    const VarPtr& content = c->as<CellV>().content;
    OutSpec item;
    if (!content) item.kind = OutSpec::Kind::Unbound;
    else item = at_break ? break_spec(content) : output_spec(content);
    s.items.push_back(std::move(item));
  }
  return s;
}

OutSpec Interpreter::typed_dict_spec(const DictV& d, bool at_break) {
  OutSpec plain = dict_spec(d, at_break);
  if (!d.cls) return plain;
  if (d.made_factory) unsupported("a defaultdict whose factory the function made, handed out of it");
  OutSpec s;  // cls(d) or defaultdict(factory, d): the class, in order, with its entries
  s.kind = OutSpec::Kind::MakeDict;
  s.value = d.factory ? PyTuple_Pack(2, d.cls, d.factory) : PyTuple_Pack(1, d.cls);
  s.items.push_back(std::move(plain));
  return s;
}

OutSpec Interpreter::dict_spec(const Entries& d, bool at_break) {
  OutSpec s;
  s.kind = OutSpec::Kind::Dict;
  s.value = PyTuple_New(static_cast<Py_ssize_t>(d.keys.size()));
  for (size_t i = 0; i < d.keys.size(); ++i) {
    PyTuple_SET_ITEM(s.value, i, Py_NewRef(d.keys[i]));
    s.items.push_back(at_break ? break_spec(d.values[i]) : output_spec(d.values[i]));
  }
  return s;
}

}  // namespace kiln::bind::detail
