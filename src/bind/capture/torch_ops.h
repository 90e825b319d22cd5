// Which torch callables and Tensor methods map onto which registry ops. Built once from the
// `python` names of the op registry, resolved against the running torch.
#pragma once
#include <Python.h>

#include <string>

#include "core/ops/registry.h"

namespace kiln::bind {

struct OpBinding {
  const ops::OpDef* op = nullptr;
  ir::Attrs fixed;  // attributes the spelling implies: Tensor.float -> dtype=float32
};

const OpBinding* function_binding(PyObject* callable);
const OpBinding* method_binding(const std::string& name);
// torch.relu_, torch.sigmoid_, torch.numel, ...: the Tensor method a torch function stands for.
const std::string* function_as_method(PyObject* callable);

}  // namespace kiln::bind
