// The graph IR: a DAG of tensor operations in topological order, FX-like.
//
// A Node names an op of the registry (ops/registry.h), its tensor inputs, its non-tensor
// arguments as attributes, and the metadata of the tensor it produces (dtype, device, symbolic
// sizes and strides). Graph inputs are `placeholder` nodes; Python numbers are `scalar` nodes.
// Nodes are owned by their graph and kept in a valid topological order at all times.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/ir/dtype.h"
#include "core/sym/expr.h"

namespace kiln::ops {
struct OpDef;
}

namespace kiln::ir {

using sym::Expr;
using ops::OpDef;

struct TensorMeta {
  DType dtype = DType::Float32;
  Device device;
  std::vector<Expr> sizes;
  std::vector<Expr> strides;
  Expr offset = 0;            // storage offset in elements (views of inputs)
  bool wrapped_number = false;  // a Python number: takes part in promotion by category only

  int64_t dim() const { return static_cast<int64_t>(sizes.size()); }
  Expr numel() const { return sym::product(sizes); }
  std::string str() const;  // "f32[4, 8]"
};

std::vector<Expr> contiguous_strides(const std::vector<Expr>& sizes);
// torch's is_contiguous(): row-major wherever it matters (dims of one element and empty tensors
// take any strides). Symbolic sizes are taken as not 1, so it may say no where torch says yes.
bool is_contiguous(const std::vector<Expr>& sizes, const std::vector<Expr>& strides);

// sym::Expr: a size that may be symbolic (size_value's expression).
// std::vector<sym::Expr>: a list of sizes some of which are symbolic (a decomposition's reshape).
using AttrValue =
    std::variant<int64_t, double, bool, std::vector<int64_t>, std::string, DType, sym::Expr, std::vector<sym::Expr>>;

// A list of sizes as an attribute: plain ints when all are constant, else expressions.
AttrValue sizes_attr(const std::vector<Expr>& sizes);

// Non-tensor arguments, in schema order. Few per node, so a flat list beats a map.
class Attrs {
 public:
  void set(const std::string& key, AttrValue v);
  bool has(const std::string& key) const;
  const AttrValue* find(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t dflt = 0) const;
  double get_float(const std::string& key, double dflt = 0) const;  // ints convert
  bool get_bool(const std::string& key, bool dflt = false) const;
  std::vector<int64_t> get_ints(const std::string& key) const;
  std::string get_str(const std::string& key, const std::string& dflt = "") const;
  std::optional<DType> get_dtype(const std::string& key) const;
  sym::Expr get_expr(const std::string& key) const;  // an int converts; invalid Expr if absent
  std::vector<Expr> get_exprs(const std::string& key) const;  // int lists convert
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  std::string str() const;
  bool operator==(const Attrs& o) const { return items_ == o.items_; }

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;
};

std::string attr_str(const AttrValue& v);

struct Node {
  int id = 0;
  const OpDef* op = nullptr;
  std::string name;             // unique in the graph: "sin", "sin_1", ...
  std::vector<struct Node*> inputs;  // tensor operands; nullptr for an absent optional tensor
  Attrs attrs;
  TensorMeta meta;
  std::vector<struct Node*> users;
  std::string source_loc;       // "file.py:12" of the Python code that made it, if known

  const std::string& op_name() const;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Appends a node; shape/dtype inference runs through the op's rule. On a rule violation the
  // node is not added and `error` is set (with the message torch would give, where known).
  Node* add(const std::string& op, std::vector<Node*> inputs, Attrs attrs, std::string& error);
  Node* add(const OpDef* op, std::vector<Node*> inputs, Attrs attrs, std::string& error);
  // As add(), for code that builds nodes it knows are valid (decompositions): throws on error.
  Node* must_add(const std::string& op, std::vector<Node*> inputs, Attrs attrs = {});

  Node* placeholder(const std::string& name, const TensorMeta& meta);
  Node* scalar(double v, DType t);  // a Python number
  Node* int_scalar(int64_t v);      // a Python int, exactly (2**63 - 1 has no double)
  // A size as a number (a mean's count): a scalar when constant, else a size_value node.
  Node* size_value(const Expr& e, DType t);

  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  const std::vector<Node*>& inputs() const { return inputs_; }
  std::vector<Node*>& outputs() { return outputs_; }
  const std::vector<Node*>& outputs() const { return outputs_; }

  // Rewires every use of `from` (including outputs) to `to`.
  void replace_all_uses(Node* from, Node* to);
  // Removes nodes with no users that are not outputs or placeholders, keeping order.
  void erase_if(const std::function<bool(const Node*)>& pred);
  // Moves nodes appended after position `at` to just before the node at `at` (used by passes
  // that expand one node into several and must keep topological order).
  void move_tail_before(size_t tail_start, const Node* before);
  void recompute_users();
  // Replaces size symbols by expressions (specialized ones by their values) in every node's
  // sizes, strides, offset and size attributes.
  void substitute_sizes(const std::map<Expr, Expr>& repl);

  std::string str() const;          // FX-like readable form
  size_t op_count() const;          // nodes that are not placeholders/scalars
  std::string source_loc;           // set on nodes created while it is non-empty
  // Size symbols that are Python ints the caller passes (a position, a length) rather than the
  // size of an input dim: the runtime hands their values to the program, in this order.
  std::vector<Expr> scalar_symbols;
  // Python floats the runtime reads at each call (an optimizer's learning rate, which a
  // scheduler changes every step): scalar_input nodes 0..scalar_inputs-1, passed as doubles
  // after the int symbols' values.
  int scalar_inputs = 0;
  // In-place updates of inputs (graph input, graph output holding its final value): the runtime
  // makes the input hold that value after the graph; the program may store it there directly.
  std::vector<std::pair<int, int>> input_updates;
  // Inputs whose values rarely change between calls (parameters and buffers of an inference
  // graph), by input index; empty: none. What the graph computes from these alone moves into
  // a prologue the runtime runs again only when one of them changed (passes::split_prologue).
  std::vector<bool> stable_inputs;
  // Outputs only kiln reads back (values a training forward saves for its backward), by output
  // index; empty: none. Their layout may be the one their producer writes (a convolution's
  // channels-last result, not a row-major copy of it): passes::saved_in_producer_layout, and
  // autodiff::adopt_saved_layouts makes the backward read that layout.
  std::vector<bool> free_layout_outputs;

 private:
  std::string unique_name(const std::string& base);
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Node*> inputs_;
  std::vector<Node*> outputs_;
  std::vector<std::pair<std::string, int>> name_counts_;
  int next_id_ = 0;
};

}  // namespace kiln::ir
