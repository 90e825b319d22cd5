#include "bind/capture/resume.h"
#include "bind/interrupts.h"

#include <algorithm>
#include <set>

namespace kiln::bind {
namespace {

// Opcode numbers of the running interpreter, read from `dis` once.
struct Opcodes {
  int LOAD_FAST, STORE_DEREF, DELETE_FAST, PUSH_NULL, JUMP_FORWARD, RESUME, EXTENDED_ARG, LOAD_CONST, UNARY_NEGATIVE, RETURN_VALUE;
  int PUSH_EXC_INFO, WITH_EXCEPT_START;
  std::set<int> free;  // instructions whose argument indexes cell and free variables
  bool ok = false;
};

const Opcodes& opcodes() {
  static Opcodes o = [] {
    Opcodes r{};
    PyObject* dis = PyImport_ImportModule("dis");
    PyObject* map = dis ? PyObject_GetAttrString(dis, "opmap") : nullptr;
    PyObject* hasfree = dis ? PyObject_GetAttrString(dis, "hasfree") : nullptr;
    auto op = [&](const char* n) {
      PyObject* v = map ? PyDict_GetItemString(map, n) : nullptr;
      return v ? static_cast<int>(PyLong_AsLong(v)) : -1;
    };
    r.LOAD_FAST = op("LOAD_FAST");
    r.STORE_DEREF = op("STORE_DEREF");
    r.DELETE_FAST = op("DELETE_FAST");
    r.PUSH_NULL = op("PUSH_NULL");
    r.JUMP_FORWARD = op("JUMP_FORWARD");
    r.RESUME = op("RESUME");
    r.EXTENDED_ARG = op("EXTENDED_ARG");
    r.LOAD_CONST = op("LOAD_CONST");
    r.UNARY_NEGATIVE = op("UNARY_NEGATIVE");
    r.RETURN_VALUE = op("RETURN_VALUE");
    r.PUSH_EXC_INFO = op("PUSH_EXC_INFO");
    r.WITH_EXCEPT_START = op("WITH_EXCEPT_START");
    for (Py_ssize_t i = 0; hasfree && i < PySequence_Size(hasfree); ++i) {
      PyObject* v = PySequence_GetItem(hasfree, i);
      r.free.insert(static_cast<int>(PyLong_AsLong(v)));
      Py_DECREF(v);
    }
    r.ok = map && hasfree && r.LOAD_FAST >= 0 && r.DELETE_FAST >= 0 && r.PUSH_NULL >= 0 && r.JUMP_FORWARD >= 0 &&
           r.RESUME >= 0 && r.EXTENDED_ARG >= 0 && r.LOAD_CONST >= 0 && r.UNARY_NEGATIVE >= 0 && r.RETURN_VALUE >= 0;
    Py_XDECREF(hasfree);
    Py_XDECREF(map);
    Py_XDECREF(dis);
    clear_error();
    return r;
  }();
  return o;
}

// The exception table (3.11+): entries of varints in 6-bit big-endian chunks, 0x40 marking
// continuation and 0x80 the first byte of an entry; units are 2-byte code units.
struct ExcEntry {
  int start, end, target, depth_lasti;
};

std::vector<ExcEntry> parse_exception_table(const std::string& t) {
  std::vector<ExcEntry> out;
  size_t pos = 0;
  auto varint = [&]() {
    unsigned char b = static_cast<unsigned char>(t[pos++]);
    int v = b & 63;
    while ((b & 64) && pos < t.size()) {
      b = static_cast<unsigned char>(t[pos++]);
      v = (v << 6) | (b & 63);
    }
    return v;
  };
  while (pos < t.size()) {
    ExcEntry e;
    e.start = varint();
    e.end = e.start + varint();
    e.target = varint();
    e.depth_lasti = varint();
    out.push_back(e);
  }
  return out;
}

void write_varint(std::string& out, int v, bool first) {
  std::vector<int> chunks;
  do {
    chunks.push_back(v & 63);
    v >>= 6;
  } while (v);
  for (size_t i = chunks.size(); i-- > 0;) {
    int b = chunks[i];
    if (i) b |= 64;
    if (first && i == chunks.size() - 1) b |= 128;
    out.push_back(static_cast<char>(b));
  }
}

std::string bytes_of(PyObject* code, const char* attr) {
  PyObject* b = PyObject_GetAttrString(code, attr);
  std::string s;
  if (b && PyBytes_Check(b)) s.assign(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
  Py_XDECREF(b);
  clear_error();
  return s;
}

void emit(std::string& code, int op, int arg) {
  if (arg > 0xffffff) code.push_back(static_cast<char>(opcodes().EXTENDED_ARG)), code.push_back(static_cast<char>((arg >> 24) & 0xff));
  if (arg > 0xffff) code.push_back(static_cast<char>(opcodes().EXTENDED_ARG)), code.push_back(static_cast<char>((arg >> 16) & 0xff));
  if (arg > 0xff) code.push_back(static_cast<char>(opcodes().EXTENDED_ARG)), code.push_back(static_cast<char>((arg >> 8) & 0xff));
  code.push_back(static_cast<char>(op));
  code.push_back(static_cast<char>(arg & 0xff));
}

// code.replace(**kw) (new reference or nullptr with an error set); takes kw's reference.
PyObject* code_replace(PyObject* code, PyObject* kw) {
  PyObject* replace = PyObject_GetAttrString(code, "replace");
  PyObject* empty = PyTuple_New(0);
  PyObject* out = replace ? PyObject_Call(replace, empty, kw) : nullptr;
  Py_DECREF(empty);
  Py_XDECREF(replace);
  Py_DECREF(kw);
  return out;
}

// Sets kw[k] = v, taking v's reference.
void set_item(PyObject* kw, const char* k, PyObject* v) {
  PyDict_SetItemString(kw, k, v);
  Py_DECREF(v);
}

}  // namespace

ExceptionHandler exception_handler(PyObject* code, int offset) {
  ExceptionHandler h;
  // Entries are in order and do not overlap: the first that covers the instruction is its own.
  for (const ExcEntry& e : parse_exception_table(bytes_of(code, "co_exceptiontable")))
    if (e.start <= offset / 2 && offset / 2 < e.end) {
      h.target = e.target * 2;
      h.depth = e.depth_lasti >> 1;
      h.lasti = e.depth_lasti & 1;
      return h;
    }
  return h;
}

bool break_leaves_handlers_intact(PyObject* code, int offset) {
  const Opcodes& ops = opcodes();
  const std::string bytecode = bytes_of(code, "co_code");
  auto op_at = [&](int unit) { return unit >= 0 && 2 * static_cast<size_t>(unit) < bytecode.size() ? static_cast<unsigned char>(bytecode[2 * unit]) : -1; };
  // A handler that catches: PUSH_EXC_INFO, then anything but a with block's WITH_EXCEPT_START.
  auto catches = [&](const ExcEntry& e) { return op_at(e.target) == ops.PUSH_EXC_INFO && op_at(e.target + 1) != ops.WITH_EXCEPT_START; };
  auto with_cleanup = [&](const ExcEntry& e) { return op_at(e.target) == ops.PUSH_EXC_INFO && op_at(e.target + 1) == ops.WITH_EXCEPT_START; };
  const std::vector<ExcEntry> table = parse_exception_table(bytes_of(code, "co_exceptiontable"));
  bool covered = false;
  for (const ExcEntry& e : table)
    if (e.start <= offset / 2 && offset / 2 < e.end) {
      if (!with_cleanup(e)) return false;
      covered = true;
    }
  if (!covered) return true;
  // The instruction at the break runs outside the function: an exception it raises would miss
  // an except or finally around the with block, so none may be anywhere in the code.
  return std::none_of(table.begin(), table.end(), catches);
}

bool in_exception_block(PyObject* code, int offset) {
  for (const ExcEntry& e : parse_exception_table(bytes_of(code, "co_exceptiontable")))
    if (e.start <= offset / 2 && offset / 2 < e.end) return true;
  return false;
}

namespace {
// A line table (PEP 626's co_linetable, CPython 3.11/3.12) putting all `units` code units on the
// code's first line, without columns: a traceback through the frame then names that line, where
// an empty table made traceback.format_exc() fail on it ("generator raised StopIteration").
std::string first_line_table(size_t units) {
  std::string t;
  constexpr int kNoColumns = 13;  // PY_CODE_LOCATION_INFO_NO_COLUMNS: one signed varint, the line delta
  for (size_t left = units; left > 0;) {
    const size_t n = std::min<size_t>(left, 8);  // an entry covers 1 to 8 code units
    t += static_cast<char>(0x80 | (kNoColumns << 3) | (n - 1));
    t += static_cast<char>(0);  // line delta 0: co_firstlineno
    left -= n;
  }
  return t;
}
}  // namespace

PyObject* make_trampoline(PyObject* code, PyObject* holder) {
  const Opcodes& ops = opcodes();
  if (!ops.ok || !holder) return nullptr;
  auto* co = reinterpret_cast<PyCodeObject*>(code);
  PyObject* consts = PyTuple_New(PyTuple_GET_SIZE(co->co_consts) + 1);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(co->co_consts); ++i)
    PyTuple_SET_ITEM(consts, i, Py_NewRef(PyTuple_GET_ITEM(co->co_consts, i)));
  PyTuple_SET_ITEM(consts, PyTuple_GET_SIZE(co->co_consts), Py_NewRef(holder));
  std::string body;
  emit(body, ops.RESUME, 0);
  emit(body, ops.LOAD_CONST, static_cast<int>(PyTuple_GET_SIZE(co->co_consts)));
  emit(body, ops.UNARY_NEGATIVE, 0);
  emit(body, ops.RETURN_VALUE, 0);
  PyObject* kw = PyDict_New();
  set_item(kw, "co_code", PyBytes_FromStringAndSize(body.data(), static_cast<Py_ssize_t>(body.size())));
  set_item(kw, "co_consts", consts);
  set_item(kw, "co_exceptiontable", PyBytes_FromStringAndSize("", 0));
  const std::string lines = first_line_table(body.size() / 2);
  set_item(kw, "co_linetable", PyBytes_FromStringAndSize(lines.data(), static_cast<Py_ssize_t>(lines.size())));
  PyObject* t = code_replace(code, kw);
  if (!t) clear_error();
  return t;
}

PyObject* make_resume_function(PyObject* fn, const ResumeShape& shape, std::string& error) {
  const Opcodes& ops = opcodes();
  if (!ops.ok) {
    error = "this Python's dis module lacks an opcode resume functions need";
    return nullptr;
  }
  auto* co = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn));
  PyObject* code = reinterpret_cast<PyObject*>(co);
  PyObject* varnames = PyCode_GetVarnames(co);
  const int nv = static_cast<int>(PyTuple_GET_SIZE(varnames));
  int nstack = 0;
  for (bool null : shape.stack_is_null) nstack += !null;
  const int ncells = static_cast<int>(shape.cells.size());
  const int nextra = nstack + ncells;  // parameters after the original's varnames
  if (ncells && ops.STORE_DEREF < 0) {
    error = "this Python's dis module lacks STORE_DEREF";
    Py_DECREF(varnames);
    return nullptr;
  }

  // The body: the original bytecode with cell/free indices moved past the new parameters.
  std::string body = bytes_of(code, "co_code");
  std::string prefix;  // the original's MAKE_CELL / COPY_FREE_VARS ... RESUME, moved too
  bool in_prefix = true;
  for (size_t i = 0; i + 1 < body.size(); i += 2) {
    int op = static_cast<unsigned char>(body[i]);
    int arg = static_cast<unsigned char>(body[i + 1]);
    if (ops.free.count(op) && arg >= nv && nextra) {
      bool extended = i >= 2 && static_cast<unsigned char>(body[i - 2]) == ops.EXTENDED_ARG;
      if (extended || arg + nextra > 255) {
        error = "too many variables to move for a resume function";
        Py_DECREF(varnames);
        return nullptr;
      }
      body[i + 1] = static_cast<char>(arg + nextra);
    }
    if (in_prefix) {
      prefix += body.substr(i, 2);
      if (op == ops.RESUME) in_prefix = false;
    }
  }
  if (in_prefix) {
    error = "code without a RESUME instruction";
    Py_DECREF(varnames);
    return nullptr;
  }

  std::string pro = prefix;
  for (int i = 0; i < nv && i < static_cast<int>(shape.local_unbound.size()); ++i)
    if (shape.local_unbound[i]) emit(pro, ops.DELETE_FAST, i);
  // the cells the prefix made (empty) take their values, passed after the stack's
  for (int j = 0; j < ncells; ++j) {
    if (shape.cells[j] + nextra > 255 || nv + nstack + j > 255) {
      error = "too many variables to move for a resume function";
      Py_DECREF(varnames);
      return nullptr;
    }
    emit(pro, ops.LOAD_FAST, nv + nstack + j);
    emit(pro, ops.STORE_DEREF, shape.cells[j] + nextra);
  }
  int param = nv;
  for (bool null : shape.stack_is_null) {
    if (null) emit(pro, ops.PUSH_NULL, 0);
    else emit(pro, ops.LOAD_FAST, param++);
  }
  // Jumping from the end of the prologue to body unit r is a forward jump of exactly r units.
  emit(pro, ops.JUMP_FORWARD, shape.offset / 2);
  const int P = static_cast<int>(pro.size() / 2);
  std::string new_code = pro + body;

  std::string table;
  for (ExcEntry e : parse_exception_table(bytes_of(code, "co_exceptiontable"))) {
    write_varint(table, e.start + P, true);
    write_varint(table, e.end - e.start, false);
    write_varint(table, e.target + P, false);
    write_varint(table, e.depth_lasti, false);
  }
  std::string lines;
  for (int left = P; left > 0; left -= 8) lines.push_back(static_cast<char>(0x80 | (15 << 3) | (std::min(left, 8) - 1)));
  lines += bytes_of(code, "co_linetable");

  PyObject* names = PyTuple_New(nv + nextra);
  for (int i = 0; i < nv; ++i) {
    PyObject* n = PyTuple_GET_ITEM(varnames, i);
    Py_INCREF(n);
    PyTuple_SET_ITEM(names, i, n);
  }
  // Named by slot, so a resume function of a resume function never repeats a name.
  for (int j = 0; j < nstack; ++j) PyTuple_SET_ITEM(names, nv + j, PyUnicode_FromFormat("__kiln_stack%d", nv + j));
  for (int j = 0; j < ncells; ++j) PyTuple_SET_ITEM(names, nv + nstack + j, PyUnicode_FromFormat("__kiln_cell%d", nv + nstack + j));
  Py_DECREF(varnames);
  std::string qual = PyUnicode_AsUTF8(co->co_qualname);
  std::string name = "__resume_" + std::string(PyUnicode_AsUTF8(co->co_name)) + "_at_" + std::to_string(shape.offset);
  qual = qual.substr(0, qual.size() - PyUnicode_GET_LENGTH(co->co_name)) + name;

  PyObject* kw = PyDict_New();
  auto set = [&](const char* k, PyObject* v) { set_item(kw, k, v); };
  set("co_code", PyBytes_FromStringAndSize(new_code.data(), static_cast<Py_ssize_t>(new_code.size())));
  set("co_argcount", PyLong_FromLong(nv + nextra));
  set("co_posonlyargcount", PyLong_FromLong(0));
  set("co_kwonlyargcount", PyLong_FromLong(0));
  set("co_nlocals", PyLong_FromLong(nv + nextra));
  set("co_varnames", names);
  set("co_flags", PyLong_FromLong(co->co_flags & ~(CO_VARARGS | CO_VARKEYWORDS)));
  set("co_exceptiontable", PyBytes_FromStringAndSize(table.data(), static_cast<Py_ssize_t>(table.size())));
  set("co_linetable", PyBytes_FromStringAndSize(lines.data(), static_cast<Py_ssize_t>(lines.size())));
  set("co_name", PyUnicode_FromString(name.c_str()));
  set("co_qualname", PyUnicode_FromString(qual.c_str()));
  PyObject* new_co = code_replace(code, kw);
  PyObject* f = new_co ? PyFunction_New(new_co, PyFunction_GET_GLOBALS(fn)) : nullptr;
  Py_XDECREF(new_co);
  if (f && PyFunction_GET_CLOSURE(fn) && PyFunction_SetClosure(f, PyFunction_GET_CLOSURE(fn)) < 0) Py_CLEAR(f);
  if (!f && keep_interrupt()) {
    error = "interrupted";
    return nullptr;
  }
  if (!f) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject* s = v ? PyObject_Str(v) : nullptr;
    error = std::string("could not build a resume function: ") + (s ? PyUnicode_AsUTF8(s) : "unknown error");
    Py_XDECREF(s);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
    clear_error();
  }
  return f;
}

}  // namespace kiln::bind
