// The op registry: one entry per op holds everything kiln knows about it.
//
//   schema       the torch-style signature that capture binds Python arguments against
//   kind         how the backend treats it (pointwise, reduction, view, extern, composite)
//   infer        the shape/dtype rule (symbolic sizes); pointwise/reduction ops share one
//   decompose    for composite ops: the rewrite into other ops (the PrimTorch step)
//   scalar       for pointwise ops: the scalar computation, as loop-IR scalar nodes
//   reduce/view  for reductions and views: the combine op / the index remapping
//   gather       for gather ops (pooling windows): an output element from reads of the inputs
//                at computed indices
//   aten         for extern ops: the torch operator called at run time
//   derivative   reverse mode: the gradients of the node's inputs from its result's, as graph
//                nodes (autodiff/joint_graph.h builds backward graphs from these)
//   python       the torch callables that capture maps onto this op; the first that names a
//                function or Tensor method (no {fixed} attributes) is also how the eager
//                backend runs the op, with the schema's arguments (bind/runtime/eager_backend.h)
//
// Adding an op is adding one entry to one of the tables in ops/*_ops.cpp.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/ir/graph.h"
#include "core/loop/scalar.h"

namespace kiln::ops {

using ir::Attrs;
using ir::Graph;
using ir::Node;
using ir::TensorMeta;
using sym::Expr;

enum class OpKind { Source, Pointwise, Reduction, View, Extern, Composite, Gather };

// torch's elementwise type promotion kinds.
enum class Promotion {
  Default,     // result is the promoted type of the inputs
  IntToFloat,  // integral results become the default float type (sin, exp, true division)
  AlwaysBool,  // computed in the promoted type, result is bool (comparisons)
  BoolToLong,  // bool results become int64 (sum)
  None,        // the op's own rule decides
};

enum class ReduceOp { Sum, Max, Min, Prod };

struct Param {
  std::string name;
  std::string type;      // Tensor, Tensor?, Scalar, int, int?, int[], int[]?, float, float?, bool, str, ScalarType?
  std::string dflt;      // textual default, empty when required
  bool has_default = false;
  bool kwarg_only = false;
  bool is_tensor() const { return type == "Tensor" || type == "Tensor?"; }
  // A sequence of tensors (cat's): each is one input of the node, in order; the op's only
  // tensor parameter.
  bool is_tensor_list() const { return type == "Tensor[]"; }
  bool is_int_list() const { return type.rfind("int[", 0) == 0 || is_sym_int_list(); }
  // Sizes that may be symbolic (torch's SymInt[]): the op's rules read them as expressions.
  bool is_sym_int_list() const { return type.rfind("SymInt[", 0) == 0; }
  // N for "int[N]" (a single int given for it is repeated N times), 0 for "int[]".
  size_t list_size() const;
  // The default as an attribute value; nullopt for None or no default.
  std::optional<ir::AttrValue> default_value() const;
};

struct Schema {
  std::string name;
  std::vector<Param> params;
  static Schema parse(const std::string& text);  // "add(Tensor self, Tensor other, *, Scalar alpha=1)"
  std::string str() const;
};

using InferFn = std::function<bool(const std::vector<Node*>& in, const Attrs&, TensorMeta& out, std::string& error)>;
using DecomposeFn = std::function<Node*(Graph& g, Node* n)>;
// Builds the scalar body of a pointwise op from its operands (already cast to the computation
// dtype). `out` is the node's dtype.
using ScalarFn = std::function<loop::SRef(loop::ScalarCtx& s, const std::vector<loop::SRef>& args, const Node& n)>;
// Index remapping of a view: output index -> index into the input.
using ViewFn = std::function<std::vector<Expr>(const std::vector<Expr>& out_index, const Node& n)>;
// An input of a gather op: its sizes and its element at an index (which must lie inside them:
// a gather clamps the indices of reads it then discards).
struct GatherInput {
  std::vector<Expr> sizes;
  std::function<loop::SRef(const std::vector<Expr>& index)> read;
};
// The scalar of a gather op's output element at `out_index` (in the node's dtype).
using GatherFn = std::function<loop::SRef(loop::ScalarCtx& s, const std::vector<Expr>& out_index,
                                          const std::vector<GatherInput>& in, const Node& n)>;

// Reverse mode: given node `n` and the gradient `grad` of its result (same sizes and dtype),
// adds to `g` the nodes computing the gradient of each of n's inputs, in `n->inputs` order;
// nullptr for an input that gets none (a condition, an integer index, a size). A gradient may
// have the result's broadcast sizes or dtype: build_joint sums and converts it to the input's.
using DerivativeFn = std::function<std::vector<Node*>(Graph& g, Node* n, Node* grad)>;

// What torch.autocast does to an op's floating inputs (autocast_policy.cpp).
enum class AutocastPolicy {
  None,              // nothing: the op runs in its inputs' dtypes
  LowerPrecision,    // inputs cast to autocast's dtype (float16 / bfloat16)
  Float32,           // inputs cast to float32
  Float32DtypeArg,   // dtype=float32 unless the call gives a dtype (softmax, sum, prod)
  Unknown,           // may be on torch's lists: capture does not take it under autocast
};

struct OpDef {
  std::string name;
  Schema schema;
  OpKind kind = OpKind::Pointwise;
  Promotion promotion = Promotion::Default;
  InferFn infer;
  // Which calls the entry computes (empty: all). A call it leaves out runs through torch's own
  // operator (a torch_call), as an operator with no entry does: grouped-query or dropout
  // attention, say.
  std::function<bool(const std::vector<Node*>& inputs, const Attrs& attrs)> covers;
  DecomposeFn decompose;
  ScalarFn scalar;
  ReduceOp reduce = ReduceOp::Sum;
  ViewFn view;
  GatherFn gather;
  std::string aten;
  DerivativeFn derivative;  // empty: the op has none (a graph that needs it is not differentiated)
  // torch's backward of the op reads its result (derivatives.yaml's `result`: exp, tanh,
  // sigmoid, softmax, ...): an in-place change of that result before backward() makes eager's
  // backward raise, and kiln's too (autodiff::TrainingGraphs::backward_error).
  bool saves_result = false;
  // The tensor inputs torch's backward keeps (derivatives.yaml's `self`, `other`, `mat2`):
  // `keeps_inputs[k]` lists the inputs whose gradient reads input k, and torch keeps input k
  // when one of those needs a gradient (mul(x, w) keeps w for x's gradient). An in-place change
  // of a kept input, or of a tensor it shares memory with (views share a version counter),
  // before backward() makes eager's backward raise, and kiln's too. Empty: none kept (add), or
  // not listed.
  std::vector<std::vector<size_t>> keeps_inputs;
  // The result is kept while one of these inputs needs a gradient (pow: its exponent's reads the
  // result); saves_result keeps it always.
  std::vector<size_t> keeps_result_for;
  std::vector<std::string> python;
  std::string doc;
  // The result may share memory with the first input in eager (views, and composites such as
  // t and flatten that decompose into views): in-place updates must see through it.
  bool may_alias = false;
  bool aliases() const { return may_alias || kind == OpKind::View; }
  // A view op whose result is a copy for some layouts (reshape of memory no strides can
  // describe): true for those nodes. nullptr: every node of the op is a view in eager.
  bool (*copies)(const Node& n) = nullptr;  // reshape_copies for reshape and flatten
  // Operand dtypes torch has no kernel for (eager raises NotImplementedError there).
  enum class Operands { Any, NoBool, FloatOnly } operands = Operands::Any;
  // Tensor parameters that take no Python number (torch.maximum(x, 2) is a TypeError).
  bool tensors_only = false;
  // The tensor list's 1-d empty tensors are skipped beside tensors of other ranks, as torch's
  // cat skips them (legacy: a KV cache started as torch.tensor([]) and grown with cat); capture
  // leaves them out of the op's inputs where they change nothing else (dtype, autograd).
  bool skips_empty_1d = false;
  // Extern inputs torch's kernel wants with a unit innermost stride: a view of kiln's that
  // strides otherwise (a broadcast mask whose last dim strides by 0) is given as a row-major
  // copy. torch's fused attention on the GPU refuses such an attn_mask and takes its math
  // path, several times slower and, in a backward, through autograd's graph of it.
  std::vector<size_t> unit_stride_inputs;
  // Runs even when nothing uses its result: its kernel may raise what its shape rule cannot
  // know (torch_call: torch's kernel rejects a dtype its meta kernel accepted), and eager
  // raises that whether or not the result is used.
  bool (*keep_unused)(const Node& n) = nullptr;
  AutocastPolicy autocast_cuda = AutocastPolicy::None, autocast_cpu = AutocastPolicy::None;
};

// Whether reshape node `n` (or a flatten, which is one) copies: no strides view its input's
// memory at its sizes, as torch's reshape decides.
bool reshape_copies(const ir::Node& n);

const OpDef* find_op(const std::string& name);
std::vector<const OpDef*> all_ops();

// Shared shape rules the tables build on.
bool broadcast_shapes(const std::vector<std::vector<Expr>>& shapes, std::vector<Expr>& out, std::string& error);
// The strides of a pointwise result, as torch's TensorIterator lays it out from its operands'.
// `compute`: the dtype the operands are promoted to (an operand of another dtype counts with
// the layout of its converted copy); the first `uncast` operands are read as they are (where's
// condition).
std::vector<Expr> pointwise_strides(const std::vector<Expr>& sizes, const std::vector<Node*>& in,
                                    std::optional<DType> compute = std::nullopt, size_t uncast = 0);
// The strides torch.preserve_format gives a copy of x (clone, .to()).
std::vector<Expr> preserved_strides(const TensorMeta& x);
// Whether x.suggest_memory_format() is torch.channels_last: a 4-d tensor whose strides order its
// dims N, H, W, C (with torch's tie-breaks for dims of size 1). Sizes or strides not known as
// numbers suggest the default, row-major format.
bool suggests_channels_last(const TensorMeta& x);
// Dense channels-last strides of a 4-d shape [N, C, H, W]: C fastest, then W, H, N.
std::vector<Expr> channels_last_strides(const std::vector<Expr>& sizes);
// The same for 5-d tensors (torch.channels_last_3d: N, D, H, W, C in memory).
bool suggests_channels_last_3d(const TensorMeta& x);
std::vector<Expr> channels_last_3d_strides(const std::vector<Expr>& sizes);
bool infer_pointwise(const OpDef& op, const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& error);
bool infer_reduction(const OpDef& op, const std::vector<Node*>& in, const Attrs& a, TensorMeta& out, std::string& error);
// Normalises a possibly negative dim against rank; false (with torch's message) if out of range.
bool wrap_dim(int64_t& dim, int64_t rank, std::string& error);
void set_autocast_policies(std::map<std::string, OpDef>& ops);
// Whether torch has a matrix-product kernel for a's dtype on a's device (else err, as torch's).
bool has_matmul_kernel(const TensorMeta& a, const std::string& op, std::string& err);
// torch's name of a dtype in its kernel errors: 'Float', 'Long', 'Bool', ...
const char* torch_dtype_name(DType t);
// The dtype a pointwise op computes in, from its inputs' promotion.
DType pointwise_common_dtype(const std::vector<Node*>& in);
// torch.get_default_dtype() of the graph being built: what integer inputs promote to with a
// Python float, and what true division and float-only ops of integers give. Float32 unless a
// DefaultFloatScope on this thread says otherwise (the binding sets one per entry it builds).
DType default_float();
class DefaultFloatScope {
 public:
  explicit DefaultFloatScope(DType t);
  ~DefaultFloatScope();
  DefaultFloatScope(const DefaultFloatScope&) = delete;
  DefaultFloatScope& operator=(const DefaultFloatScope&) = delete;

 private:
  DType before_;
};

// The tables, one per family of ops (ops/*_ops.cpp); the registry fills itself from them on
// first use, so no table can be dropped by the linker.
std::vector<OpDef> pointwise_ops();
std::vector<OpDef> reduction_ops();
std::vector<OpDef> view_ops();
std::vector<OpDef> torch_call_ops();
std::vector<OpDef> linalg_ops();
std::vector<OpDef> composite_ops();
std::vector<OpDef> nn_ops();
std::vector<OpDef> join_ops();
std::vector<OpDef> random_ops();

// An op that runs as a call of the torch operator `aten` (shape rule `infer`).
OpDef extern_op(const std::string& name, const std::string& schema, const std::string& aten, InferFn infer,
                std::vector<std::string> python);

// What kiln's entries must match that differs between the torch versions kiln supports, found
// out by running torch once per process (bind/runtime: kiln/_torch_kernels.py) before a graph
// that needs it is built.
struct TorchFacts {
  bool clamp_gradient_at_bounds = false;  // clamp(x, lo, hi)'s gradient at x == lo or hi: 1, else 0
  // torch's CPU scaled_dot_product_attention lays its result out as the query (torch 2.14),
  // else as [B, L, H, E] transposed to [B, H, L, E] (the flash kernel of earlier versions).
  bool cpu_attention_like_query = true;
};
TorchFacts& torch_facts();

// The derivative of an op that torch's own kernel `aten` computes (a convolution, a pooling,
// attention): per input that needs one, an `aten_vjp` node that the runtime answers by calling
// the kernel again with grad on and asking torch's autograd for that input's gradient.
DerivativeFn aten_vjp_derivative(const std::string& aten);

// A training-mode batch_norm's new running statistics (mean, var) from its input `x`, as torch's
// kernel updates them in place; capture writes them back into the buffers.
std::pair<Node*, Node*> batch_norm_running_update(Graph& g, Node* x, Node* running_mean, Node* running_var, double momentum);

// Gives a composite op the shape rule of its decomposition (run on a scratch graph).
void infer_by_decomposition(OpDef& d);

// An op rewritten into simpler ones by `decompose` (no promotion of its own); its shape rule
// is the decomposition's, given by infer_by_decomposition.
OpDef composite_op(const std::string& name, const std::string& schema, DecomposeFn decompose,
                   std::vector<std::string> python);
std::vector<OpDef> source_ops();
std::vector<OpDef> custom_function_ops();
// After the joint graph is built: autograd.Function results (custom_vjp) become the forward's
// result, and their gradient templates leave the graph (custom_function_ops.cpp).
void remove_custom_vjps(Graph& g);

}  // namespace kiln::ops
