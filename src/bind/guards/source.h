// Sources: where a value the graph depends on comes from, relative to a call's frame.
// Guards check values at their sources; graph inputs are fetched from theirs at every call.
#pragma once
#include <Python.h>

#include "core/sym/expr.h"

#include <memory>
#include <string>

namespace kiln::bind {

struct Source;
using SourcePtr = std::shared_ptr<const Source>;

struct Source {
  // Seed: not a place but a fresh int64 seed from torch's default generator each time it is
  // read (the input of a graph that draws random numbers). Made: an object the frame builds
  // from constants at every call (a module without parameters, nn.Softmax(dim=-1)): what is
  // read from it is the same at every call, so nothing under it is guarded, and it cannot be
  // read back from a frame (a graph break or a result that hands it out is not captured). A
  // Made source with a `maker` (nn.Linear(5, 3): parameters drawn at every call) is read by
  // calling the maker: the call builds the object afresh, as eager does, and the graph reads
  // its parameters as inputs. Seeds and makers draw from torch's generator, so a call reads
  // them once (SourceMemo), after every guard held (per_call()).
  // Array: torch.from_numpy(base) of the np.ndarray at `base` (an input of NumPy code).
  // DictItem: base[key] read from a dict's own storage (dict.__getitem__), for a dict subclass
  // whose __getitem__ does more (Hugging Face's ACT2FN builds a module per lookup).
  // Globals: the module dict itself (the frame's, or `globals`), which `global x; x = v` stores into.
  // Pinned: one object held by the source (a closure cell of a function reached through a class,
  // whose contents are read through it, guarded, at every call). ClosureCell: the frame's closure
  // cell itself (Closure reads its contents), which `nonlocal x; x = v` stores into.
  enum class Kind { Local, Global, Attr, Item, Closure, Key, DictItem, Seed, Made, Array, Deref, Globals, Pinned, ClosureCell } kind;
  int local = -1;            // Local: the slot in the bound arguments
  std::string name;          // Local/Global/Attr: the name
  PyObject* key = nullptr;   // Global/Attr: interned name string; Key: the key; Item: str(index) (owned)
  Py_ssize_t index = 0;      // Item; Closure: the cell's position in fn.__closure__
  SourcePtr base;            // Attr/Item
  PyObject* globals = nullptr;  // Global/Globals: the dict it is read from, when not the frame's (owned)
  PyObject* maker = nullptr;    // Made: builds the object again at every call, if it owns tensors (owned)
  PyObject* pinned = nullptr;   // Pinned: the object (owned)

  static SourcePtr local_(int slot, const std::string& name);
  // `globals`: the module dict of an inlined function from another module (else the frame's).
  static SourcePtr global(const std::string& name, PyObject* globals = nullptr);
  static SourcePtr globals_dict(PyObject* globals = nullptr);
  static SourcePtr pinned_object(PyObject* obj, const std::string& name);  // name: what it is, for messages
  static SourcePtr attr(SourcePtr base, const std::string& name);
  static SourcePtr item(SourcePtr base, Py_ssize_t index);
  static SourcePtr closure(Py_ssize_t index, const std::string& name);
  static SourcePtr closure_cell(Py_ssize_t index, const std::string& name);
  static SourcePtr key_of(SourcePtr base, PyObject* key);  // base[key] for any hashable key (dicts)
  static SourcePtr dict_item(SourcePtr base, PyObject* key);  // dict.__getitem__(base, key)
  static SourcePtr seed();
  static SourcePtr made(PyObject* obj);  // names the object's type
  // The object `maker()` builds at every call (a new reference to maker is taken).
  static SourcePtr built(PyObject* obj, PyObject* maker);
  static SourcePtr array(SourcePtr base);
  static SourcePtr deref(SourcePtr base);  // base(): the object a weakref refers to (None once dead)
  ~Source();

  bool made_in_frame() const;  // this source, or one it is read from, is Made
  // Read anew at every call, drawing from torch's generator: a Seed, or under a Made source
  // with a maker. Fetched after the guards, never by their walk.
  bool per_call() const;

  std::string module_name() const;
  std::string str() const;  // "L['x']", "G['torch']", "L['self'].fc1.weight", "L['xs'][0]"
};

// Values already read from sources during one call. A model's guards and inputs name a few
// thousand sources that share long prefixes (L['self'].encoder.layer[3]....): with the memo
// each prefix is walked once per call rather than once per source.
class SourceMemo {
 public:
  SourceMemo() = default;
  SourceMemo(const SourceMemo&) = delete;
  SourceMemo& operator=(const SourceMemo&) = delete;
  ~SourceMemo() { clear(); }
  PyObject* find(const Source* s) const;  // borrowed, or nullptr
  void put(const Source* s, PyObject* v);  // keeps its own reference
  // Forget everything: before Python code that may change what sources read runs (capture).
  void clear();

 private:
  // Open addressing over a power-of-two table (an empty slot has no source): a call's few
  // thousand lookups and insertions without an allocation each, as a node-based map made.
  struct Slot {
    const Source* source = nullptr;
    PyObject* value = nullptr;
  };
  size_t slot_of(const Source* s) const;  // its slot, or the empty one where it would go
  void grow();
  std::vector<Slot> slots_;
  std::vector<size_t> filled_;  // the slots in use, for clear() to visit only those
};

// The frame a source is evaluated in.
struct FrameView {
  PyObject* const* locals;
  PyObject* globals;
  PyObject* builtins;
  PyObject* closure = nullptr;  // the function's tuple of cells, if any
  SourceMemo* memo = nullptr;   // shared by the guard checks and input fetches of one call
  // The entry's size symbols and their values in this call (for symbolic ints handed out).
  const std::vector<sym::Expr>* symbols = nullptr;
  const int64_t* symbol_values = nullptr;
};

// New reference, or nullptr with no Python error set when the value is gone.
PyObject* eval_source(const Source& s, const FrameView& f);
// The two steps eval_source takes, for walks that hold the base's value already (guard trees):
// a root source's value in the frame (Local, Global, Closure), and the value another source
// reads from its base's (Attr, Item, Key). New reference, or nullptr with no error set.
PyObject* read_root(const Source& s, const FrameView& f);
PyObject* read_from_base(const Source& s, PyObject* base);
// hasattr(obj, name) for a torch.nn.Module that keeps Module's attribute lookup, answered from
// its dicts without the AttributeError Module.__getattr__ would build: 1 or 0; -1 when obj is
// not such a module or its class has the name (the generic lookup answers then).
int module_has_attr(PyObject* obj, PyObject* name);

}  // namespace kiln::bind
