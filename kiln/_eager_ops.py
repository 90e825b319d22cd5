"""Python callables for kiln ops that have no torch function of the same signature, for
kiln.compile(backend="eager"), which runs a captured graph through torch one op at a time."""
import torch


def dropout(input, seed, p=0.5, offset=0):
    """kiln's training-mode dropout node: torch's own F.dropout (torch's generator draws the
    mask, as eager's would; the graph's seed input is for kiln's kernels only)."""
    return torch.nn.functional.dropout(input, p, True)


def random_uniform(seed, size, dtype, device, offset=0):
    """torch.rand in a graph: torch's own draw (torch's generator, as eager's)."""
    return torch.rand(size, dtype=dtype, device=device)


def random_normal(seed, size, dtype, device, offset=0):
    """torch.randn in a graph: torch's own draw."""
    return torch.randn(size, dtype=dtype, device=device)


def random_int(seed, size, low, high, dtype, device, offset=0):
    """torch.randint in a graph: torch's own draw."""
    return torch.randint(low, high, size, dtype=dtype, device=device)
