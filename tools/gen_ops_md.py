#!/usr/bin/env python
"""Writes docs/ops.md from kiln's op registry (kiln._C.ops()).

    python tools/gen_ops_md.py            # rewrites docs/ops.md
    python tools/gen_ops_md.py --check    # fails if docs/ops.md is out of date (the tests run this)
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import kiln  # noqa: E402

DTYPES = {
    "pointwise": "float32, float64, float16, bfloat16, integers, bool",
    "reduction": "float32, float64, float16, bfloat16, integers, bool",
    "view": "any",
    "extern": "those torch's kernel takes",
    "composite": "as the ops it decomposes into",
    "source": "float32, float64, integers, bool",
    "gather": "those its entry covers (max_pool2d: floating; cat: any, promoted as torch)",
}


def render() -> str:
    ops = sorted(kiln._C.ops(), key=lambda o: (o["kind"], o["name"]))
    lines = [
        "# Ops",
        "",
        "Generated from kiln's op registry by `python tools/gen_ops_md.py`; do not edit by hand.",
        "Each op has one entry in `src/core/ops/` (schema, shape and dtype rule, and a lowering: loop IR,",
        "a view's index remap, a decomposition into other ops, or an extern call of torch's kernel).",
        "",
        "Torch operators with no entry here still run inside the graph: capture records them as",
        "`torch_call` extern nodes (the layout from meta tensors, the operator called at run time),",
        "so `topk`, `sort`, `cumsum`, `interpolate`, `pad`, `einsum`, advanced indexing and the rest",
        "never break the graph (and a call an entry does not cover, such as a `cat` of more than 16",
        "tensors, runs as one). In-place forms of such operators on graph inputs (`index_copy_`,",
        "`x[i] = v`) update the input where it lies when nothing else reads its old value.",
        "",
        "`tests/python/test_conformance.py` generates its cases from this registry: every pointwise op and",
        "reduction over float32, float64, float16, bfloat16, int64 and bool, empty, size-1, broadcast,",
        "transposed, expanded and 0-d operands, Python scalars, dims and keepdim, each against eager.",
        "",
        "With `kiln.compile(backend=\"eager\")` each node runs through the callable of the \"eager\"",
        "column (the op's first Python spelling that names a function or Tensor method) with the",
        "schema's arguments (a `Tensor[]` parameter as a tuple of its inputs); `placeholder`, `scalar`",
        "and `torch_call` are the graph's inputs, Python numbers and recorded torch calls, and an",
        "`arange` over constant bounds is `torch.arange`.",
        "",
        "The \"derivative\" column says whether the entry carries its reverse-mode derivative",
        "(`autodiff::build_joint`, issue 13); a composite op is differentiated through the ops it",
        "decomposes into.",
        "",
        f"{len(ops)} ops.",
        "",
        "| op | kind | lowering | derivative | dtypes | Python spellings | eager | schema |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in ops:
        py = ", ".join(f"`{p}`" for p in o["python"]) or "(internal)"
        eager = f"`{o['eager']}`" if o["eager"] else ""
        deriv = "yes" if o["derivative"] else ("via decomposition" if o["kind"] == "composite" else "")
        lines.append(f"| `{o['name']}` | {o['kind']} | {o['lowering']} | {deriv} | {DTYPES.get(o['kind'], '')} | {py} | "
                     f"{eager} | `{o['schema']}` |")
    return "\n".join(lines) + "\n"


def main() -> int:
    path = os.path.join(REPO, "docs", "ops.md")
    text = render()
    if "--check" in sys.argv:
        with open(path) as f:
            if f.read() != text:
                print("docs/ops.md is out of date: run python tools/gen_ops_md.py", file=sys.stderr)
                return 1
        return 0
    with open(path, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
