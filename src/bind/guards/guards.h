// Guards: the conditions under which a compiled entry is valid, checked in C++ before every
// use of the entry. They cover every value the graph was specialised on: tensor properties,
// Python scalars, the identity of globals and modules, module flags, container lengths.
#pragma once
#include <Python.h>

#include <string>
#include <unordered_set>
#include <vector>

#include "bind/guards/source.h"
#include "bind/torch/tensor_bridge.h"

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
  } kind;
  SourcePtr source;
  TensorInfo tensor;
  PyObject* expected = nullptr;  // owned: Equals value, Identity object, Type type
  Py_ssize_t length = 0;
  bool flag = false;
  AutocastState autocast;

  std::string str() const;
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
  void add_grad_mode(bool enabled);
  void add_autocast(const AutocastState& state);

  // True when all hold. On failure, `why` (if given) names the first failing guard.
  bool check(const FrameView& f, std::string* why) const;
  const std::vector<Guard>& guards() const { return guards_; }
  std::vector<std::string> strs() const;

 private:
  // False when the guard adds nothing: the same check is there already, or the value lies
  // inside a code object whose identity is guarded (code objects never change).
  bool needed(const Guard& g);

  std::vector<Guard> guards_;
  std::unordered_set<std::string> seen_;          // str() of each guard kept
  std::unordered_set<std::string> fixed_roots_;   // sources of identity-guarded code objects
};

}  // namespace kiln::bind
