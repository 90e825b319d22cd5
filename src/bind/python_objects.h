// Objects the binding layer looks up once by their dotted path: library functions and types
// that capture and guards compare against (dataclasses.fields, torch.nn.Module, ...).
#pragma once
#include <Python.h>

#include <string>

namespace kiln::bind {

// The object at a dotted path ("torch.nn.Module", "dataclasses.MISSING"), importing the
// leading module; nullptr (no error set) when it does not exist. A new reference: callers
// that cache it in a static keep it for the life of the process.
PyObject* object_at(const std::string& path);

}  // namespace kiln::bind
