#include "core/codegen/scalar_emitter.h"

#include <cmath>
#include <climits>
#include <cstdint>
#include <cstdio>

namespace kiln::codegen {

using loop::SNode;
using loop::SOp;
using loop::SRef;

std::string ctype(DType t) { return dtype_ctype(t); }

std::string register_ctype(DType t) { return dtype_ctype(compute_dtype(t)); }

namespace {
// The prelude's conversions between float and a 16-bit float's bits. Loads and stores name the
// `bits` member: a struct copied as a whole keeps the CPU compiler from vectorizing the loop.
const char* to_float(DType t) { return t == DType::Float16 ? "kiln_f16_to_f32" : "kiln_bf16_to_f32"; }
const char* from_float(DType t) { return t == DType::Float16 ? "kiln_f32_to_f16" : "kiln_f32_to_bf16"; }
// A float expression rounded to the precision of the 16-bit type `t` (its value in a register).
std::string rounded(DType t, const std::string& e) {
  return std::string(t == DType::Float16 ? "kiln_round_f16(" : "kiln_round_bf16(") + e + ")";
}
}  // namespace

std::string literal(double fval, int64_t ival, DType t) {
  if (t == DType::Bool) return ival ? "true" : "false";
  if (!is_floating(t)) {
    std::string v = std::to_string(ival) + "LL";
    if (ival == INT64_MIN) v = "(-9223372036854775807LL - 1)";
    return t == DType::Int64 ? v : "((" + ctype(t) + ")" + v + ")";
  }
  if (is_16bit_float(t)) return rounded(t, literal(fval, ival, DType::Float32));
  bool f32 = t == DType::Float32;
  if (std::isnan(fval)) return f32 ? "kiln_nan_f()" : "kiln_nan_d()";
  if (std::isinf(fval)) return std::string(fval < 0 ? "(-" : "(") + (f32 ? "kiln_inf_f())" : "kiln_inf_d())");
  char buf[64];
  // Hexadecimal floating literals are exact: the kernel sees the very constant the graph holds.
  if (f32) std::snprintf(buf, sizeof buf, "%af", static_cast<double>(static_cast<float>(fval)));
  else std::snprintf(buf, sizeof buf, "%a", fval);
  return buf;
}

int64_t int_lowest(DType t) {
  switch (t) {
    case DType::Int8: return -128;
    case DType::Int16: return -32768;
    case DType::Int32: return INT32_MIN;
    case DType::Int64: return INT64_MIN;
    default: return 0;
  }
}

int64_t int_highest(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::UInt8: return 255;
    case DType::Int8: return 127;
    case DType::Int16: return 32767;
    case DType::Int32: return INT32_MAX;
    default: return INT64_MAX;
  }
}

namespace {
const char* fn_name(SOp op) {
  switch (op) {
    case SOp::Exp: return "kiln_exp";
    case SOp::Exp2: return "kiln_exp2";
    case SOp::Expm1: return "kiln_expm1";
    case SOp::Log: return "kiln_log";
    case SOp::Log2: return "kiln_log2";
    case SOp::Log1p: return "kiln_log1p";
    case SOp::Sin: return "kiln_sin";
    case SOp::Cos: return "kiln_cos";
    case SOp::Tan: return "kiln_tan";
    case SOp::Tanh: return "kiln_tanh";
    case SOp::Sigmoid: return "kiln_sigmoid";
    case SOp::Relu: return "kiln_relu";
    case SOp::Abs: return "kiln_abs";
    case SOp::Sqrt: return "kiln_sqrt";
    case SOp::Rsqrt: return "kiln_rsqrt";
    case SOp::Erf: return "kiln_erf";
    case SOp::RoundF16: return "kiln_round_f16";
    case SOp::RoundBF16: return "kiln_round_bf16";
    case SOp::Floor: return "kiln_floor";
    case SOp::Ceil: return "kiln_ceil";
    case SOp::Trunc: return "kiln_trunc";
    case SOp::Reciprocal: return "kiln_reciprocal";
    case SOp::FloorDiv: return "kiln_floordiv";
    case SOp::Mod: return "kiln_mod";
    case SOp::TruncDiv: return "kiln_truncdiv";
    case SOp::Pow: return "kiln_pow";
    case SOp::Max: return "kiln_max";
    case SOp::Min: return "kiln_min";
    case SOp::Rand: return "kiln_rand";
    default: return nullptr;
  }
}
const char* infix(SOp op) {
  switch (op) {
    case SOp::Add: return "+";
    case SOp::Sub: return "-";
    case SOp::Mul: return "*";
    case SOp::Div: return "/";

    case SOp::Eq: return "==";
    case SOp::Ne: return "!=";
    case SOp::Lt: return "<";
    case SOp::Le: return "<=";
    case SOp::Gt: return ">";
    case SOp::Ge: return ">=";
    case SOp::And: return "&&";
    case SOp::Or: return "||";
    default: return nullptr;
  }
}
// Narrow integer arithmetic happens in int in C; cast back so results wrap as torch's do.
bool narrow(DType t) { return t == DType::UInt8 || t == DType::Int8 || t == DType::Int16 || t == DType::Int32; }
// Signed overflow is undefined in C++ (compilers fold `x + 1 > x` to true); torch's int32 and
// int64 arithmetic wraps, so kiln's goes through unsigned arithmetic, which is defined to wrap.
bool wraps(DType t) { return t == DType::Int32 || t == DType::Int64; }
}  // namespace

std::string store_to(const loop::Buffer& b, const std::string& element, const std::string& value) {
  if (is_16bit_float(b.dtype)) return element + ".bits = " + from_float(b.dtype) + "(" + value + ");";
  return element + " = " + value + ";";
}

std::string store_stmt(const loop::Buffer& b, const std::string& index, const std::string& value) {
  return store_to(b, b.name + "[" + index + "]", value);
}

void replace_identifier(std::string& text, const std::string& from, const std::string& to) {
  auto identifier_char = [](char c) { return isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
    const size_t end = at + from.size();
    if ((end == text.size() || !identifier_char(text[end])) && (at == 0 || !identifier_char(text[at - 1]))) {
      text.replace(at, from.size(), to);
      at += to.size();
    } else {
      at = end;
    }
  }
}

std::string arg_name(int64_t index) { return "kiln_scalar" + std::to_string(index); }

std::string ScalarEmitter::emit(SRef r, const std::string& indent) { return expr(r, indent); }

std::string ScalarEmitter::expr(SRef r, const std::string& indent) {
  auto it = names_.find(r);
  if (it != names_.end()) return it->second;
  const SNode& n = p_.exprs[r];
  std::string e;
  switch (n.op) {
    case SOp::Const: return literal(n.fval, n.ival, n.dtype);
    case SOp::Acc: return acc_name_(n.acc);
    case SOp::Load: {
      const loop::Buffer& b = p_.buffers[n.buffer];
      e = element_of ? element_of(n) : "";
      if (e.empty()) e = b.name + "[" + n.index.c_str() + "]";
      if (is_16bit_float(b.dtype)) e = std::string(to_float(b.dtype)) + "(" + e + ".bits)";
      break;
    }
    case SOp::Index: e = "((" + register_ctype(n.dtype) + ")(" + n.index.c_str() + "))"; break;
    case SOp::Arg: e = "((" + register_ctype(n.dtype) + ")" + arg_name(n.ival) + ")"; break;
    case SOp::Cast: {
      // float -> int32/int64 -> float: one prelude helper (kiln_through_int32/64), so the CPU
      // compiler cannot fold the pair into a trunc() that keeps -0.0, inf and nan (see preludes).
      const SNode& src = p_.exprs[n.a];
      if (is_floating(n.dtype) && (src.dtype == DType::Int32 || src.dtype == DType::Int64) && src.op == SOp::Cast &&
          is_floating(p_.exprs[src.a].dtype)) {  // 16-bit floats too: their registers are floats
        e = "((" + register_ctype(n.dtype) + ")kiln_through_int" + (src.dtype == DType::Int32 ? "32(" : "64(") +
            expr(src.a, indent) + "))";
        break;
      }
      std::string a = expr(n.a, indent);
      if (is_floating(src.dtype) && (n.dtype == DType::Int32 || n.dtype == DType::Int64)) {
        // nan and out-of-range values as the device's conversion gives them (preludes)
        e = "((" + register_ctype(n.dtype) + ")kiln_to_int" + (n.dtype == DType::Int32 ? "32(" : "64(") + a + "))";
        break;
      }
      e = n.dtype == DType::Bool ? "(" + a + " != 0)" : "((" + register_ctype(n.dtype) + ")" + a + ")";
      break;
    }
    case SOp::Where: {
      std::string c = expr(n.a, indent), a = expr(n.b, indent), b = expr(n.c, indent);
      // Floating selects as the preludes' kiln_select (a bit blend on the CPU): g++ leaves a
      // ?: whose operand calls a vector math function as control flow, and the loop then runs
      // scalar, one vector call per element (gelu's inf test over erf on torch 2.11).
      if (n.dtype == DType::Float32 || n.dtype == DType::Float64) {
        const std::string t = register_ctype(n.dtype);
        e = "kiln_select(" + c + ", (" + t + ")" + a + ", (" + t + ")" + b + ")";
      } else {
        e = "(" + c + " ? " + a + " : " + b + ")";
      }
      break;
    }
    case SOp::Neg:
      e = wraps(n.dtype) ? "((" + ctype(n.dtype) + ")(0ULL - (unsigned long long)" + expr(n.a, indent) + "))"
                         : "(-" + expr(n.a, indent) + ")";
      break;
    case SOp::Not: e = "(!" + expr(n.a, indent) + ")"; break;
    default: {
      if (loop::sop_is_unary(n.op)) {
        e = std::string(fn_name(n.op)) + "(" + expr(n.a, indent) + ")";
      } else {
        std::string a = expr(n.a, indent), b = expr(n.b, indent);
        if (const char* f = fn_name(n.op)) e = std::string(f) + "(" + a + ", " + b + ")";
        else if (wraps(n.dtype) && (n.op == SOp::Add || n.op == SOp::Sub || n.op == SOp::Mul))
          e = "((" + ctype(n.dtype) + ")((unsigned long long)" + a + " " + infix(n.op) + " (unsigned long long)" + b + "))";
        else e = "(" + a + " " + infix(n.op) + " " + b + ")";
      }
      if (narrow(n.dtype) && !loop::sop_is_comparison(n.op)) e = "((" + ctype(n.dtype) + ")" + e + ")";
    }
  }
  // 16-bit floats live in float registers (loads convert); a value made in one is rounded,
  // unless it is a cast of a value rounded to that type already.
  const bool already = n.op == SOp::Cast && p_.exprs[n.a].op == (n.dtype == DType::Float16 ? SOp::RoundF16 : SOp::RoundBF16);
  if (is_16bit_float(n.dtype) && n.op != SOp::Load && !already) e = rounded(n.dtype, e);
  std::string name = "t" + std::to_string(counter_++);
  out_ += indent + "const " + register_ctype(n.dtype) + " " + name + " = " + e + ";\n";
  names_[r] = name;
  return name;
}

}  // namespace kiln::codegen
