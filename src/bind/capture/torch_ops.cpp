#include "bind/capture/torch_ops.h"
#include "bind/interrupts.h"

#include <unordered_map>

namespace kiln::bind {
namespace {

struct Tables {
  std::unordered_map<PyObject*, OpBinding> functions;
  std::unordered_map<std::string, OpBinding> methods;
  std::unordered_map<PyObject*, std::string> method_functions;  // torch.relu_ -> "relu_", torch.numel -> "numel"
};

// "torch.nn.functional.relu" -> the object, or nullptr.
PyObject* resolve(const std::string& path) {
  size_t dot = path.find('.');
  std::string head = path.substr(0, dot);
  PyObject* obj = PyImport_ImportModule(head.c_str());
  while (obj && dot != std::string::npos) {
    size_t next = path.find('.', dot + 1);
    std::string part = path.substr(dot + 1, next == std::string::npos ? std::string::npos : next - dot - 1);
    PyObject* child = PyObject_GetAttrString(obj, part.c_str());
    Py_DECREF(obj);
    obj = child;
    dot = next;
  }
  if (!obj) clear_error();
  return obj;
}

// Parses "Tensor.float{dtype=float32}" into name and fixed attributes.
std::string split_fixed(const std::string& spelling, ir::Attrs& fixed) {
  size_t brace = spelling.find('{');
  if (brace == std::string::npos) return spelling;
  std::string body = spelling.substr(brace + 1, spelling.size() - brace - 2);
  size_t eq = body.find('=');
  if (eq != std::string::npos) {
    std::string key = body.substr(0, eq), value = body.substr(eq + 1);
    if (auto t = dtype_from_name(value)) fixed.set(key, *t);
    else fixed.set(key, value);
  }
  return spelling.substr(0, brace);
}

Tables& tables() {
  static Tables* t = [] {
    auto* tb = new Tables();
    for (const ops::OpDef* op : ops::all_ops()) {
      for (const std::string& spelling : op->python) {
        OpBinding b{op, {}};
        std::string name = split_fixed(spelling, b.fixed);
        if (name.rfind("Tensor.", 0) == 0) {
          tb->methods.emplace(name.substr(7), b);
        } else if (PyObject* obj = resolve(name)) {
          tb->functions.emplace(obj, b);  // keeps the reference: the table lives for the process
        }
      }
    }
    for (const auto& [name, b] : tb->methods)
      if (PyObject* obj = resolve("torch." + name + "_")) tb->method_functions.emplace(obj, name + "_");
    // questions about a tensor that capture answers from its metadata
    for (const char* name : {"numel", "is_floating_point", "is_complex"})
      if (PyObject* obj = resolve(std::string("torch.") + name)) tb->method_functions.emplace(obj, name);
    return tb;
  }();
  return *t;
}

}  // namespace

const OpBinding* function_binding(PyObject* callable) {
  auto& f = tables().functions;
  auto it = f.find(callable);
  return it == f.end() ? nullptr : &it->second;
}

const OpBinding* method_binding(const std::string& name) {
  auto& m = tables().methods;
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

const std::string* function_as_method(PyObject* callable) {
  auto& f = tables().method_functions;
  auto it = f.find(callable);
  return it == f.end() ? nullptr : &it->second;
}

}  // namespace kiln::bind
