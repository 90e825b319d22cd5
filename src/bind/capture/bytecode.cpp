#include "bind/capture/bytecode.h"
#include "bind/interrupts.h"

#include <stdexcept>

namespace kiln::bind {
namespace {

PyObject* g_dis = nullptr;

std::vector<std::string> string_list(PyObject* seq, bool second_of_pair) {
  std::vector<std::string> out;
  if (!seq) return out;
  Py_ssize_t n = PySequence_Size(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_GetItem(seq, i);
    PyObject* s = second_of_pair && PyTuple_Check(item) ? PyTuple_GetItem(item, 0) : item;
    out.push_back(s && PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : "");
    Py_DECREF(item);
  }
  return out;
}

}  // namespace

CodeInfo::~CodeInfo() {
  if (Py_IsInitialized()) Py_XDECREF(dis_list);
}

namespace {
void free_code_info(void* p) { delete static_cast<CodeInfo*>(p); }
}  // namespace

const CodeInfo& decode(PyObject* code) {
  // Kept in the code object's extra slot, so it goes when the code object goes (functions
  // compiled and dropped leave nothing behind).
  static Py_ssize_t slot = _PyEval_RequestCodeExtraIndex(free_code_info);
  void* extra = nullptr;
  if (slot >= 0 && _PyCode_GetExtra(code, slot, &extra) == 0 && extra) return *static_cast<CodeInfo*>(extra);
  clear_error();
  if (!g_dis) g_dis = PyImport_ImportModule("dis");
  static const std::unordered_map<std::string, int> names = {
#define KILN_X(n) {#n, OP_##n},
      KILN_OPNAMES(KILN_X)
#undef KILN_X
  };
  auto* info = new CodeInfo();
  PyObject* it_obj = PyObject_CallMethod(g_dis, "get_instructions", "O", code);
  info->dis_list = it_obj ? PySequence_List(it_obj) : nullptr;
  Py_XDECREF(it_obj);
  if (!info->dis_list) {
    delete info;
    throw std::runtime_error("dis.get_instructions failed");
  }
  PyObject* nb = PyObject_GetAttrString(g_dis, "_nb_ops");
  if (!nb) clear_error();
  info->nb_ops = string_list(nb, true);
  Py_XDECREF(nb);
  PyObject* cmp = PyObject_GetAttrString(g_dis, "cmp_op");
  if (!cmp) clear_error();
  info->cmp_ops = string_list(cmp, false);
  Py_XDECREF(cmp);
  int line = 0;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(info->dis_list); ++i) {
    PyObject* ins = PyList_GET_ITEM(info->dis_list, i);
    auto get_int = [&](const char* attr) {
      PyObject* v = PyObject_GetAttrString(ins, attr);
      long r = (v && PyLong_Check(v)) ? PyLong_AsLong(v) : -1;
      Py_XDECREF(v);
      clear_error();
      return static_cast<int>(r);
    };
    PyObject* opname = PyObject_GetAttrString(ins, "opname");
    std::string name = PyUnicode_AsUTF8(opname);
    Py_DECREF(opname);
    Instr in;
    auto f = names.find(name);
    in.op = f == names.end() ? OP_UNKNOWN : f->second;
    in.arg = get_int("arg");
    in.offset = get_int("offset");
    PyObject* argval = PyObject_GetAttrString(ins, "argval");
    in.argval = argval;  // borrowed below: the instruction object in dis_list holds it too
    Py_XDECREF(argval);
    in.jump_target = PyLong_Check(argval) ? static_cast<int>(PyLong_AsLong(argval)) : -1;
    PyObject* repr = PyObject_GetAttrString(ins, "argrepr");
    if (repr && PyUnicode_Check(repr)) in.argrepr = PyUnicode_AsUTF8(repr);
    Py_XDECREF(repr);
    PyObject* starts = PyObject_GetAttrString(ins, "starts_line");
    if (starts && PyLong_Check(starts)) line = static_cast<int>(PyLong_AsLong(starts));
    Py_XDECREF(starts);
    clear_error();
    in.line = line;
    info->by_offset[in.offset] = info->instrs.size();
    info->instrs.push_back(in);
    info->opnames.push_back(name);
  }
  if (slot < 0 || _PyCode_SetExtra(code, slot, info) < 0) {
    clear_error();
    static std::vector<CodeInfo*> unslotted;  // no extra slot left: kept for the process
    unslotted.push_back(info);
  }
  return *info;
}

}  // namespace kiln::bind
