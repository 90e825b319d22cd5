"""What kiln needs to know about torch's own CPU kernels to give their results bit for bit,
found out once per process by running them (not assumed from the CPU's capability)."""
from __future__ import annotations

import struct

_CANDIDATES = (32, 64, 16)  # bytes of vector: AVX2, AVX-512, SSE/NEON


def _f32(v: float) -> float:
    return struct.unpack("f", struct.pack("f", v))[0]


def _vectorized_product(values: list, lanes: int) -> float:
    """A float32 product in the order of torch's vectorized_inner_reduction with vectors of
    `lanes` elements: 4 vector accumulators over groups of 4*lanes, combined (v0*v1)*(v2*v3)
    lane by lane, the lanes folded in order, then the remaining elements one by one."""
    n, group = len(values), 4 * lanes
    full = n // group * group
    out = 1.0
    if full:
        acc = list(values[:group])
        for start in range(group, full, group):
            acc = [_f32(a * v) for a, v in zip(acc, values[start:start + group])]
        lane = [_f32(_f32(acc[j] * acc[lanes + j]) * _f32(acc[2 * lanes + j] * acc[3 * lanes + j])) for j in range(lanes)]
        h = lane[0]
        for v in lane[1:]:
            h = _f32(h * v)
        out = _f32(out * h)
    for v in values[full:]:
        out = _f32(out * v)
    return out


def prod_vector_bytes() -> int:
    """The vector width, in bytes, with which torch's CPU `prod` folds a contiguous float32 row;
    0 if it matches none of the known kernels (kiln then multiplies in plain order)."""
    import torch

    # 256 factors near 1 (no overflow), from a fixed sequence: each candidate order rounds
    # differently somewhere.
    values = [_f32(1.0 + ((i * 7919) % 211 - 105) / 1024.0 + i / 65536.0) for i in range(256)]
    got = torch.tensor(values, dtype=torch.float32).prod().item()
    matches = [b for b in _CANDIDATES if _vectorized_product(values, b // 4) == got]
    return matches[0] if len(matches) == 1 else 0


def gelu_contiguous_f32_kernel() -> int:
    """Which form torch's float32 gelu (erf form) of a contiguous tensor of 2+ elements computes,
    told apart by +inf, 2e38 and -0.0 (its elementwise loop, for other layouts, is form 0):
      0: x * 0.5 * (1 + erf(x/sqrt2))       gives inf, 2e38, -0.0 (the same loop as elsewhere)
      1: x * (1 + erf(x/sqrt2)) * 0.5       gives NaN, inf (overflowed), -0.0
      2: x*0.5 + x*0.5 * erf(x/sqrt2)       gives inf, 2e38, +0.0
    The kernel differs between CPUs (the vector ISA torch picks); unknown results give 0."""
    import torch
    import torch.nn.functional as F

    inf, big = float("inf"), _f32(2e38)
    got = F.gelu(torch.tensor([inf, big, -0.0], dtype=torch.float32))
    first, second = got[:2].tolist()
    negative_zero = bool(got[2].signbit())
    if first != first and second == inf and negative_zero:
        return 1
    if first == inf and second == big and not negative_zero:
        return 2
    return 0


def probe() -> tuple:
    """(prod_vector_bytes(), gelu_contiguous_f32_kernel()), for kiln's code generation: run
    plainly, whatever autocast or grad mode the first compiled call finds."""
    import torch

    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        return prod_vector_bytes(), gelu_contiguous_f32_kernel()


def clamp_gradient_at_bounds() -> bool:
    """Whether torch's clamp with number bounds passes the gradient at a bound itself (torch
    2.11 does; 2.14 gives zero there, as at NaN), for kiln's derivative of clamp."""
    import torch

    with torch.enable_grad(), torch.autocast("cpu", enabled=False):
        x = torch.tensor([0.0, 1.0], requires_grad=True)
        x.clamp(0.0, 1.0).sum().backward()
        return bool((x.grad == 1).all())


def cpu_attention_like_query() -> bool:
    """Whether torch's CPU scaled_dot_product_attention gives its result the query's layout
    (torch 2.14: a row-major query, a row-major result) rather than [B, L, H, E] transposed
    to [B, H, L, E] (the flash kernel of earlier torch versions), for kiln's shape rule."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        q = torch.zeros(1, 2, 8, 4)
        return F.scaled_dot_product_attention(q, q, q).stride() == q.stride()
