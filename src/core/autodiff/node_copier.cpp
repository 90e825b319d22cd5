#include "core/autodiff/node_copier.h"

#include <algorithm>

#include "core/ops/registry.h"
#include "core/sym/shape_env.h"

namespace kiln::autodiff {

using ir::Node;

bool constant(const Node& n) { return n.op->kind == ops::OpKind::Source && n.op_name() != "placeholder"; }

int64_t bytes_of(const Node& n) {
  int64_t elems = 1;
  for (const sym::Expr& s : n.meta.sizes) {
    auto c = s.as_const();
    if (!c) c = sym::size_hint(s);
    elems *= c ? std::max<int64_t>(*c, 1) : 1024;
  }
  return std::max<int64_t>(elems * static_cast<int64_t>(dtype_size(n.meta.dtype)), 1);
}

ir::TensorMeta as_input(const Node& n) {
  ir::TensorMeta m = n.meta;
  m.offset = 0;
  return m;
}

Node* NodeCopier::copy(const Node& n, std::string& why) {
  std::vector<Node*> in;
  for (const Node* u : n.inputs) {
    if (!u) {
      in.push_back(nullptr);
      continue;
    }
    Node* m = lookup(*u, why);
    if (!m) return nullptr;
    in.push_back(m);
  }
  Node* c = to_.add(n.op, in, n.attrs, why);
  if (c) {
    c->source_loc = n.source_loc;
    // Capture marks arithmetic on Python floats as a Python number again (a wrapped number),
    // which no op's rule infers: the copy keeps the mark.
    c->meta.wrapped_number = n.meta.wrapped_number;
    map[&n] = c;
  }
  return c;
}

Node* NodeCopier::lookup(const Node& u, std::string& why) {
  auto it = map.find(&u);
  if (it != map.end()) return it->second;
  if (constant(u)) return copy(u, why);
  why = "kiln: " + u.name + " is neither saved nor recomputed";
  return nullptr;
}

}  // namespace kiln::autodiff
