#include "bind/python_objects.h"
#include "bind/interrupts.h"

namespace kiln::bind {

PyObject* object_at(const std::string& path) {
  size_t dot = path.find('.');
  PyObject* obj = PyImport_ImportModule(path.substr(0, dot).c_str());
  while (obj && dot != std::string::npos) {
    size_t next = path.find('.', dot + 1);
    PyObject* child = PyObject_GetAttrString(obj, path.substr(dot + 1, next - dot - 1).c_str());
    Py_DECREF(obj);
    obj = child;
    dot = next;
  }
  if (!obj) clear_error();
  return obj;
}

}  // namespace kiln::bind
