// The loop-level IR: what a compiled graph does at run time, independent of CPU or GPU.
//
// A Program is a list of steps over buffers. A step is a Kernel (generated code) or an Extern
// (a torch operator such as mm). A Kernel iterates over an outer space of index variables; at
// each outer point it runs its stages in order:
//   Reduce  an inner loop that folds a value into an accumulator (readable later as Acc)
//   Loop    an inner loop of stores (empty inner space: stores at the outer point)
// This is enough for pointwise chains, reductions with fused prologues and epilogues, and
// row-wise fusions like softmax (two reductions and a pointwise loop in one kernel).
#pragma once
#include <string>
#include <vector>

#include "core/ir/graph.h"
#include "core/loop/scalar.h"
#include "core/ops/registry.h"

namespace kiln::loop {

using sym::Expr;

enum class BufferKind { Input, Output, Temp };

struct Buffer {
  int id = 0;
  std::string name;          // in0, out0, buf3
  DType dtype = DType::Float32;
  Device device;
  std::vector<Expr> sizes, strides;
  Expr offset = 0;
  BufferKind kind = BufferKind::Temp;
  int io_index = -1;         // graph input / output position
  int slot = -1;             // Temp: the allocation slot it shares (buffer reuse)
  bool live = true;          // false once fusion removed every access
  // Stored though nothing reads it: computing it may raise (an integer division by zero on the
  // CPU), as eager's unused result would. Fusion keeps its stores.
  bool keep = false;
  // (GPU) Its pointer is a multiple of 16 bytes at every run: kiln allocates it, or the executor
  // copies it (an input) or lays it out (a torch result) when it is not (schedule::mark_aligned).
  bool aligned = false;
  Expr bytes() const;        // bytes spanned by the layout
};

struct Store {
  int buffer;
  Expr index;
  SRef value;
};

struct Stage {
  enum class Kind { Reduce, Loop } kind = Kind::Loop;
  std::vector<Expr> vars, ranges;  // the inner loop (empty: runs once at the outer point)
  // Reduce
  int acc = -1;
  ops::ReduceOp reduce = ops::ReduceOp::Sum;
  DType acc_dtype = DType::Float32;
  SRef value = -1;
  // A floating product whose innermost var walks a block of stride 1 of its input: the CPU
  // code folds it as torch's vectorized kernel does (four vectors of lanes, then across).
  bool torch_vector_block = false;
  // The reduction's result dtype. A product of 16-bit floats: torch's CPU kernel multiplies in
  // that type, rounding after every multiply, where its CUDA kernel accumulates in float; each
  // code generator follows its device's.
  DType result_dtype = DType::Float32;
  // Loop
  std::vector<Store> stores;
};

struct Kernel {
  std::string name;
  std::vector<Expr> vars, ranges;  // outer space
  std::vector<Stage> stages;
  std::vector<std::string> ops;    // graph ops fused here, for names and explain
  std::vector<int> buffers;        // buffers it touches, in argument order
};

// A view of a buffer handed to an extern op.
struct BufferView {
  int buffer = -1;  // -1: an absent optional tensor
  std::vector<Expr> sizes, strides;
  Expr offset = 0;
};

struct Extern {
  std::string op;     // registry name
  std::string aten;   // "aten::mm"
  std::vector<BufferView> inputs;
  int output = -1;
  ir::Attrs attrs;
  std::string label() const;  // torch's operator, or the torch callable a torch_call runs
};

struct Step {
  enum class Kind { Kernel, Extern } kind;
  int index;
};

struct Output {
  // The value returned: a view of a buffer (usually a whole Output buffer).
  BufferView view;
  int input_alias = -1;  // when the output is a graph input returned as is
  // The output is a view op's result (x.view(...), x[:]): a tensor object of its own in eager,
  // even where it covers its base exactly as it is laid out.
  bool view_op = false;
};

// A size symbol's value at run time: the size of dim `dim` of graph input `input`.
struct SymbolBinding {
  Expr symbol;
  int input = 0;  // the input whose dim `dim` has this size; -1: the `dim`-th scalar (a Python int)
  int dim = 0;
};

// Flat pointwise kernels, each over its own contiguous buffers, launched as one kernel over a
// table of their buffers and scalar arguments, as torch's multi-tensor kernels are (one
// parameter's optimizer update and the next one's). Members whose bodies are the same once
// their buffers and arguments are numbered by first use share a variant: the kernel holds each
// variant's body once (two parameters of one shape that fusion put in one kernel are a variant
// of their own). Members are consecutive steps that do not read what an earlier member writes.
struct ForeachGroup {
  std::string name;
  std::vector<int> kernels;               // members, in step order
  std::vector<std::vector<int>> buffers;  // per member: its buffers, in its variant's body order
  std::vector<std::vector<int>> args;     // per member: its scalar arguments, in that order
  std::vector<int64_t> points;            // per member: its flat extent
  std::vector<int> variant;               // per member: its variant
  std::vector<int> variant_member;        // per variant: the first member that has it (its body)
};

struct Program {
  ScalarCtx exprs;
  // The size symbols of a shape-generic program, in the order kernels receive their values
  // (empty: every size is a constant). Each is read from the first input dim it names.
  std::vector<SymbolBinding> symbols;
  std::vector<Expr> scalar_symbols;  // the graph's Python-int symbols, in the order the runtime passes them
  // The graph's scalar inputs (Python floats read per call): SOp::Arg 0..scalar_args-1. The
  // runtime passes their values as doubles right after the int symbols' values.
  int scalar_args = 0;
  std::vector<Buffer> buffers;
  std::vector<Kernel> kernels;
  std::vector<Extern> externs;
  std::vector<Step> steps;
  std::vector<int> inputs;       // buffer of each graph input
  std::vector<Output> outputs;
  // Graph inputs the program updates (graph input, graph output holding its new value), as
  // Graph::input_updates: write_updates_in_place may store such an output into the input.
  std::vector<std::pair<int, int>> input_updates;
  std::vector<ForeachGroup> foreach_groups;  // CUDA programs: kernels launched together
  int num_slots = 0;             // temp allocation slots after reuse planning
  Device device;

  int add_buffer(Buffer b);
  std::string str() const;       // readable dump (KILN_DEBUG)
  // The first step that writes a graph input's memory (an update stored in place, a torch call
  // made in place; an index into `steps`), or -1: a call that fails at an earlier step has
  // changed nothing the caller holds.
  int first_step_writing_inputs() const;
  // Whether a kernel may find a CPU integer division or remainder by zero (recorded in the
  // library's flag, raised by the executor after that kernel as torch's ZeroDivisionError).
  bool may_raise() const;
};

// The scalar arguments (SOp::Arg indices) kernel `k` reads, ascending: a CUDA kernel takes
// just these as parameters, however many the program has.
std::vector<int> scalar_args_of(const Program& p, const Kernel& k);

// Whether kernel `k` reduces columns: every looping stage a reduction over one shared space,
// the other stages stores at the outer points, and its reduced loads walking the innermost
// outer var by one and the innermost reduced var by more (a bias's gradient summed over rows,
// a channels-last batch norm's statistics over N, H and W); a load of the reduced points alone
// (a saved row statistic) is one address for every output. Code generators give such kernels
// neighbouring outputs side by side (GPU lanes, CPU vector lanes) so the loads stay contiguous.
bool reduces_columns(const Program& p, const Kernel& k);

}  // namespace kiln::loop
