#include "core/ir/graph.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <unordered_set>

#include "core/ops/registry.h"

namespace kiln::ir {

std::string TensorMeta::str() const {
  static const char* short_names[] = {"b8", "u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"};
  std::string s = short_names[static_cast<int>(dtype)];
  s += sym::str(sizes);
  if (device.type != DeviceType::CPU) s += "@" + device.str();
  return s;
}

std::vector<Expr> contiguous_strides(const std::vector<Expr>& sizes) {
  std::vector<Expr> st(sizes.size());
  Expr s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = s;
    s = s * sym::max(sizes[i], Expr(1));
  }
  return st;
}

bool is_contiguous(const std::vector<Expr>& sizes, const std::vector<Expr>& strides) {
  if (sizes.size() != strides.size()) return false;
  for (const Expr& e : sizes)
    if (e.is_const(0)) return true;  // no elements: any strides
  Expr expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i].is_const(1)) continue;  // a dim of one element: its stride indexes nothing
    if (!(strides[i] == expected)) return false;
    expected = expected * sizes[i];
  }
  return true;
}

void Attrs::set(const std::string& key, AttrValue v) {
  for (auto& [k, val] : items_)
    if (k == key) {
      val = std::move(v);
      return;
    }
  items_.emplace_back(key, std::move(v));
}
const AttrValue* Attrs::find(const std::string& key) const {
  for (auto& [k, v] : items_)
    if (k == key) return &v;
  return nullptr;
}
bool Attrs::has(const std::string& key) const { return find(key) != nullptr; }
int64_t Attrs::get_int(const std::string& key, int64_t dflt) const {
  const AttrValue* v = find(key);
  if (!v) return dflt;
  if (auto* i = std::get_if<int64_t>(v)) return *i;
  if (auto* b = std::get_if<bool>(v)) return *b;
  if (auto* d = std::get_if<double>(v)) return static_cast<int64_t>(*d);
  return dflt;
}
double Attrs::get_float(const std::string& key, double dflt) const {
  const AttrValue* v = find(key);
  if (!v) return dflt;
  if (auto* d = std::get_if<double>(v)) return *d;
  if (auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  if (auto* b = std::get_if<bool>(v)) return *b;
  return dflt;
}
bool Attrs::get_bool(const std::string& key, bool dflt) const {
  const AttrValue* v = find(key);
  if (!v) return dflt;
  if (auto* b = std::get_if<bool>(v)) return *b;
  if (auto* i = std::get_if<int64_t>(v)) return *i != 0;
  return dflt;
}
std::vector<int64_t> Attrs::get_ints(const std::string& key) const {
  const AttrValue* v = find(key);
  if (!v) return {};
  if (auto* l = std::get_if<std::vector<int64_t>>(v)) return *l;
  if (auto* i = std::get_if<int64_t>(v)) return {*i};
  return {};
}
std::string Attrs::get_str(const std::string& key, const std::string& dflt) const {
  const AttrValue* v = find(key);
  if (!v) return dflt;
  if (auto* s = std::get_if<std::string>(v)) return *s;
  return dflt;
}
std::optional<DType> Attrs::get_dtype(const std::string& key) const {
  const AttrValue* v = find(key);
  if (!v) return std::nullopt;
  if (auto* t = std::get_if<DType>(v)) return *t;
  return std::nullopt;
}

AttrValue sizes_attr(const std::vector<Expr>& sizes) {
  std::vector<int64_t> ints;
  for (const Expr& e : sizes) {
    auto c = e.as_const();
    if (!c) return sizes;
    ints.push_back(*c);
  }
  return ints;
}

std::vector<Expr> Attrs::get_exprs(const std::string& key) const {
  const AttrValue* v = find(key);
  if (!v) return {};
  if (auto* l = std::get_if<std::vector<Expr>>(v)) return *l;
  std::vector<Expr> out;
  for (int64_t i : get_ints(key)) out.push_back(Expr(i));
  return out;
}

sym::Expr Attrs::get_expr(const std::string& key) const {
  const AttrValue* v = find(key);
  if (!v) return {};
  if (auto* e = std::get_if<sym::Expr>(v)) return *e;
  if (auto* i = std::get_if<int64_t>(v)) return *i;
  return {};
}

std::string attr_str(const AttrValue& v) {
  struct V {
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      char b[32];
      std::snprintf(b, sizeof b, "%.17g", d);
      std::string s = b;
      if (s.find_first_of(".eni") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(const sym::Expr& e) const { return e.str(); }
    std::string operator()(const std::vector<sym::Expr>& l) const { return sym::str(l); }
    std::string operator()(const std::vector<int64_t>& l) const {
      std::string s = "[";
      for (size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + std::to_string(l[i]);
      return s + "]";
    }
    std::string operator()(const std::string& s) const { return "'" + s + "'"; }
    std::string operator()(DType t) const { return std::string("torch.") + dtype_name(t); }
  };
  return std::visit(V{}, v);
}

std::string Attrs::str() const {
  std::string s;
  for (size_t i = 0; i < items_.size(); ++i) s += (i ? ", " : "") + items_[i].first + "=" + attr_str(items_[i].second);
  return s;
}

const std::string& Node::op_name() const { return op->name; }

std::string Graph::unique_name(const std::string& base) {
  for (auto& [n, c] : name_counts_)
    if (n == base) return base + "_" + std::to_string(++c);
  name_counts_.emplace_back(base, 0);
  return base;
}

Node* Graph::add(const OpDef* op, std::vector<Node*> inputs, Attrs attrs, std::string& error) {
  TensorMeta meta;
  if (op->infer) {
    if (!op->infer(inputs, attrs, meta, error)) return nullptr;
  } else if (op->kind == ops::OpKind::Pointwise) {
    if (!ops::infer_pointwise(*op, inputs, attrs, meta, error)) return nullptr;
  } else if (op->kind == ops::OpKind::Reduction) {
    if (!ops::infer_reduction(*op, inputs, attrs, meta, error)) return nullptr;
  } else {
    error = "kiln: op " + op->name + " has no shape rule";
    return nullptr;
  }
  auto n = std::make_unique<Node>();
  n->id = next_id_++;
  n->op = op;
  n->name = unique_name(op->name);
  n->inputs = std::move(inputs);
  n->attrs = std::move(attrs);
  n->meta = std::move(meta);
  n->source_loc = source_loc;
  for (Node* in : n->inputs)
    if (in) in->users.push_back(n.get());
  nodes_.push_back(std::move(n));
  return nodes_.back().get();
}

Node* Graph::add(const std::string& op, std::vector<Node*> inputs, Attrs attrs, std::string& error) {
  const OpDef* def = ops::find_op(op);
  if (!def) {
    error = "kiln: unknown op " + op;
    return nullptr;
  }
  return add(def, std::move(inputs), std::move(attrs), error);
}

Node* Graph::must_add(const std::string& op, std::vector<Node*> inputs, Attrs attrs) {
  std::string error;
  Node* n = add(op, std::move(inputs), std::move(attrs), error);
  if (!n) throw std::runtime_error(error);
  return n;
}

Node* Graph::placeholder(const std::string& name, const TensorMeta& meta) {
  auto n = std::make_unique<Node>();
  n->id = next_id_++;
  n->op = ops::find_op("placeholder");
  n->name = unique_name(name);
  n->meta = meta;
  n->attrs.set("index", static_cast<int64_t>(inputs_.size()));
  inputs_.push_back(n.get());
  // Placeholders stay in front so that the order is topological for any later node.
  auto pos = std::find_if(nodes_.begin(), nodes_.end(), [](auto& x) { return x->op_name() != "placeholder"; });
  return nodes_.insert(pos, std::move(n))->get();
}

void Graph::substitute_sizes(const std::map<Expr, Expr>& repl) {
  if (repl.empty()) return;
  auto sub = [&](Expr& e) { e = sym::substitute(e, repl); };
  for (auto& n : nodes_) {
    for (Expr& e : n->meta.sizes) sub(e);
    for (Expr& e : n->meta.strides) sub(e);
    sub(n->meta.offset);
    std::vector<std::pair<std::string, AttrValue>> items = n->attrs.items();
    for (auto& [k, v] : items)
      if (auto* e = std::get_if<Expr>(&v)) n->attrs.set(k, sym::substitute(*e, repl));
  }
}

Node* Graph::size_value(const Expr& e, DType t) {
  if (auto c = e.as_const()) return scalar(static_cast<double>(*c), t);
  Attrs a;
  a.set("expr", e);
  a.set("dtype", t);
  return must_add("size_value", {}, a);
}

Node* Graph::scalar(double v, DType t) {
  Attrs a;
  if (is_floating(t)) a.set("value", v);
  else if (t == DType::Bool) a.set("value", v != 0);
  else a.set("value", static_cast<int64_t>(v));
  a.set("dtype", t);
  return must_add("scalar", {}, a);
}

Node* Graph::int_scalar(int64_t v) {
  Attrs a;
  a.set("value", v);
  a.set("dtype", DType::Int64);
  return must_add("scalar", {}, a);
}

void Graph::replace_all_uses(Node* from, Node* to) {
  for (auto& n : nodes_)
    for (Node*& in : n->inputs)
      if (in == from) in = to;
  for (Node*& o : outputs_)
    if (o == from) o = to;
  recompute_users();
}

void Graph::recompute_users() {
  for (auto& n : nodes_) n->users.clear();
  for (auto& n : nodes_)
    for (Node* in : n->inputs)
      if (in) in->users.push_back(n.get());
}

void Graph::erase_if(const std::function<bool(const Node*)>& pred) {
  nodes_.erase(std::remove_if(nodes_.begin(), nodes_.end(), [&](auto& n) { return pred(n.get()); }), nodes_.end());
  recompute_users();
}

void Graph::move_tail_before(size_t tail_start, const Node* before) {
  auto pos = std::find_if(nodes_.begin(), nodes_.end(), [&](auto& x) { return x.get() == before; });
  std::rotate(pos, nodes_.begin() + tail_start, nodes_.end());
}

size_t Graph::op_count() const {
  size_t c = 0;
  for (auto& n : nodes_)
    if (n->op->kind != ops::OpKind::Source) ++c;
  return c;
}

std::string Graph::str() const {
  std::string s = "graph():\n";
  for (auto& n : nodes_) {
    s += "    %" + n->name + " : " + n->meta.str() + " = ";
    if (n->op_name() == "placeholder") {
      s += "placeholder[target=" + n->name + "]\n";
      continue;
    }
    if (n->op_name() == "scalar") {
      s += "scalar[value=" + attr_str(*n->attrs.find("value")) + "]\n";
      continue;
    }
    s += n->op_name() + "(";
    bool first = true;
    for (Node* in : n->inputs) {
      s += (first ? "" : ", ") + (in ? "%" + in->name : std::string("None"));
      first = false;
    }
    for (auto& [k, v] : n->attrs.items()) {
      s += (first ? "" : ", ") + k + "=" + attr_str(v);
      first = false;
    }
    s += ")\n";
  }
  s += "    return (";
  for (size_t i = 0; i < outputs_.size(); ++i) s += (i ? ", %" : "%") + outputs_[i]->name;
  s += outputs_.size() == 1 ? ",)\n" : ")\n";
  return s;
}

}  // namespace kiln::ir
