// Guards: the conditions under which a compiled entry is valid, checked in C++ before every
// use of the entry. They cover every value the graph was specialised on: tensor properties,
// Python scalars, the identity of globals and modules, module flags, container lengths.
#pragma once
#include <Python.h>

#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bind/guards/guard_tree.h"
#include "bind/guards/source.h"
#include "bind/torch/tensor_bridge.h"
#include "core/sym/shape_env.h"

namespace kiln::bind {

struct Guard {
  enum class Kind {
    Tensor,    // dtype, device, sizes, strides, requires_grad, type
    Type,      // type(value) is expected_type
    Equals,    // type and value equal (Python numbers, strings, None, bools)
    Identity,  // value is expected (globals, modules, functions)
    Length,    // len(value) == length, for tuples/lists
    GradMode,  // torch.is_grad_enabled() == flag
    Autocast,  // torch.autocast's state (on/off and dtype, per device type) == autocast
    DefaultDtype,  // torch.get_default_dtype() == dtype (factories, int tensor * float)
    Deterministic,  // torch.are_deterministic_algorithms_enabled() == flag (code that asked)
    DeterministicWarnOnly,  // torch.is_deterministic_algorithms_warn_only_enabled() == flag
    HasAttr,   // hasattr(value, expected) == flag (an attribute capture found absent, or present)
    HasKey,    // (expected in value) == flag, value a dict (a module's globals: `del name`)
    // value is the module `expected` whose `entries` (the attributes capture read as constants:
    // torch.sigmoid, F.gelu, math.pi) are what they were: at once where its __dict__ has not
    // changed since (its version tag), else compared one by one (torch's own code sets module
    // globals, torch.cuda's `_initialized`), the version taken anew where they all hold
    DictVersion,
    NoAlias,   // the tensors at `sources` flagged in `mutated` share storage with none of the others
    IntSymbol, // an exact int >= 2 (not bool), the value of size symbol `length` (binds it)
    Same,      // value is the object at sources[0] (one tensor reached by two paths)
    NotSame,   // value is not the object at sources[0] (two tensors the code hashed or compared by identity)
    KeyOrder,  // value is a dict whose keys, in iteration order, equal the tuple `expected`
  } kind;
  SourcePtr source;
  TensorInfo tensor;
  PyObject* expected = nullptr;  // owned: Equals value, Identity object, Type type
  Py_ssize_t length = 0;
  bool flag = false;
  AutocastState autocast;
  DType dtype = DType::Float32;    // DefaultDtype
  mutable uint64_t version = 0;    // DictVersion: the dict's version when its entries last held
  std::vector<std::pair<PyObject*, PyObject*>> entries;  // DictVersion: (name, value), owned
  std::vector<SourcePtr> sources;  // NoAlias: every tensor input of the graph
  std::vector<bool> mutated;       // NoAlias: those the graph updates in place (written back)

  std::string str() const;
  // The check itself. Autocast and GradMode hold or not for the whole process; NoAlias over the
  // values at `sources`, in order; Same compares two values and is checked by its caller. The
  // others hold for `v`, the value at `source` (a shape-generic tensor or an int symbol binds
  // its symbols in `bindings`); `detail` (if given) says what differed.
  bool is_global() const {  // no source to read
    return kind == Kind::Autocast || kind == Kind::GradMode || kind == Kind::DefaultDtype || kind == Kind::Deterministic ||
           kind == Kind::DeterministicWarnOnly;
  }
  bool holds_globally() const;
  bool holds_for(PyObject* v, SymbolBindings& bindings, std::string* detail) const;
  bool no_alias_holds(PyObject* const* values) const;
};

class GuardSet {
 public:
  GuardSet() = default;
  GuardSet(const GuardSet&) = delete;
  GuardSet& operator=(const GuardSet&) = delete;
  GuardSet(GuardSet&&) = default;
  GuardSet& operator=(GuardSet&&) = default;
  ~GuardSet();

  void add_tensor(SourcePtr s, const TensorInfo& info);
  void add_type(SourcePtr s, PyObject* type);
  void add_equals(SourcePtr s, PyObject* value);
  void add_identity(SourcePtr s, PyObject* obj);
  void add_length(SourcePtr s, Py_ssize_t n);
  void add_key_order(SourcePtr s, PyObject* dict);  // the dict's keys now (borrowed)
  void add_grad_mode(bool enabled);
  void add_autocast(const AutocastState& state);
  void add_default_dtype(DType dtype);
  void add_global_flag(Guard::Kind kind, bool flag);  // Deterministic, DeterministicWarnOnly
  void add_hasattr(SourcePtr s, PyObject* name, bool present);  // name: a str (borrowed)
  void add_haskey(SourcePtr s, PyObject* key, bool present);
  // module.name read as the constant `value` (version read at finalize)
  void add_dict_version(SourcePtr module_source, PyObject* module, PyObject* name, PyObject* value);
  // The inputs an entry updates in place (written back after its graph) share memory with no
  // other input: the graph reads each input as it was before the call.
  void add_no_alias(std::vector<SourcePtr> inputs, std::vector<bool> mutated);
  // A Python int kept symbolic: its value binds `symbol` (one of this set's).
  void add_int_symbol(SourcePtr s, const sym::Expr& symbol);
  // The object at `s` is the one at `other` (capture read one tensor through both).
  void add_same(SourcePtr s, SourcePtr other);
  void add_not_same(SourcePtr s, SourcePtr other);
  // Drops identity guards on instances (not modules, types or functions), those from the
  // `from`-th on: see build_entry_once and Interpreter::graph_break.
  void drop_instance_identities(size_t from = 0);

  // Size symbols (shape-generic entries): `hint` is the size at capture. Tensor guards name
  // them by index (TensorInfo::size_symbols).
  sym::Expr add_symbol(int64_t hint);
  const std::vector<sym::Expr>& symbols() const { return symbols_; }
  int64_t hint(const sym::Expr& symbol) const;
  // An expression of the symbols at their hints (every symbol in it must be this set's).
  int64_t value_at_hints(const sym::Expr& e) const;
  // A fact capture relied on: `symbol` has its hint's value (Python code read the size). The
  // entry then holds for that size only.
  void specialize(const sym::Expr& symbol);
  bool specialized(const sym::Expr& symbol) const;
  // A fact between sizes: `zero` evaluates to 0 (a relation a - b == 0 a shape rule relied on).
  void add_fact(const sym::Expr& zero);
  void add_fact_nonnegative(const sym::Expr& e);  // e >= 0
  bool has_fact(const sym::Expr& zero) const;
  bool has_fact_nonnegative(const sym::Expr& e) const;
  // Specialized symbols and their values, to fold into the graph before it is compiled.
  std::map<sym::Expr, sym::Expr> specializations() const;
  // Automatic dynamic: for each tensor guard whose tensor now has the same rank but other
  // sizes, the dims whose size changed (by the guard's source).
  void size_changes(const FrameView& f, std::map<std::string, std::set<int64_t>>& out) const;

  // True when all hold. On failure, `why` (if given) names the first failing guard.
  bool check(const FrameView& f, std::string* why) const;
  // The guards as one walk over their sources (guard_tree.h) that also reads the values at
  // `fetch` (an entry's inputs), for check_and_fetch. A guard added later drops the tree.
  void finalize(const std::vector<SourcePtr>& fetch);
  bool finalized() const { return tree_ != nullptr; }
  // check() and the fetch sources' values in one walk (finalized sets only).
  bool check_and_fetch(const FrameView& f, FetchedValues& out) const { return tree_->check(*this, f, out); }
  const std::vector<Guard>& guards() const { return guards_; }
  // After a check of the guards themselves: the size facts, at the symbols' bound values.
  bool check_facts(const SymbolBindings& bindings, std::string* why) const;
  std::vector<std::string> strs() const;

 private:
  bool check_guards(const FrameView& f, std::string* why, SymbolBindings& bindings) const;
  // False when the guard adds nothing: the same check is there already, or the value lies
  // inside a code object whose identity is guarded (code objects never change).
  bool needed(const Guard& g);

  std::vector<Guard> guards_;
  std::vector<sym::Expr> symbols_;
  std::vector<int64_t> hints_;
  std::vector<int> specialized_;  // symbol indices that must equal their hint
  std::vector<sym::Expr> facts_;  // expressions of the symbols that must be 0
  std::vector<sym::Expr> nonneg_facts_;  // ... that must be >= 0
  std::unordered_set<std::string> seen_;          // str() of each guard kept
  std::unordered_map<std::string, size_t> dict_versions_;  // a DictVersion guard's str() -> its index
  std::unordered_set<std::string> fixed_roots_;   // sources of identity-guarded code objects
  std::unique_ptr<GuardTree> tree_;
};

// The shape environment of a capture (sym::ShapeEnv): sizes compare at the symbols' hints (this
// call's sizes), and what a shape rule relies on becomes a fact of the guard set. Frozen (while
// the captured graph compiles), it answers from the facts already there and adds none: every
// fact an entry relies on was checked by its guards.
class GuardShapeEnv : public sym::ShapeEnv {
 public:
  GuardShapeEnv(GuardSet& guards, bool frozen) : guards_(guards), frozen_(frozen) {}
  bool assume_equal(const sym::Expr& a, const sym::Expr& b) override;
  bool assume_nonnegative(const sym::Expr& e) override;
  std::optional<int64_t> hint(const sym::Expr& e) override;

 private:
  GuardSet& guards_;
  bool frozen_;
};

}  // namespace kiln::bind
