// The caller's lists and dicts, changed in place by the captured code: one tracker per object,
// its final contents put back into the object after the graph.
#include "bind/capture/interpreter.h"

namespace kiln::bind::detail {

VarPtr Interpreter::known_container(PyObject* v, const SourcePtr& src) {
  Interpreter* r = root();
  auto it = r->containers_.find(v);
  if (it == r->containers_.end()) return nullptr;
  const VarPtr& tracker = it->second;
  // A tracker whose source capture dropped (a resume function's private argument) stands for
  // that call's own object: never reached again through the caller.
  if (!tracker->source) return nullptr;
  if (src->str() != tracker->source->str()) out_.guards.add_same(src, tracker->source);
  return tracker;
}

void Interpreter::note_mutation(const VarPtr& container, const std::string& what) {
  for (const auto& [obj, view] : root()->dict_views_)
    if (view == container) unsupported(what + " through the __dict__ of an object made during capture");
  if (!container->source) return;  // the frame's own
  // An object a call made during capture (its source leads through that call) is gone after
  // the call: nothing to change it in.
  if (container->source->made_in_frame()) unsupported(what + " on a container a call made during capture");
  Interpreter* r = root();
  if (std::find(r->mutated_.begin(), r->mutated_.end(), container) == r->mutated_.end()) {
    bool registered = false;
    for (const auto& [obj, tracker] : r->containers_) registered = registered || tracker == container;
    // Reached otherwise than by wrap (a copy a snapshot made): no one tracker to change.
    if (!registered) unsupported(what + " on a " + Var::kind_name(container->kind()) + " the caller can see");
    r->mutated_.push_back(container);
  }
}

VarPtr Interpreter::contents_of(const VarPtr& c) {
  if (c->kind() == Var::Kind::List) return Var::list(c->seq());
  VarPtr d = Var::dict();
  const Entries& e = c->entries();
  for (size_t i = 0; i < e.keys.size(); ++i) {
    d->entries().keys.push_back(Py_NewRef(e.keys[i]));
    d->entries().values.push_back(e.values[i]);
  }
  return d;
}

void Interpreter::set_contents(Var& to, const Var& from) {
  if (to.kind() == Var::Kind::List) {
    to.seq() = from.seq();
    return;
  }
  Entries& e = to.entries();
  const Entries& f = const_cast<Var&>(from).entries();
  for (PyObject* k : e.keys) Py_DECREF(k);
  e.keys.clear();
  for (PyObject* k : f.keys) e.keys.push_back(Py_NewRef(k));
  e.values = f.values;
}

std::vector<StoreReplay> Interpreter::container_replays(bool at_break) {
  std::vector<StoreReplay> out;
  for (const VarPtr& c : root()->mutated_) {
    StoreReplay r{c->source, "", {}, true};
    VarPtr now = contents_of(c);
    // kept: break_spec's memo knows a container by its tracker's address
    root()->replayed_contents_.push_back(now);
    r.value = at_break ? break_spec(now) : output_spec(now);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace kiln::bind::detail
