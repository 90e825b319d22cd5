"""PYTEST_DONT_REWRITE: assertions inside the compiled functions stay plain asserts.

Regressions found on real models (Hugging Face, detectron2, timm, torchrec-like code, ...),
ported from TorchDynamo's test/dynamo/_repros_part1..3.py (rewritten, not copied; cases about
Dynamo's own internals, config flags, logging, export, FX graph text, custom backends, Triton and
CUDA are left out, and so are those test_capture_semantics.py already has).

Every case runs the code eagerly and under kiln.compile on fresh inputs (twice, so a stale guard
shows), compares results, raised exception types and what the call did to its arguments; where a
case is about capture, kiln's graph / break counts are compared with torch._dynamo.explain's on the
same code (kiln may have fewer, never more)."""
import abc
import collections
import collections.abc
import contextlib
import copy
import dataclasses
import enum
import functools
import gc
import inspect
import itertools
import math
import os
import random
import threading
import typing
import weakref

import numpy as np
import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn as nn
import torch.nn.functional as F

import kiln

# helpers
# ----------------------------------------------------------------------------------------------

from _port_check import (check, clone_tree, dynamo_counts, dynamo_frames, kiln_counts, not_more_than_dynamo,  # noqa: F401
                         outcome, recompiles, same, t)




def both(fn, make_args, calls=2, **kw):
    """Eager and kiln results on copies of the same args, for checks `check` cannot make."""
    c = kiln.compile(fn, **kw)
    out = []
    for _ in range(calls):
        args = make_args()
        ea, ka = clone_tree(args), clone_tree(args)
        out.append((fn(*ea), c(*ka), ea, ka))
    return out


# ==============================================================================================
# model code the repros share (after detectron2, Hugging Face, timm; rewritten)
# ==============================================================================================

def paste_mask(masks, boxes, img_h: int, img_w: int, skip_empty: bool = True):
    if skip_empty:
        x0_int, y0_int = torch.clamp(boxes.min(dim=0).values.floor()[:2] - 1, min=0).to(dtype=torch.int32)
        x1_int = torch.clamp(boxes[:, 2].max().ceil() + 1, max=img_w).to(dtype=torch.int32)
        y1_int = torch.clamp(boxes[:, 3].max().ceil() + 1, max=img_h).to(dtype=torch.int32)
    else:
        x0_int, y0_int = 0, 0
        x1_int, y1_int = img_w, img_h
    x0, y0, x1, y1 = torch.split(boxes, 1, dim=1)
    n = masks.shape[0]
    img_y = torch.arange(y0_int, y1_int, dtype=torch.float32) + 0.5
    img_x = torch.arange(x0_int, x1_int, dtype=torch.float32) + 0.5
    img_y = (img_y - y0) / (y1 - y0) * 2 - 1
    img_x = (img_x - x0) / (x1 - x0) * 2 - 1
    gx = img_x[:, None, :].expand(n, img_y.size(1), img_x.size(1))
    gy = img_y[:, :, None].expand(n, img_y.size(1), img_x.size(1))
    grid = torch.stack([gx, gy], dim=3)
    if not masks.dtype.is_floating_point:
        masks = masks.float()
    out = F.grid_sample(masks, grid.to(masks.dtype), align_corners=False)
    if skip_empty:
        return out[:, 0], (slice(y0_int, y1_int), slice(x0_int, x1_int))
    return out[:, 0], ()


class Boxes:
    def __init__(self, tensor):
        tensor = torch.as_tensor(tensor, dtype=torch.float32, device=tensor.device)
        if tensor.numel() == 0:
            tensor = tensor.reshape((-1, 4)).to(dtype=torch.float32)
        if not (tensor.dim() == 2 and tensor.size(-1) == 4):
            raise AssertionError(tensor.size())
        self.tensor = tensor

    def __len__(self):
        return self.tensor.shape[0]


def d2_cat(tensors, dim=0):
    if len(tensors) == 1:
        return tensors[0]
    return torch.cat(tensors, dim)


def boxes_to_pooler_format(box_lists):
    boxes = torch.cat([b.tensor for b in box_lists], dim=0)
    sizes = torch.as_tensor([b.__len__() for b in box_lists], device=boxes.device)
    idx = torch.repeat_interleave(torch.arange(len(box_lists), dtype=boxes.dtype), sizes)
    return d2_cat([idx[:, None], boxes], dim=1)


class ReversibleFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, layers, attention_mask, head_mask, all_hidden, output_hidden):
        buckets = ()
        hidden, attn = torch.chunk(hidden, 2, dim=-1)
        for layer in layers:
            if output_hidden is True:
                all_hidden.append(hidden)
            attn = layer(attn)
            buckets = buckets + (attn,)
        if output_hidden is True:
            all_hidden.append(hidden)
        ctx.save_for_backward(attn.detach(), hidden.detach())
        ctx.layers = layers
        ctx.buckets = buckets
        ctx.head_mask = head_mask
        return torch.cat([attn, hidden], dim=-1)

    @staticmethod
    def backward(ctx, grad):
        _, grad_hidden = torch.chunk(grad, 2, dim=-1)
        return grad_hidden, None, None, None, None, None


EncoderOutput = collections.namedtuple("EncoderOutput", ["hidden_states", "all_hidden_states", "past"])


class ReformerLikeEncoder(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.dropout = 0.5
        self.layer_norm = nn.LayerNorm(2 * d, eps=1e-12)
        self.layers = [nn.Linear(d, d)]  # a plain list, not a ModuleList, as in the model

    def forward(self, hidden, attention_mask=None, head_mask=[None] * 6, output_hidden=False):
        all_hidden = []
        past = [((None), (None)) for _ in range(len(self.layers))]
        hidden = torch.cat([hidden, hidden], dim=-1)
        hidden = ReversibleFn.apply(hidden, self.layers, attention_mask, head_mask, all_hidden, output_hidden)
        hidden = self.layer_norm(hidden)
        hidden = F.dropout(hidden, p=self.dropout, training=self.training)
        return EncoderOutput(hidden, all_hidden, past)


def longformer_chunk(hidden, window_overlap=8):
    hidden = hidden.view(hidden.size(0), hidden.size(1) // (window_overlap * 2), window_overlap * 2, hidden.size(2))
    size = list(hidden.size())
    size[1] = size[1] * 2 - 1
    stride = list(hidden.stride())
    stride[1] = stride[1] // 2
    return hidden.as_strided(size=size, stride=stride)


class PartialT5(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.d, self.h = d, heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, hidden, key_value_states=None, past_key_value=None, query_length=None):
        batch, seq = hidden.shape[:2]
        real_len = seq
        if past_key_value is not None:
            if len(past_key_value) != 2:
                raise AssertionError("two past states")
            real_len += past_key_value[0].shape[2] if query_length is None else query_length

        def shape(s):
            return s.view(batch, -1, self.h, self.d // self.h).transpose(1, 2)

        def project(h, layer, kv, past):
            if kv is None:
                h = shape(layer(h))
            elif past is None:
                h = shape(layer(kv))
            if past is not None:
                h = torch.cat([past, h], dim=2) if kv is None else past
            return h

        q = shape(self.q(hidden))
        k = project(hidden, self.k, key_value_states, past_key_value[0] if past_key_value is not None else None)
        v = project(hidden, self.v, key_value_states, past_key_value[1] if past_key_value is not None else None)
        return torch.matmul(q, k.transpose(3, 2)), v


def chunked_forward(forward_fn, *inputs):
    shape1 = inputs[0].shape[1]
    if not all(t.shape[1] == shape1 for t in inputs):
        raise AssertionError("same shape[1]")
    if len(inspect.signature(forward_fn).parameters) != len(inputs):
        raise ValueError("arity")
    return forward_fn(*inputs)


class ChunkFeedForward(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.layer_norm = nn.LayerNorm(d, eps=1e-12)
        self.dense = nn.Linear(d, d)
        self.output = nn.Linear(d, d)

    def forward(self, x):
        return chunked_forward(self.forward_chunk, x + 1)

    def forward_chunk(self, h):
        return self.output(self.dense(self.layer_norm(h)))


class MamlInner(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 5)

    def forward(self, x, ignored=None, bn_training=False):
        return self.linear(x.view(x.shape[0], -1))


class PartialMaml(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = MamlInner()
        self.update_step_test = 4
        self.update_lr = 0.4

    def forward(self, x_spt, y_spt, x_qry, y_qry):
        querysz = x_qry.size(0)
        corrects = [0 for _ in range(self.update_step_test + 1)]
        net = copy.deepcopy(self.net)
        logits = net(x_spt)
        loss = F.cross_entropy(logits, y_spt)
        grad = torch.autograd.grad(loss, net.parameters())
        fast_weights = [p[1] - self.update_lr * p[0] for p in zip(grad, net.parameters())]
        with torch.no_grad():
            pred = F.softmax(net(x_qry, net.parameters(), bn_training=True), dim=1).argmax(dim=1)
            corrects[0] = corrects[0] + torch.eq(pred, y_qry).sum().item()
        with torch.no_grad():
            pred = F.softmax(net(x_qry, fast_weights, bn_training=True), dim=1).argmax(dim=1)
            corrects[1] = corrects[1] + torch.eq(pred, y_qry).sum().item()
        del net
        return torch.tensor(corrects) / querysz


class ModelOutput(collections.OrderedDict):
    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def __setattr__(self, name, value):
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


def rand_mask_from_inputs(from_blocked_mask, to_blocked_mask, rand_attn, heads, rand_blocks, batch,
                          from_seq_length, from_block_size):
    windows = from_seq_length // from_block_size - 2
    m = torch.stack([p1[i1.flatten()] for p1, i1 in zip(to_blocked_mask, rand_attn)])
    m = m.view(batch, heads, windows, rand_blocks * from_block_size)
    return torch.einsum("blq,bhlk->bhlqk", from_blocked_mask[:, 1:-1], m)


class SequentialAppendList(nn.Sequential):
    def forward(self, x, concat_list):
        for i, module in enumerate(self):
            concat_list.append(module(x) if i == 0 else module(concat_list[-1]))
        return torch.cat(concat_list, dim=1), concat_list


class BatchNormAct2d(nn.BatchNorm2d):
    def __init__(self, num_features, act_layer=nn.ReLU, inplace=True):
        super().__init__(num_features)
        self.act = act_layer(inplace=inplace)

    def _forward_python(self, x):
        return super().forward(x)

    def forward(self, x):
        return self.act(self._forward_python(x))


def parameter_dtype(module):
    try:
        return next(module.parameters()).dtype
    except StopIteration:
        def tensor_attrs(m):
            return [(k, v) for k, v in m.__dict__.items() if torch.is_tensor(v)]
        return next(module._named_members(get_members_fn=tensor_attrs))[1].dtype


class ReformerConfig:
    attn_layers = ["local", "lsh", "local", "lsh", "local", "lsh"]
    lsh_attn_chunk_length = 64
    local_attn_chunk_length = 48


def min_chunk_len(config):
    kinds = set(config.attn_layers)
    if len(kinds) == 1 and config.attn_layers[0] == "lsh":
        return config.lsh_attn_chunk_length
    if len(kinds) == 1 and config.attn_layers[0] == "local":
        return config.local_attn_chunk_length
    if len(kinds) == 2 and kinds == {"lsh", "local"}:
        return min(config.lsh_attn_chunk_length, config.local_attn_chunk_length)
    raise NotImplementedError(config.attn_layers)


def stable_argsort(v, dim):
    offset = torch.arange(v.shape[dim]).view(1, 1, -1).expand(v.shape)
    return torch.argsort(v.shape[dim] * v + (offset % v.shape[dim]), dim=dim)


def sorted_bucket_idx(buckets):
    with torch.no_grad():
        s = stable_argsort(buckets, dim=-1)
        idx = torch.arange(s.shape[-1]).view(1, 1, -1).expand(s.shape)
        undo = s.new(*s.size())
        undo.scatter_(-1, s, idx)
    return s, undo


class ProcList(list):
    def __call__(self, x):
        for p in self:
            x = p(x)
        return x

    def clear(self):
        pass


class RestrictedList(list):
    def __call__(self, x):
        for p in self:
            x = p(x)
        return x

    def length_times_10(self):
        return len(self) * 10

    def append_twice(self, x):
        self.extend([x, x])


def merge_processor_lists(default_list, custom_list):
    if len(custom_list) == 0:
        return default_list
    for d in default_list:
        for c in custom_list:
            if type(c) is type(d):
                raise ValueError("duplicate")
    default_list.extend(custom_list)
    return default_list


def validate_model_kwargs(fn, model_kwargs):
    unused = []
    names = set(inspect.signature(fn).parameters)
    for k, v in model_kwargs.items():
        if v is not None and k not in names:
            unused.append(k)
    if unused:
        raise ValueError(f"unused model_kwargs {unused}")


class XSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, mask, dim):
        ctx.dim = dim
        rmask = ~(mask.to(torch.bool))
        out = inp.masked_fill(rmask, torch.tensor(torch.finfo(inp.dtype).min))
        out = torch.softmax(out, ctx.dim)
        out.masked_fill_(rmask, 0)
        ctx.save_for_backward(out, rmask)
        return out

    @staticmethod
    def backward(ctx, g):
        out, _ = ctx.saved_tensors
        return torch._softmax_backward_data(g, out, ctx.dim, out.dtype), None, None


class ListConfigLike:
    class ValueNode:
        def __init__(self, value):
            self.value = value

        def _dereference_node(self):
            return self

        def _is_missing(self):
            return False

        def _value(self):
            return self.value

    class ListIterator(collections.abc.Iterator):
        def __init__(self, lst, resolve):
            self.resolve = resolve
            self.iterator = iter(lst.__dict__["_content"])
            self.index = 0

        def __next__(self):
            x = next(self.iterator)
            if self.resolve:
                x = x._dereference_node()
                if x._is_missing():
                    raise AssertionError
            self.index = self.index + 1
            if isinstance(x, ListConfigLike.ValueNode):
                return x._value()
            raise AssertionError

    def __iter__(self):
        return self._iter_ex(True)

    def _iter_ex(self, resolve):
        try:
            return ListConfigLike.ListIterator(self, resolve)
        except Exception:
            raise AssertionError from None

    def __init__(self):
        self._content = [ListConfigLike.ValueNode(1), ListConfigLike.ValueNode(3),
                         ListConfigLike.ValueNode(torch.tensor([7.0]))]


class FeedForward(nn.Module):
    def __init__(self, d, ff, act, p):
        super().__init__()
        self.linear1, self.act, self.drop1 = nn.Linear(d, ff), act, nn.Dropout(p)
        self.linear2, self.drop2 = nn.Linear(ff, d), nn.Dropout(p)

    def forward(self, x):
        return self.drop2(self.linear2(self.drop1(self.act(self.linear1(x)))))


class EncoderLayer(nn.Module):
    def __init__(self, d, heads, ff=64, p=0.1, act=nn.ReLU()):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads, dropout=p)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.dropout = nn.Dropout(p)
        self.ff = FeedForward(d, ff, act, p)

    def forward(self, src, src_mask=None, pad_mask=None):
        x = src
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, attn_mask=src_mask, key_padding_mask=pad_mask,
                                                       need_weights=False)[0]))
        return self.norm2(x + self.ff(x))


class ShapeCheckModule(nn.Module):
    def inner_fn(self, left, right):
        return tuple(left) == tuple(right)

    def fn(self, tensor):
        if type(tensor) is int:
            return False
        torch.add(tensor, tensor)
        return self.inner_fn(tensor.shape, (1, 2, 3))


class IncByOne:
    def __init__(self, x):
        self.x = x + 1


class IncByTwo:
    def __init__(self, x):
        self.x = x + 2


def maybe(fn):
    @functools.wraps(fn)
    def inner(x, *args, **kwargs):
        if x is None:
            return x
        return fn(x, *args, **kwargs)
    return inner


def global_fn(x):
    return torch.sin(x)


GLOBAL_T = torch.randn(3)
_orig_module_call = nn.Module.__call__


def is_fx_tracing_like():
    return nn.Module.__call__ is not _orig_module_call


def rand_strided(size, stride, dtype=torch.float32):
    need = sum((s - 1) * st for s, st in zip(size, stride)) + 1
    return torch.as_strided(torch.randn(need).to(dtype), size, stride)


# ==============================================================================================
# part 1: detectron2 / Hugging Face / timm repros, out= variants, grad modes, asserts
# ==============================================================================================

@pytest.mark.xfail(strict=True, reason="kiln captures nothing: 'x0, y0 = tensor' (unpacking a tensor) falls the whole function back to eager; TorchDynamo: 3 graphs")
def test_detectron2_paste_mask_over_changing_box_values_and_image_sizes():
    c = kiln.compile(paste_mask)
    for scale, h, w, skip in [(1, 427, 640, True), (2, 427, 640, True), (3, 612, 612, True),
                              (4, 612, 612, True), (2, 427, 640, False)]:
        masks = torch.randn(1, 1, 28, 28)
        boxes = torch.tensor([[0.0, 1, 2, 4]]) * scale
        same(c(masks, boxes, h, w, skip), paste_mask(masks, boxes, h, w, skip))
    not_more_than_dynamo(paste_mask, lambda: (torch.randn(1, 1, 28, 28), torch.tensor([[0.0, 1, 2, 4]]), 427, 640, True))


def test_detectron2_boxes_to_pooler_format():
    def mk():
        return ([Boxes(torch.arange(0, 8).reshape(2, 4)), Boxes(torch.arange(8, 16).reshape(2, 4))],)

    check(boxes_to_pooler_format, mk, counts=False)
    c = kiln.compile(boxes_to_pooler_format)
    b2 = [Boxes(torch.arange(16, 20).reshape(1, 4)), Boxes(torch.arange(20, 24).reshape(1, 4))]
    same(c(b2), boxes_to_pooler_format(b2))


def test_detectron2_boxes_len_and_dunder_len():
    def fn(boxes):
        return len(boxes) + boxes.__len__() + boxes.tensor

    check(fn, lambda: (Boxes(torch.randn(2, 4)),), fullgraph=True)


@pytest.mark.parametrize("grad", [False, True])
def test_reformer_reversible_function_with_a_plain_list_of_layers(grad):
    model = ReformerLikeEncoder()

    def run(m, x):
        torch.manual_seed(1337)
        with torch.set_grad_enabled(grad):
            return m(x)

    model.eval()
    x = torch.randn(1, 8, 32)
    ref = run(copy.deepcopy(model), x)
    got = run(kiln.compile(model), x)
    same(got, ref)


def test_abs_with_out_a_transposed_view():
    def fn(x, y):
        return torch.abs(x, out=y.T)

    check(fn, lambda: (torch.randn(2, 2), torch.randn(2, 2)))


def test_index_select_after_permute_is_contiguous_with_eagers_strides():
    def fn(x):
        x = x.permute(1, 2, 0).unsqueeze(2)
        return torch.index_select(x, 0, torch.tensor([0]))

    x = torch.randn(6, 3, 6)
    got, want = kiln.compile(fn)(x), fn(x)
    same(got, want)
    assert got.is_contiguous() and got.stride() == want.stride()


def test_roll_then_as_strided_on_channels_last():
    def fn(x):
        x = torch.roll(x, shifts=-1, dims=0)
        return torch.as_strided(x, (5, 10), (4, 1), 0)

    check(fn, lambda: (torch.arange(100).reshape(2, 5, 2, 5).to(memory_format=torch.channels_last),))


def test_in_place_add_of_a_meta_tensor_factory():
    def fn(x):
        log_det = torch.zeros(x.size(0), device=x.device)
        log_det += torch.zeros(x.size(0), device="meta")
        return log_det

    check(fn, t(2, 4), counts=False)


@pytest.mark.parametrize("rg", [True, False])
def test_view_as_another_dtype(rg):
    def fn(x):
        return x.view(torch.int32)

    check(fn, lambda: (torch.ones(4, requires_grad=rg),))


def test_a_leaf_made_inside_gets_its_grad():
    def fn(x):
        leaf = torch.ones(2, requires_grad=True)
        return leaf, leaf * 2

    x = torch.randn(2, 2)
    leaf, out = fn(x)
    kleaf, kout = kiln.compile(fn)(x)
    same((kleaf, kout), (leaf, out))
    out.sum().backward()
    kout.sum().backward()
    same(kleaf.grad, leaf.grad)


@pytest.mark.xfail(strict=True, reason="saved_tensors_hooks: pack hook runs 3x and unpack 1x during the first forward (2x pack per later call); eager and TorchDynamo: 1 pack, unpack only in backward")
def test_saved_tensor_hooks_pack_once_and_unpack_only_in_backward():
    def fn(x, y):
        return x * y

    counts = {"pack": 0, "unpack": 0}

    def pack(t_):
        counts["pack"] += 1
        return t_

    def unpack(t_):
        counts["unpack"] += 1
        return t_

    c = kiln.compile(fn)
    x, y = torch.ones(4, requires_grad=True), torch.ones(4)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = c(x, y)
        assert counts == {"pack": 1, "unpack": 0}
        out.sum().backward()
        assert counts == {"pack": 1, "unpack": 1}


def test_saved_tensor_hooks_disabled_around_the_call():
    def fn(x, y):
        return x * y

    c = kiln.compile(fn)
    x = torch.ones(4, requires_grad=True)
    with torch.autograd.graph.disable_saved_tensors_hooks("disabled"):
        c(x, torch.ones(4)).sum().backward()
    same(x.grad, torch.ones(4))


def test_saved_tensor_hooks_disabled_inside_the_function():
    def g(z):
        with torch.autograd.graph.disable_saved_tensors_hooks("disabled"):
            return z + 5

    def fn(x, y):
        return g(x * y)

    x = torch.ones(4, requires_grad=True)
    y = torch.full((4,), 3.0)
    kiln.compile(fn)(x, y).sum().backward()
    same(x.grad, y)


def test_gan_step_two_backwards_in_one_function():
    def fn(a, b):
        c = torch.ones(2, 2)
        d = torch.ones(2, 2)
        e = torch.matmul(a, c)
        torch.abs(e - d).mean().backward()
        torch.matmul(b, e.detach()).mean().backward()

    def mk():
        return (torch.randn(2, 2, requires_grad=True), torch.randn(2, 2, requires_grad=True))

    check(fn, mk, counts=False)


def test_enum_member_as_dict_key_of_a_module_input():
    class Key(enum.Enum):
        A = "a"

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(1, 1)

        def forward(self, x):
            return self.linear(x[Key.A])

    m = M()
    c = kiln.compile(m)
    for _ in range(2):
        x = {Key.A: torch.rand(8, 1)}
        same(c(x), m(x))


def test_embedding_dense_backward_with_padding_and_freq_scaling():
    def fn(grad_output, indices):
        return torch.ops.aten.embedding_dense_backward(grad_output, indices, 10, 1, True)

    check(fn, lambda: (torch.ones(2, 4, 3, dtype=torch.float16), torch.ones(2, 4, dtype=torch.int64)), counts=False)


def test_longformer_overlapping_chunks_with_as_strided():
    c = kiln.compile(longformer_chunk)
    for shape in [(1, 64, 1), (3, 64, 8), (1, 64, 1), (3, 64, 8)]:
        x = torch.randn(*shape)
        same(c(x), longformer_chunk(x))
    not_more_than_dynamo(longformer_chunk, t(3, 64, 8))


def test_hf_t5_attention_prefix():
    m = PartialT5()
    check(m, t(1, 16, 64), compiled=kiln.compile(m), counts=False)
    not_more_than_dynamo(m, t(1, 16, 64))


def test_an_nn_linear_compiled_directly():
    m = nn.Linear(10, 10)
    check(m, t(5, 10), compiled=kiln.compile(m, fullgraph=True), counts=False)


def test_torch_sin_compiled_directly():
    check(torch.sin, t(5, 10), compiled=kiln.compile(torch.sin, fullgraph=True), counts=False)


@pytest.mark.xfail(strict=True, reason="x[t[0]:] with a 0-d tensor as slice start breaks ('expected a Python value for slice'), kiln captures nothing; TorchDynamo: 1 graph")
def test_slice_start_read_from_a_tensor_element():
    def fn(y):
        x = torch.ones(8)
        idx = y[0]
        return (x[idx:] + 3) * 5

    c = kiln.compile(fn)
    assert list(c(torch.ones(10, dtype=torch.long)).shape) == [7]
    assert list(c(torch.tensor([4])).shape) == [4]
    not_more_than_dynamo(fn, lambda: (torch.ones(10, dtype=torch.long),))


@pytest.mark.xfail(strict=True, reason="y[(3, slice(t[3], None))] = 0 breaks ('call to builtins.slice with tensor arguments'); TorchDynamo: 1 graph, 0 breaks")
def test_setitem_with_a_slice_start_read_from_a_tensor():
    def fn(lengths, ones):
        start = lengths[3]
        ones[(3, slice(start, None, None))] = 0
        return (ones,)

    check(fn, lambda: (torch.randint(-3, 200, (10,)), torch.randn(10, 204)))


def test_channels_last_module_with_an_int_under_dynamic():
    class M(nn.Module):
        def forward(self, x, val):
            return x + val

    m = M().to(memory_format=torch.channels_last)
    c = kiln.compile(m, dynamic=True)
    for shape, v in [((2, 5, 10, 10), 4), ((2, 5, 4, 8), 20)]:
        x = torch.rand(*shape).to(memory_format=torch.channels_last)
        got, want = c(x, v), m(x, v)
        same(got, want)
        assert got.stride() == want.stride()


def test_hf_chunking_helper_inspects_the_signature_of_a_bound_method():
    m = ChunkFeedForward()
    check(m, t(1, 64, 32), compiled=kiln.compile(m), counts=False)
    not_more_than_dynamo(m, t(1, 64, 32))


def test_maml_finetuning_with_deepcopy_autograd_grad_and_item():
    torch.manual_seed(0)
    m = PartialMaml()
    a, b = torch.randn(5, 1, 8, 8), torch.zeros(5, dtype=torch.int64)
    c_, d = torch.randn(15, 1, 8, 8), torch.zeros(15, dtype=torch.int64)
    want = m(a, b, c_, d)
    cm = kiln.compile(m)
    for _ in range(3):
        same(cm(a, b, c_, d), want)


@pytest.mark.parametrize("which", ["key", "attr", "to_tuple", "index"])
def test_hf_model_output_access(which):
    fns = {"key": lambda o: o["a"] + 1, "attr": lambda o: o.a + 1,
           "to_tuple": lambda o: o.to_tuple()[0] + 1, "index": lambda o: o[0] + 1}
    fn = fns[which]
    check(fn, lambda: (ModelOutput(a=torch.randn(10), b=torch.randn(10), c=torch.randn(10)),), fullgraph=True)


def test_bigbird_random_mask_from_blocked_masks():
    def mk():
        return (torch.randn(1, 16, 8), torch.randn(1, 16, 8), torch.randint(0, 16, (1, 4, 14, 3)),
                4, 3, 1, 128, 8)

    check(rand_mask_from_inputs, mk, fullgraph=True)


@pytest.mark.xfail(strict=True, reason="get_rng_state / set_rng_state: 2 breaks; TorchDynamo: 1 break")
def test_rng_state_restored_in_the_middle_repeats_the_draw():
    def fn():
        state = torch.get_rng_state()
        before = torch.rand(100)
        torch.set_rng_state(state)
        after = torch.rand(100)
        return before, after

    before, after = kiln.compile(fn)()
    same(before, after)
    not_more_than_dynamo(fn, lambda: ())


def test_threading_local_attribute_read():
    local = threading.local()
    local.x = torch.rand(1)

    def fn(x):
        return torch.cat([x, local.x])

    check(fn, t(1), fullgraph=True)


def test_timm_sequential_appends_to_the_callers_list():
    m = SequentialAppendList(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 10), nn.ReLU())
    x = torch.randn(4, 10)
    l1, l2 = [x], [x]
    want, _ = m(x, l1)
    got, l3 = kiln.compile(m)(x, l2)
    same(got, want)
    same(l2, l1)
    assert l3 is l2


def test_timm_batch_norm_act_in_eval():
    m = BatchNormAct2d(1).eval()
    check(m, t(5, 1, 8, 8), compiled=kiln.compile(m), counts=False)
    not_more_than_dynamo(m, t(5, 1, 8, 8))


def test_hf_parameter_dtype_from_next_of_parameters():
    m = SequentialAppendList(nn.Linear(10, 10), nn.ReLU())

    def fn(model, x):
        return x + torch.zeros(10, dtype=parameter_dtype(model), device=x.device)

    check(fn, lambda: (m, torch.randn(10)), fullgraph=True)


def test_hf_parameter_dtype_falls_back_to_tensor_attributes():
    class NoParams(nn.Module):
        def __init__(self):
            super().__init__()
            self.t = torch.zeros(2, dtype=torch.float64)

    m = NoParams()

    def fn(model, x):
        return x.to(parameter_dtype(model)) + 1

    check(fn, lambda: (m, torch.randn(3)))


def test_parameter_made_inside_is_a_parameter():
    def fn():
        a = nn.Parameter(torch.ones(5, 5))
        return a, isinstance(a, nn.Parameter)

    got = kiln.compile(fn)()
    assert isinstance(got[0], nn.Parameter) and got[1] is True
    same(got, fn())


def test_torch_size_made_inside_is_a_size():
    def fn(x):
        s = torch.Size([1, 2, 3])
        assert isinstance(s, torch.Size)
        return x + 1, s, type(s) is torch.Size

    check(fn, t(4))


def test_copy_into_a_slice_of_a_zeros_buffer_with_odd_strides():
    def fn(a):
        b = torch.zeros(6, 4, 32, 65)
        b[:, 0, 1:32, 1:32] = a
        c = b.view(4, 6, 128, 65)
        d = c.transpose(2, 1)
        d.add_(1)
        return d

    check(fn, lambda: (rand_strided((6, 31, 31), (2015, 65, 1), torch.float16).requires_grad_(),), counts=False)


def test_numpy_and_torch_indexing_with_none_agree():
    def fn(x):
        for case in [[None, None], [1, None]]:
            idx = tuple(case)
            assert x.numpy()[idx].shape == x[idx].shape
        return x + 1

    check(fn, lambda: (torch.arange(0, 10),))


@pytest.mark.xfail(strict=True, reason="torch._foreach_lerp_ (in-place foreach) not captured: fullgraph raises; TorchDynamo: fullgraph ok")
def test_foreach_ops_with_keyword_arguments():
    def pow_(**kw):
        return torch._foreach_pow(**kw)

    def lerp_(**kw):
        return torch._foreach_lerp_(**kw)

    same(kiln.compile(pow_, fullgraph=True)(self=[torch.ones(2, 2) * 3], exponent=2.7),
         pow_(self=[torch.ones(2, 2) * 3], exponent=2.7))
    a, b = [torch.ones(2, 2)], [torch.ones(2, 2)]
    ka = [torch.ones(2, 2)]
    lerp_(self=a, tensors1=[torch.full((2, 2), 3.0)], weights=[torch.full((2, 2), 0.5)])
    kiln.compile(lerp_, fullgraph=True)(self=ka, tensors1=[torch.full((2, 2), 3.0)], weights=[torch.full((2, 2), 0.5)])
    same(ka, a)


def test_reformer_min_chunk_len_from_a_config_class():
    def fn(cfg):
        t_ = torch.empty(10)
        t_.fill_(min_chunk_len(cfg))
        return t_[0]

    check(fn, lambda: (ReformerConfig(),), fullgraph=True)


def test_reformer_sorting_and_undo_sort_by_scatter():
    check(sorted_bucket_idx, lambda: (torch.randint(0, 4, (1, 3, 64)),), fullgraph=True)


def test_recursive_map_over_a_nested_dict_argument():
    def _rmap(struct):
        for k, v in struct.items():
            if v is not None:
                if isinstance(v, dict):
                    _rmap(v)
                else:
                    struct[k] = v

    def fn(a, b, v):
        x = a / (torch.abs(a) + 1)
        if v is not None:
            _rmap(v)
        return x * b

    check(fn, lambda: (torch.randn(10), torch.randn(10), {"layer0": {"memory_keys": torch.randn(10)}}))


def test_module_method_indexing_a_module_list_with_an_int_under_dynamic():
    def block(i, o, h):
        return nn.Sequential(nn.Linear(i, h), nn.GELU(), nn.Linear(h, o))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.nets = nn.ModuleList([block(26, 17, 40) for _ in range(4)])

        def interact(self, x, cycle):
            return self.nets[cycle](x)

    m = M()
    c = kiln.compile(m.interact, fullgraph=True, dynamic=True)
    for n, cyc in [(11, 2), (7, 1)]:
        x = torch.rand(n, 26)
        same(c(x, cyc), m.interact(x, cyc))


def test_transformer_encoder_layer_with_multihead_attention():
    m = EncoderLayer(16, 2).eval()
    c = kiln.compile(m)
    for _ in range(2):
        x = torch.randn(1, 16)
        same(c(x), m(x))
    not_more_than_dynamo(m, t(1, 16))


def test_exec_import_does_not_leak_into_another_functions_globals():
    def fn1():
        exec("import math as _m_from_exec")

    def fn2():
        try:
            _m_from_exec.sqrt(4)  # noqa: F821
            return False
        except NameError:
            return True

    def fn3(x):
        fn1()
        return x + 1, fn2()

    check(fn3, t(2), counts=False)


def test_exec_wildcard_import_leaves_the_callers_names_alone():
    def fn1():
        exec("from torch import *")

    def fn2():
        x = torch.zeros(4)
        for i in range(5):
            x = x + i
        return x

    def fn3():
        fn1()
        return fn2()

    check(fn3, counts=False)


def test_enable_grad_block_with_a_print_break_and_backward_inside(capsys):
    def reversible(x):
        print("Hello world")
        return torch.sin(torch.cos(x))

    def fn(x):
        with torch.enable_grad():
            a = torch.sin(x)
            b = reversible(a)
            torch.sigmoid(b).sum().backward()
            return x.grad

    x = torch.randn(3, requires_grad=True)
    kx = x.detach().clone().requires_grad_()
    with torch.no_grad():
        want = fn(x)
        got = kiln.compile(fn)(kx)
    same(got, want)
    assert capsys.readouterr().out.count("Hello world") == 2


def test_nested_no_grad_enable_grad_with_a_break_and_backward_inside():
    def reversible(x):
        torch._dynamo.graph_break()
        return torch.sin(torch.cos(x))

    def fn(x):
        with torch.no_grad():
            with torch.enable_grad():
                a = torch.sin(x)
                torch.sigmoid(reversible(a)).sum().backward()
                return x.grad

    x = torch.randn(3, requires_grad=True)
    kx = x.detach().clone().requires_grad_()
    with torch.no_grad():
        want = fn(x)
        got = kiln.compile(fn)(kx)
    same(got, want)


def test_no_grad_is_still_on_after_a_break_inside_it(capsys):
    def fn(x):
        with torch.no_grad():
            y = x * 3
            print("Break")
            z = x + 2
        return y, z, x * 4

    check(fn, lambda: (torch.randn(3, requires_grad=True),), counts=False)


@pytest.mark.parametrize("which", ["locals", "vars"])
def test_names_checked_in_locals_or_vars(which):
    look = locals if which == "locals" else vars

    def fn(x):
        if x.dim() > 2:
            batch_size, seq_len, hidden_dim = x.shape
            x = x.view(-1, hidden_dim)
        x = x + 1
        if "batch_size" in look() and "seq_len" in look():
            x = x.view(batch_size, seq_len, -1)
        return x

    check(fn, t(2, 3, 4), counts=False)
    check(fn, t(3, 4), counts=False)


def test_abc_module_with_own_setattr_and_super_method():
    class Base(nn.Module, abc.ABC):
        def blah(self, x):
            return x + 1

    class Derived(Base):
        def __setattr__(self, name, value):
            super().__setattr__(name, value)

        def forward(self, x):
            self.foo = 0
            return self.blah(x)

        def blah(self, x):
            return super().blah(x)

    m, km = Derived(), Derived()
    x = torch.randn(3, requires_grad=True)
    same(kiln.compile(km)(x), m(x))
    assert km.foo == 0


def test_guard_on_a_nested_tuple_that_stops_being_nested():
    def fn(args):
        return torch.ones(()), args[0] * 2

    c = kiln.compile(fn)
    same(c((torch.ones(1), (torch.ones(1), torch.ones(1)))), fn((torch.ones(1), (torch.ones(1), torch.ones(1)))))
    same(c((torch.ones(1), torch.ones(1))), fn((torch.ones(1), torch.ones(1))))


def test_nullcontext_instance_argument():
    def fn(x, ctx):
        x = x.sin()
        with ctx:
            x = x.cos()
        return x.sin()

    check(fn, lambda: (torch.randn(10), contextlib.nullcontext()), fullgraph=True)


def test_nullcontext_class_argument():
    def fn(x, ctx):
        x = x.sin()
        with ctx():
            x = x.cos()
        return x.sin()

    check(fn, lambda: (torch.randn(10), contextlib.nullcontext), fullgraph=True)


def test_no_grad_decorated_helper_inlined():
    @torch.no_grad()
    def a(x):
        return x.sin()

    def fn(x):
        return a(x).cos(), torch.is_grad_enabled()

    check(fn, lambda: (torch.randn(10, requires_grad=True),), fullgraph=True)


@pytest.mark.parametrize("partition", [0, 5, 10])
def test_long_tensor_from_a_list_of_numpy_ints_and_tensors(partition):
    def fn(x, vals):
        lst = list(np.array(vals[:partition])) + [torch.tensor(v) for v in vals[partition:]]
        return x * torch.LongTensor(lst)

    check(fn, lambda: (torch.ones(10) * 2, [random.randint(5, 10) for _ in range(10)]), counts=False)


def test_primtorch_ref_called():
    def fn(x):
        return torch._refs.abs(x)

    check(fn, t(3), counts=False)


def test_tensor_class_method_called_on_an_input():
    def fn(x):
        return torch.Tensor.abs_(x)

    check(fn, t(3), fullgraph=True)


def test_aten_op_not_in_the_usual_list():
    def fn(x):
        return torch.ops.aten.absolute(x)

    check(fn, t(3), fullgraph=True)


@pytest.mark.xfail(strict=True, reason="returning an nn.Module (holding F.gelu attribute) built in the function: fullgraph raises 'cannot build again'; TorchDynamo: fullgraph ok")
def test_hf_gelu_module_made_inside_and_returned():
    class GELUActivation(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = F.gelu

        def forward(self, x):
            return self.act(x)

    def fn(x):
        return GELUActivation()(x)

    def fn_returns(x):
        return GELUActivation(), x + 1

    check(fn, t(10), fullgraph=True)
    act, _ = kiln.compile(fn_returns, fullgraph=True)(torch.randn(10))
    assert isinstance(act, GELUActivation) and act.act is F.gelu and hasattr(act, "_buffers")


@pytest.mark.xfail(strict=True, reason="WRONG VALUES under backend='eager': dropout after manual_seed draws a different mask than eager (TorchDynamo's eager backend draws the same)")
def test_dropout_module_made_inside_draws_eagers_mask():
    def fn(x):
        return nn.Dropout(0.1)(x)

    y = torch.randn(10)
    torch.manual_seed(1337)
    want = F.dropout(y, 0.1)
    torch.manual_seed(1337)
    got = kiln.compile(fn, backend="eager")(y)
    same(got, want)


def test_setitem_with_a_boolean_mask_needing_grad():
    def fn(x, b, y):
        x = x.clone()
        x[b] = y
        return x

    def mk():
        return (torch.randn(4, requires_grad=True), torch.tensor([True, False, True, False]),
                torch.randn(2, requires_grad=True))

    check(fn, mk, counts=False)


def test_setitem_with_a_tuple_holding_a_boolean_mask_needing_grad():
    def fn(x, b, y):
        x = x.clone()
        x[:, b] = y
        return x

    def mk():
        return (torch.randn(8, 4, requires_grad=True), torch.tensor([True, False, True, False]),
                torch.randn(2, requires_grad=True))

    check(fn, mk, counts=False)


def test_module_method_called_with_a_tensor_then_an_int():
    m = ShapeCheckModule()
    c = kiln.compile(m.fn)
    assert c(torch.ones(5, 5)) == m.fn(torch.ones(5, 5))
    assert c(-3) == m.fn(-3)
    assert c(torch.ones(1, 2, 3)) == m.fn(torch.ones(1, 2, 3))


def test_isinstance_against_a_tuple_then_raise_with_str_format():
    def fn(x):
        t_ = torch.ones(5, 5)
        if not isinstance(t_, (int, torch.Tensor)):
            raise ValueError(str.format("{0} is not {1}", type(t_), (int, torch.Tensor)))
        return x + 1, True

    check(fn, t(2))


def test_isinstance_of_a_dtype():
    def fn(x):
        return x + 1, isinstance(torch.bfloat16, torch.dtype)

    check(fn, t(3), fullgraph=True)


def test_bool_storage_from_a_buffer():
    def fn(x):
        f = bytearray([0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x10, 0x40])
        bools = torch.BoolStorage.from_buffer(f, "big")
        assert isinstance(bools, torch.BoolStorage)
        return x + 1

    check(fn, t(3), counts=False)


def test_class_attribute_deleted_between_calls_raises_attribute_error():
    class A:
        a = 2

    def fn(x, y):
        return x + y.a

    c = kiln.compile(fn)
    same(c(torch.zeros(2), A()), torch.full([2], 2.0))
    del A.a
    with pytest.raises(AttributeError):
        c(torch.zeros(2), A())


@pytest.mark.xfail(strict=True, reason="out= tensor of another shape (torch resizes it) breaks the graph; TorchDynamo: 1 graph, 0 breaks")
def test_sort_into_0d_out_tensors_resizes_them():
    def fn(x):
        values = torch.tensor(0.0)
        indices = torch.tensor(0, dtype=torch.long)
        torch.sort(x[:, 0], out=(values, indices))
        return values, indices, values.stride(), indices.stride()

    check(fn, t(3, 5))


def test_sort_into_module_buffers():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.sorted = nn.Buffer(torch.ones(4, 4))
            self.indices = nn.Buffer(torch.ones(4, 4, dtype=torch.long))

        def forward(self, x):
            torch.sort(x, out=(self.sorted, self.indices))
            return x + 1, self.sorted, self.indices

    m, km = M(), M()
    x = torch.randn(4, 4)
    same(kiln.compile(km)(x), m(x))
    same(km.sorted, m.sorted)


@pytest.mark.xfail(strict=True, reason="out= tensor of another shape (torch resizes it) breaks the graph; TorchDynamo: 1 graph, 0 breaks")
def test_sigmoid_into_a_0d_out_tensor_resizes_it():
    def fn(x):
        out = torch.tensor(0.0)
        torch.sigmoid(x, out=out)
        return out, out.numel()

    check(fn, t(3, 5))


def test_sigmoid_into_a_module_buffer():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.base = nn.Buffer(torch.ones(4, 4))

        def forward(self, x):
            torch.sigmoid(x, out=self.base)
            return x + self.base

    m, km = M(), M()
    x = torch.randn(4, 4)
    same(kiln.compile(km)(x), m(x))
    same(km.base, m.base)


@pytest.mark.xfail(strict=True, reason="out= tensor of another shape (torch resizes it) breaks the graph; TorchDynamo: 1 graph, 0 breaks")
def test_out_tensor_in_an_outer_cell_changes_shape():
    def fn(x):
        out = torch.empty(0)

        def run():
            torch.sigmoid(x, out=out)
            return out.size()

        return run(), out

    check(fn, t(3, 5))


@pytest.mark.xfail(strict=True, reason="out= tensor of another shape (torch resizes it) breaks the graph; TorchDynamo: 1 graph, 0 breaks")
def test_out_tensor_in_a_nested_cell_changes_shape():
    def fn(x):
        def run():
            out = torch.empty(0)

            def capture():
                return out

            torch.sigmoid(x, out=out)
            return out.size(), capture()

        return run()

    check(fn, t(3, 5))


@pytest.mark.xfail(strict=True, reason="out= tensor of another shape (torch resizes it) breaks the graph; TorchDynamo: 1 graph, 0 breaks")
def test_out_tuple_in_outer_cells_changes_shape():
    def fn(x):
        out1 = torch.empty(0)
        out2 = torch.empty(0, dtype=torch.long)

        def run():
            torch.sort(x, out=(out1, out2))
            return out1.size(), out2.size()

        return run(), out1, out2

    check(fn, t(3, 5))


@pytest.mark.xfail(strict=True, reason="out= tensor of another shape (torch resizes it) breaks the graph; TorchDynamo: 1 graph, 0 breaks")
def test_out_tuple_in_nested_cells_changes_shape():
    def fn(x):
        def run():
            out1 = torch.empty(0)
            out2 = torch.empty(0, dtype=torch.long)

            def capture():
                return out1, out2

            torch.sort(x, out=(out1, out2))
            return out1.size(), out2.size(), capture()

        return run()

    check(fn, t(3, 5))


def test_slice_of_an_input_list_is_a_new_list():
    def fn(listy):
        x = listy[3:5]
        for i in range(3):
            x[0] = torch.abs(listy[i]) + 1
        return x

    check(fn, lambda: ([torch.randn(10)] * 10,), fullgraph=True)


def test_branch_on_item_of_a_computed_tensor():
    def fn(x):
        x = x + 1
        y = x.item()
        return x * 2 if y > 2 else x * 3

    c = kiln.compile(fn)
    for v in [3.0, 0.0, 5.0]:
        same(c(torch.tensor([v])), fn(torch.tensor([v])))


def test_keys_of_a_dict_attribute_of_an_object():
    class Value:
        def __init__(self):
            self._value = torch.randn(4)

    class Sample:
        def __init__(self):
            self._jt_dict = {"POSITION_ID": Value()}

    def fn(a, dt):
        keys = list(dt._jt_dict.keys())
        p = torch.cos(dt._jt_dict[keys[0]]._value)
        q = torch.sin(a)
        r = torch.sigmoid(dt._jt_dict[keys[0]]._value)
        return p + q + r

    check(fn, lambda: (torch.randn(4), Sample()), fullgraph=True)


def test_stride_of_a_strided_slice_made_inside():
    def fn():
        return torch.empty(4)[::2].stride()

    assert kiln.compile(fn)() == fn()


def test_normalize_with_out_none():
    def fn(x):
        return F.normalize(x, dim=0, out=None)

    check(fn, lambda: (torch.rand([1]),))


def test_import_torch_fx_and_symbolic_trace_inside():
    def fn1(x):
        return torch.sin(x)

    def fn(x):
        import torch.fx
        _ = torch.fx.symbolic_trace(fn1)
        return x * 2

    check(fn, t(10), counts=False)


def test_bigbird_unsqueeze_in_place_then_cat():
    def fn(x):
        v = x.clone()
        v.unsqueeze_(2)
        return (torch.cat([v], dim=2).view((2, 12, 64, -1)),)

    check(fn, lambda: (torch.randn(2, 12, 64, 64, requires_grad=True),))


def test_size_taken_before_a_print_break_used_after(capsys):
    def fn(x):
        y = x * 2
        size = x.size()
        print("arf")
        return y.view(size) + 1

    check(fn, lambda: (torch.randn(2, 3, requires_grad=True),), counts=False)


def test_layer_norm_then_ellipsis_slice_then_linear():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lnorm = nn.LayerNorm((64,), eps=1e-6)
            self.linear = nn.Linear(64, 64)

        def forward(self, x):
            y = self.lnorm(x)[(slice(None, None, None), slice(0, 1, None), Ellipsis)]
            return (self.linear(y),)

    m = M()
    check(m, t(2, 17, 64), compiled=kiln.compile(m, fullgraph=True), counts=False)


def test_layoutlm_two_position_embeddings_added():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.x_emb = nn.Embedding(128, 32)
            self.y_emb = nn.Embedding(128, 32)

        def forward(self, i1, i2, add):
            return (add + self.x_emb(i1) + self.y_emb(i2),)

    m = M()

    def mk():
        return (rand_strided((2, 16), (64, 4)).abs().mul(10).long(), torch.randint(0, 128, (2, 16)),
                torch.randn(2, 16, 32, requires_grad=True))

    check(m, mk, compiled=kiln.compile(m), counts=False)


def test_deepcopy_of_a_compiled_module():
    class Foo(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 3)

        def forward(self, x):
            return self.fc(x)

    m = Foo()
    c = kiln.compile(m)
    x = torch.randn(1, 2)
    same(c(x), m(x))
    c2 = copy.deepcopy(c)
    same(c2(x), m(x))


def test_class_level_int_and_tensor_attributes_of_a_module():
    class Foo(nn.Module):
        a = 4
        b = torch.ones(3, 4)

        def __init__(self):
            super().__init__()
            self.c = 4

        def forward(self, x):
            return x.cos() + self.a + self.b + self.c

    m = Foo()
    check(m, t(3, 4), compiled=kiln.compile(m, fullgraph=True), counts=False)


def test_sum_over_named_buffers():
    class Foo(nn.Module):
        def __init__(self):
            super().__init__()
            self.x = nn.Buffer(torch.ones(3))
            self.y = nn.Buffer(torch.ones(3) * 2)

        def forward(self, inp):
            res = 0
            for _, b in self.named_buffers():
                res += b.sum()
            return inp.cos() + res

    m = Foo()
    check(m, t(3, 4), compiled=kiln.compile(m, fullgraph=True), counts=False)


def test_requires_grad_branch_recompiles_out_of_no_grad():
    def fn(x):
        return x + 1 if x.requires_grad else x + 2

    c = kiln.compile(fn)
    x = torch.ones(2, requires_grad=True)
    with torch.no_grad():
        same(c(x), fn(x))
    same(c(x.detach()), fn(x.detach()))
    same(c(x), fn(x))


def test_linear_compiled_under_no_grad_then_called_with_grad():
    m = nn.Linear(2, 2)
    c = kiln.compile(m)
    x = torch.ones(2, requires_grad=True)
    with torch.no_grad():
        same(c(x), m(x))
    same(c(x), m(x))


def test_fx_tracing_check_by_module_call_identity():
    def fn(x):
        if is_fx_tracing_like():
            return x * 2
        return x * 4

    check(fn, t(4), fullgraph=True)


def test_user_dict_subclass_with_getattr_raising_attribute_error_from_key_error():
    class BatchEncoding(collections.UserDict):
        def __init__(self, data):
            super().__init__(data)

        def __getattr__(self, item):
            try:
                return self.data[item]
            except KeyError as e:
                raise AttributeError from e

    def fn(x):
        enc = BatchEncoding({"key": x})
        return enc["key"], enc.key + 1

    check(fn, t(1, 4))


def test_loop_over_self_modules():
    class Foo(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, inp):
            res = torch.zeros(3, 3)
            for _ in self.modules():
                res += self.fc(inp)
            return res

    m = Foo()
    check(m, lambda: (torch.ones(3, 4),), compiled=kiln.compile(m, fullgraph=True), counts=False)
    not_more_than_dynamo(m, lambda: (torch.ones(3, 4),))


@pytest.mark.xfail(strict=True, reason="iteration over a user-defined iterator object (__next__) falls back to eager (fullgraph raises); TorchDynamo: 1 graph")
def test_omegaconf_like_list_iterator_adds_into_a_global_tensor():
    cfg = ListConfigLike()
    state = {"x": torch.zeros(2)}

    def fn():
        y = state["x"]
        for i in cfg:
            y += i
        return y

    want = fn().clone()
    state["x"] = torch.zeros(2)
    got = kiln.compile(fn, fullgraph=True)()
    same(got, want)
    same(state["x"], want)


@pytest.mark.xfail(strict=True, reason="iteration over a user-defined iterator object (__next__) falls back to eager (fullgraph raises); TorchDynamo: 1 graph")
def test_user_defined_iterator_class():
    class MyIter:
        def __init__(self):
            self.i = 0

        def __iter__(self):
            return self

        def __next__(self):
            if self.i < 3:
                self.i += 1
                return self.i
            raise StopIteration

    def fn(x):
        for i in MyIter():
            x += i
        return x

    check(fn, lambda: (torch.zeros(1),), fullgraph=True)


def test_stop_iteration_instance_returned():
    def fn(x):
        return x.sin(), StopIteration(1, 2, 3)

    got = kiln.compile(fn)(torch.ones(1))
    assert type(got[1]) is StopIteration and got[1].args == (1, 2, 3)


def test_torch_tensor_with_the_data_keyword():
    def fn():
        return torch.tensor(data=[[1.0, -1.0]])

    check(fn, fullgraph=True)


def test_break_inside_a_for_loop_body():
    def inner(x):
        return torch.sin(x)

    def fn(x):
        for _ in range(10):
            inner(x)
            torch._dynamo.graph_break()
        return x

    check(fn, t(4), graphs_only=True)


def test_break_before_a_for_loop():
    def inner(x):
        return torch.sin(x)

    def fn(x):
        torch._dynamo.graph_break()
        acc = x
        for _ in range(10):
            acc = acc + inner(x)
        return acc

    check(fn, t(4), graphs_only=True)


@pytest.mark.parametrize("rg", [True, False])
def test_same_tensor_passed_twice_then_two_tensors(rg):
    def fn(x, y):
        return (x + y) * 1

    c = kiln.compile(fn)
    x, y = torch.randn(4, requires_grad=rg), torch.randn(4, requires_grad=rg)
    same(c(x, x), fn(x, x))
    same(c(x, y), fn(x, y))


def test_hf_validate_model_kwargs_against_a_signature():
    def f1(a, b):
        return torch.sin(a) + torch.cos(b)

    def f2(**kwargs):
        validate_model_kwargs(f1, kwargs)
        return f1(**kwargs)

    c = kiln.compile(f2, fullgraph=True)
    x, y = torch.randn(10), torch.randn(10)
    same(c(a=x, b=y), f1(x, y))
    with pytest.raises(ValueError):
        kiln.compile(f2)(a=x, b=y, c=x)


def test_swin_plain_tensor_attribute_of_a_module():
    class Foo(nn.Module):
        def __init__(self):
            super().__init__()
            self.t = torch.randn(3)

        def forward(self, x):
            return x + torch.cat((self.t, self.t))

    m = Foo()
    check(m, t(6), compiled=kiln.compile(m), counts=False)


def test_break_as_the_first_thing_under_no_grad():
    def fn(x):
        with torch.no_grad():
            torch._dynamo.graph_break()
            return x + 1

    check(fn, lambda: (torch.randn(4, requires_grad=True),), graphs_only=True)


@pytest.mark.parametrize("rg", [True, False])
def test_outputs_alias_an_intermediate_and_stay_aliased(rg):
    def fn(x):
        inter = x.mul(2)
        return inter.view(-1), inter

    x = torch.randn(4, requires_grad=rg)
    want, got = fn(x), kiln.compile(fn)(x)
    same(got, want)
    with torch.no_grad():
        want[0].mul_(2)
        got[0].mul_(2)
    same(got, want)


def test_break_inside_a_while_loop():
    def inner(x):
        return torch.sin(x)

    def fn(x):
        i = 20
        while i > 10:
            x = inner(x)
            i -= 1
            torch._dynamo.graph_break()
        return x

    check(fn, t(4), graphs_only=True)


def test_break_inside_nested_while_loops():
    def inner_loop(x):
        i = 3
        while i > 0:
            i -= 1
            x += 1
            torch._dynamo.graph_break()
        return x

    def inner(x):
        inner_loop(x)
        return torch.sin(x)

    def fn(x):
        i = 20
        while i > 10:
            x = inner(x)
            i -= 1
            torch._dynamo.graph_break()
        return x

    check(fn, t(4), graphs_only=True)


def test_break_in_a_loop_of_a_called_function():
    def inner(x):
        for _ in range(3):
            x += 1
            torch._dynamo.graph_break()
        return x

    def fn(x):
        x += 2
        inner(x)
        x += 3
        return x

    check(fn, t(4))


def test_contextmanager_generator_swallowing_an_exception_from_a_callee():
    state = {"hit": False}

    @contextlib.contextmanager
    def ctx():
        try:
            yield
        except RuntimeError:
            state["hit"] = True

    def h():
        raise RuntimeError("boof")

    def fn(x):
        with ctx():
            h()
        return x + 1

    same(kiln.compile(fn)(torch.ones(2)), torch.full((2,), 2.0))
    assert state["hit"]


@pytest.mark.xfail(strict=True, reason="type(genexpr) breaks ('expected a Python value for argument, got a iterator'), nothing captured; TorchDynamo: 1 graph")
def test_type_of_a_generator_expression():
    def fn(x):
        gen_type = type(_ for _ in ())
        return x + 1, gen_type.__name__

    check(fn, t(2))


@pytest.mark.parametrize("cls", [ProcList, RestrictedList])
def test_hf_merge_criteria_processor_lists(cls):
    def fn(x, left, right):
        return merge_processor_lists(left, right)(x)

    c = kiln.compile(fn)
    inp = torch.randn(16)
    l1, l2 = cls([nn.ReLU(), nn.Sigmoid()]), cls([])
    same(c(inp, l1, l2), l1(inp))
    l3 = cls([nn.SiLU()])
    want = l3(l1(inp))
    got = c(inp, l1, l3)
    assert len(l1) == 3
    same(got, want)


@pytest.mark.xfail(strict=True, reason="list subclass with extra methods: construction/extend/append/pop each break (6 breaks, nothing captured); TorchDynamo: 1 graph, fullgraph ok")
def test_list_subclass_made_inside_with_own_methods_and_sum():
    def fn(a, b):
        lst = RestrictedList()
        lst.extend([True])
        lst.append(a)
        lst.extend([b])
        lst.pop(0)
        lst.append(lst.length_times_10())
        return sum(lst)

    check(fn, lambda: (torch.randn(10), torch.randn(10)), fullgraph=True)


@pytest.mark.xfail(strict=True, reason="list subclass with extra methods: construction/extend/append/pop each break (6 breaks, nothing captured); TorchDynamo: 1 graph, fullgraph ok")
def test_list_subclass_made_inside_returned():
    def fn(a, b):
        l1 = RestrictedList([a + 1])
        l1.extend(RestrictedList([b + 2]))
        return l1

    x, y = torch.randn(10), torch.randn(10)
    z = kiln.compile(fn, fullgraph=True)(x, y)
    assert type(z) is RestrictedList and len(z) == 2 and z.length_times_10() == 20
    same(list(z), [x + 1, y + 2])


@pytest.mark.xfail(strict=True, reason="list subclass with extra methods: construction/extend/append/pop each break (6 breaks, nothing captured); TorchDynamo: 1 graph, fullgraph ok")
def test_list_subclass_argument_aliased_twice_mutated():
    def fn(a, b):
        a.extend(b)
        a.append_twice(b[2] + 1)
        a.append(b[3] + 2)
        return b

    x, y = torch.randn(10), torch.randn(10)
    lst = RestrictedList([x, y])
    assert kiln.compile(fn, fullgraph=True)(lst, lst) is lst
    assert len(lst) == 7 and lst[0] is x and lst[1] is y and lst[2] is x and lst[3] is y
    same(lst[4], x + 1)
    assert lst[5] is lst[4]
    same(lst[6], y + 2)


def test_assert_with_a_message_on_a_tensor_element():
    def fn(x):
        b = x.sin()
        assert x[0] == 3, "First dim need to be 3"
        return x.cos() + b

    check(fn, lambda: (torch.tensor([3.0, 4, 5]),), counts=False)
    check(fn, lambda: (torch.tensor([5.0, 4, 5]),), counts=False)


def test_list_argument_appended_to_is_returned_as_itself():
    def fn(a):
        a.append(torch.sin(a[0]))
        return a

    x = torch.randn(10)
    lst = [x]
    assert kiln.compile(fn, fullgraph=True)(lst) is lst
    assert len(lst) == 2 and lst[0] is x
    same(lst[1], torch.sin(x))


def test_value_error_raised_on_a_data_dependent_check():
    def fn(x):
        b = x.sin()
        if not x.sum() <= 3:
            raise ValueError("input sum needs to be 3")
        return x.cos() + b

    check(fn, lambda: (torch.tensor([3.0, 4, 5]),), counts=False)
    check(fn, lambda: (torch.tensor([1.0, 1, 1]),), counts=False)


def test_assert_with_an_f_string_message_under_no_grad():
    def fn(x):
        with torch.no_grad():
            assert x.max() < 5, f"invalid max {x.max()}"
            x = torch.sin(x)
        return x

    check(fn, lambda: (torch.ones(4),), counts=False)
    check(fn, lambda: (torch.ones(4) * 7,), counts=False)


def test_assert_with_a_tensor_as_its_message():
    def fn(x):
        b = x.sin()
        assert x[0] == 2, x
        return x.cos() + b

    c = kiln.compile(fn)
    with pytest.raises(AssertionError, match="tensor"):
        c(torch.tensor([3.0, 4, 5]))
    same(c(torch.tensor([2.0, 4, 5])), fn(torch.tensor([2.0, 4, 5])))


def test_assert_on_true_and_on_dtype_are_no_ops():
    def fn(x):
        b = x.sin()
        assert True
        assert x.dtype == torch.float32
        return x.cos() + b

    check(fn, t(3), fullgraph=True)


def test_isinstance_of_torch_size_against_a_plain_tuple():
    def fn(x, y):
        return y + 1 if isinstance(x, torch.Size) else y + 2

    c = kiln.compile(fn, fullgraph=True)
    y = torch.zeros(1)
    same(c(torch.Size((3,)), y), fn(torch.Size((3,)), y))
    same(c((3,), y), fn((3,), y))


def test_hf_class_instantier_ordered_dict_subclass():
    class ClassInstantier(collections.OrderedDict):
        def __getitem__(self, key):
            content = super().__getitem__(key)
            cls, kwargs = content if isinstance(content, tuple) else (content, {})
            return cls(**kwargs)

    acts = ClassInstantier({"relu": (nn.ReLU, {"inplace": False}), "tanh": nn.Tanh})

    def fn(x, act):
        return acts[act](x)

    c = kiln.compile(fn, fullgraph=True)
    y = torch.randn(10)
    same(c(y, "tanh"), torch.tanh(y))
    same(c(y, "relu"), torch.relu(y))


def test_hf_ephemeral_activation_module():
    class ReLUSquared(nn.Module):
        def forward(self, x):
            return torch.square(F.relu(x))

    def fn(x):
        return ReLUSquared()(x + 0.2) + 1

    check(fn, t(10), fullgraph=True)


@pytest.mark.xfail(strict=True, reason="Tensor.unsqueeze_() on an input breaks the graph; TorchDynamo: 1 graph, 0 breaks")
def test_unsqueeze_in_place_on_an_input():
    def fn(x):
        x.unsqueeze_(0)
        return x + 1

    check(fn, t(3, 4))


@pytest.mark.xfail(strict=True, reason="autograd.Function whose forward calls a module with parameters: output requires_grad=True (eager: False, forward runs under no-grad); TorchDynamo does the same")
def test_autograd_function_forward_using_module_parameters_gives_no_grad_output():
    class Rev(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, layers):
            for layer in layers:
                h = layer(h)
            return h

        @staticmethod
        def backward(ctx, g):
            return g, None

    lin = nn.Linear(4, 4)

    def fn(x):
        return Rev.apply(x, [lin])

    check(fn, t(2, 4), counts=False)


# ==============================================================================================
# part 2: batch norm training, del, dataclasses, weakrefs, super, set_data, numpy, user classes
# ==============================================================================================

def test_batch_norm_conv_training_steps_update_running_stats_and_grads():
    class Repro(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(8)
            self.conv1 = nn.Conv2d(8, 8, kernel_size=3, padding=1, bias=False)

        def forward(self, x):
            return (F.relu(self.conv1(self.bn(x))),)

    torch.manual_seed(1337)
    m_ref = Repro()
    m_test = copy.deepcopy(m_ref)
    c = kiln.compile(lambda x: m_test(x))
    x = torch.randn(2, 8, 8, 8, requires_grad=True)
    for _ in range(3):
        ref, res = m_ref(x), c(x)
        same(res, ref)
        ref[0].sum().backward()
        res[0].sum().backward()
        for a, b in zip(m_test.parameters(), m_ref.parameters()):
            same(a.grad, b.grad)
        for a, b in zip(m_test.buffers(), m_ref.buffers()):
            same(a, b)


def test_add_with_an_int_alpha_under_dynamic():
    def fn(t1, t2, d):
        return torch.add(t1, t2, alpha=d)

    c = kiln.compile(fn, dynamic=True)
    t1 = torch.arange(3, dtype=torch.float32).requires_grad_(True)
    t2 = torch.arange(3, dtype=torch.float32).requires_grad_(True)
    same(c(t1, t2, 5), fn(t1, t2, 5))
    same(c(t1, t2, 6), fn(t1, t2, 6))


def test_double_star_merge_of_two_dicts_into_a_call():
    def forward_with_cond_scale(x, t_, cond_scale, self_cond, other1, other2):
        return x.sin() + t_ + cond_scale + self_cond + other1 + other2

    def fn(x):
        d1 = dict(other1=5)
        d2 = dict(other2=4)
        return forward_with_cond_scale(x, 1, cond_scale=2, self_cond=3, **{**d1, **d2})

    check(fn, t(4), fullgraph=True)


def test_delattr_on_an_argument_and_an_object_made_inside():
    class MyObj:
        def __init__(self, a, b):
            self.a = a
            self.b = b

    def fn(x, obj):
        del obj.a
        obj.c = x + 1
        del obj.c
        tmp = MyObj(x + 2, x + 3)
        del tmp.b
        if hasattr(obj, "a"):
            return x + 1
        return tmp

    x = torch.zeros([])
    o1, o2 = MyObj(x, x), MyObj(x, x)
    want = fn(x, o1)
    got = kiln.compile(fn)(x, o2)
    assert not hasattr(o2, "a") and not hasattr(o2, "c") and not hasattr(got, "b")
    same(got.a, want.a)
    same(vars(o2), vars(o1))
    not_more_than_dynamo(fn, lambda: (torch.zeros([]), MyObj(torch.zeros([]), torch.zeros([]))))


def test_del_through_a_custom_delattr():
    class MyObject:
        def __init__(self, val):
            self.val = val
            self.deletion_attempted = False

        def __delattr__(self, attr):
            if attr == "val":
                self.deletion_attempted = True
            else:
                super().__delattr__(attr)

    def fn(x):
        a, b = MyObject(1), MyObject(2)
        del a.val
        del b.val
        return x + 1, hasattr(a, "val"), hasattr(b, "val"), a.deletion_attempted, b.deletion_attempted

    check(fn, t(1), fullgraph=True)


def test_reading_a_deleted_attribute_raises_attribute_error():
    class MyObj:
        def __init__(self, a, b):
            self.a = a
            self.b = b

    def fn(x, obj):
        del obj.a
        x = x + 1
        obj.a
        return x

    check(fn, lambda: (torch.zeros([]), MyObj(torch.zeros([]), torch.zeros([]))), counts=False)


def test_del_of_a_dict_key_of_an_argument():
    def fn(x):
        del x["a"]
        return x["b"] + 1

    check(fn, lambda: ({"a": torch.tensor([1]), "b": torch.tensor([1])},))


def test_reading_a_deleted_dict_key_raises_key_error():
    def fn(x):
        del x["a"]
        return x["a"] + 1

    check(fn, lambda: ({"a": torch.tensor([1]), "b": torch.tensor([1])},), counts=False)


@pytest.mark.xfail(strict=True, reason="dir(kiln.compile(module)) does not list an attribute just set on the compiled module (torch.compile's OptimizedModule does)")
def test_attribute_set_on_a_compiled_module_shows_in_dir():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(16, 16)

        def forward(self, x):
            return F.relu(self.linear(x))

    c = kiln.compile(M())
    c.is_compiled = True
    assert "is_compiled" in dir(c)


def test_size_indexed_by_a_size_and_sum_over_a_dim_from_shape():
    def fn(x):
        y = x * x.size(x.shape[0])
        torch.sum(y, [y.shape[0]])
        return y

    check(fn, t(3, 1, 1, 1, 1), fullgraph=True)


@pytest.mark.xfail(strict=True, reason="functools.wraps inside the function ('attribute assignment on a value kiln does not track') breaks, fullgraph raises; TorchDynamo: fullgraph ok")
def test_dalle2_maybe_decorator_on_a_function_argument():
    def normalize(x):
        return x.cos()

    def fn(x, normalize_img):
        return maybe(normalize_img)(x.sin())

    check(fn, lambda: (torch.ones([]), normalize), fullgraph=True)


@pytest.mark.xfail(strict=True, reason="functools.wraps inside the function ('attribute assignment on a value kiln does not track') breaks, fullgraph raises; TorchDynamo: fullgraph ok")
def test_functools_wraps_on_a_closure_returned():
    def cool_name(x):
        return x.sin()

    def fn(x):
        y = x.cos()

        @functools.wraps(cool_name)
        def uncool_name():
            return cool_name(y)

        return uncool_name

    r = kiln.compile(fn, fullgraph=True)(torch.ones([]))
    assert r.__name__ == "cool_name"
    same(r(), torch.ones([]).cos().sin())


def test_dropout_probability_from_a_shape_ratio():
    def fn(x):
        return F.dropout(x, x.shape[0] / 6, training=False), x.shape[0] / 6

    check(fn, t(3), fullgraph=True, counts=False)


def test_dataclass_default_factory_field_given_positionally():
    @dataclasses.dataclass
    class DClass:
        sharding_contexts: typing.Any = dataclasses.field(default_factory=list)
        a: int = 1

    def fn(x, inp_list):
        d = DClass(inp_list)
        d.sharding_contexts.append(x.sin() + d.a)
        return d

    c = kiln.compile(fn, fullgraph=True)
    x = torch.randn(4)
    for lst in ([1, 2, 3], [2, 3, 4], [1, 2]):
        a, b = list(lst), list(lst)
        want, got = fn(x, a), c(x, b)
        assert type(got) is DClass and got.a == want.a
        same(got.sharding_contexts, want.sharding_contexts)
        same(b, a)


@pytest.mark.parametrize("kind", ["list", "tuple", "size", "deque", "namedtuple"])
@pytest.mark.parametrize("index", [(), (2,), (0, 3)])
def test_index_method_of_sequences(kind, index):
    nt = collections.namedtuple("FourElems", "one two three four", defaults=[0, 0, 0, 0])
    make = {"list": list, "tuple": tuple, "size": torch.Size, "deque": collections.deque,
            "namedtuple": lambda v: nt(*v)}[kind]

    def fn(t_):
        xs = make([1, 2, 3, 4])
        return t_ + xs.index(3, *index)

    check(fn, lambda: (torch.zeros(1),), fullgraph=True)


def test_index_of_a_missing_item_raises_value_error():
    def fn(t_):
        xs = ["bar", "foo", "baz", "buzz"]
        return t_ + xs.index("non-existent")

    check(fn, lambda: (torch.zeros(1),), counts=False)


@pytest.mark.parametrize("index", [(), (2,), (0, 3)])
def test_index_of_a_tensor_in_a_list_of_tensors(index):
    def fn(t_):
        xs = [torch.tensor([i]) for i in range(4)]
        return t_ + xs.index(torch.tensor([2]), *index)

    check(fn, lambda: (torch.zeros(1),), counts=False)


def test_deberta_xsoftmax_inference():
    def fn(inp, mask):
        return XSoftmax.apply(inp + 1, mask, 1) + 2

    check(fn, lambda: (torch.randn(4, 10), torch.randn(4, 10) < 0), fullgraph=True)


def test_deberta_xsoftmax_training_backward():
    def fn(inp, mask):
        return XSoftmax.apply(inp, mask, 1)

    torch.manual_seed(1234)
    x = torch.randn(4, 10, requires_grad=True)
    mask = torch.randn(4, 10) < 0
    kx = x.detach().clone().requires_grad_()
    want, got = fn(x, mask), kiln.compile(fn)(kx, mask)
    same(got, want)
    want.sum().backward()
    got.sum().backward()
    same(kx.grad, x.grad)
    not_more_than_dynamo(fn, lambda: (torch.randn(4, 10, requires_grad=True), mask))


def test_autograd_function_with_a_break_in_forward():
    class MySin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            torch._dynamo.graph_break()
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, gx):
            (x,) = ctx.saved_tensors
            return gx * x.cos()

    def fn(x):
        return MySin.apply(x)

    x = torch.randn([], requires_grad=True)
    y = kiln.compile(fn)(x)
    same(y, x.sin())
    (gx,) = torch.autograd.grad(y, x)
    same(gx, x.detach().cos())


def test_optimizer_state_freed_after_a_compiled_step():
    model = nn.Linear(64, 64, bias=False)
    opt = torch.optim.Adadelta(model.parameters(), lr=0.01)
    c = kiln.compile(lambda: opt.step())
    opt.zero_grad()
    model(torch.ones(64)).sum().backward()
    c()
    ref = weakref.ref(opt.state[opt.param_groups[0]["params"][0]]["square_avg"])
    del opt, c
    gc.collect()
    assert ref() is None


def test_grad_freed_by_zero_grad_after_a_compiled_step():
    model = nn.Linear(64, 64, bias=False)
    opt = torch.optim.Adadelta(model.parameters(), lr=0.01)
    c = kiln.compile(lambda: opt.step())
    opt.zero_grad(True)
    model(torch.ones(64)).sum().backward()
    c()
    ref = weakref.ref(next(iter(model.parameters())).grad)
    opt.zero_grad(True)
    gc.collect()
    assert ref() is None


def test_in_place_add_of_a_tuple():
    def fn(x):
        a = ()
        x = torch.sin(x)
        a += (x,)
        return a

    check(fn, t(4), fullgraph=True)


def test_dict_keyed_by_python_and_numpy_types():
    d = {float: torch.float32, np.float16: torch.float16}

    def fn(x, y1, y2):
        return torch.zeros(5, dtype=d[y1]) + x.sum(), torch.zeros(5, dtype=d[y2])

    check(fn, lambda: (torch.zeros(4), float, np.float16))


def test_same_global_tensor_twice():
    def fn():
        return GLOBAL_T + GLOBAL_T

    check(fn)


def test_randint_into_out_tensors_of_changing_size():
    def fn(high, size, out):
        return torch.randint(high, size, out=out)

    c = kiln.compile(fn)
    for n in (10, 12):
        out = torch.empty(n, dtype=torch.int32)
        r = c(17, (n,), out)
        assert r.shape == (n,) and r.dtype == torch.int32 and bool(((r >= 0) & (r < 17)).all())


@pytest.mark.xfail(strict=True, reason="a caller's list that holds itself breaks ('a list or dict of the caller's that holds itself'), nothing captured; TorchDynamo: 1 graph")
def test_list_that_contains_itself():
    root = []
    root[:] = [root, root, None, None]

    def fn(x):
        return root[0] is root, x + 1

    check(fn, t(2))


@pytest.mark.xfail(strict=True, reason="unsqueeze_ on a tensor made before a break (an input of the resumed frame) breaks again: 5 breaks; TorchDynamo: 2")
def test_bigbird_bmm_behind_a_break_then_unsqueeze_in_place():
    def bmm_nd(a, b, ndim=None):
        torch._dynamo.graph_break()
        return torch.bmm(a, b)

    def fn(i1, i2, i3, i4, c):
        a = bmm_nd(i1, i2, 4)
        a.unsqueeze_(2)
        a = a * 2
        b = bmm_nd(i3, i4, 4)
        b.unsqueeze_(2)
        return torch.cat([a, b, c], dim=2), a + b

    check(fn, lambda: (torch.rand(1, 16, 32), torch.rand(1, 32, 16), torch.rand(1, 16, 32), torch.rand(1, 32, 16),
                       torch.rand(1, 16, 1, 16)))


def test_torchvision_check_type_with_a_list_of_types():
    def fn(obj, types_or_checks):
        for tc in types_or_checks:
            if isinstance(obj, tc) if isinstance(tc, type) else tc(obj):
                return True
        return False

    check(fn, lambda: (torch.randn(4), [torch.Tensor]))
    check(fn, lambda: (torch.randn(4), [int, lambda o: o.dim() == 1]), counts=False)


def test_matmul_of_3d_under_inference_mode_dynamic():
    def fn(p):
        return torch.matmul(p, p)

    c = kiln.compile(fn, dynamic=True)
    inp = torch.randn(4, 4, 4, requires_grad=True)
    with torch.inference_mode():
        got = c(inp)
        want = fn(inp)
    same(got, want)


def test_frexp_with_out_list_in_kwargs():
    class M(nn.Module):
        def forward(self, param):
            return torch.frexp(**param)

    def mk():
        return ({"input": torch.tensor([[0.0, 1, 2, 4]]),
                 "out": [torch.empty(0, dtype=torch.float32), torch.empty(0, dtype=torch.int32)]},)

    m = M()
    got = kiln.compile(m)(*mk())
    same(tuple(got), tuple(m(*mk())))


def test_split_with_sizes_from_tolist():
    def fn(result, sizes):
        return torch.ops.aten.split_with_sizes(result, sizes.tolist())

    check(fn, lambda: (torch.randn(32, requires_grad=True), torch.tensor((7, 16, 9))), counts=False)


def test_module_attribute_holding_a_torch_function_called_with_kwargs():
    class UserModule(nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, **inp):
            return self.fn(**inp)

    m = UserModule(F.binary_cross_entropy)
    inputs = {"input": torch.rand(2, 9), "target": torch.rand(2, 9), "reduction": "mean"}
    same(kiln.compile(m, fullgraph=True)(**inputs), m(**inputs))


def test_str_format_with_a_keyword_in_a_branch():
    s = "temp{i}"

    def fn(x):
        if s.format(i=4) == "temp4":
            return torch.sin(x)
        return torch.cos(x)

    check(fn, t(4), fullgraph=True)


def test_int_format_as_binary():
    def fn(x, num):
        return x + 1, format(num, "b")

    check(fn, lambda: (torch.zeros(1), 10))


def test_tensor_in_an_empty_list():
    def fn(x, lst):
        if x in lst:
            return x.cos()
        return x.sin()

    check(fn, lambda: (torch.randn(2, 2), []))


@pytest.mark.xfail(strict=True, reason="typing.get_type_hints breaks ('call to mappingproxy.get'), fullgraph raises; TorchDynamo: fullgraph ok")
def test_typing_get_type_hints_of_a_class():
    class Foo:
        a: int

    def fn(x):
        typing.get_type_hints(Foo, include_extras=True)
        return torch.sin(x)

    check(fn, t(4), fullgraph=True)


@pytest.mark.parametrize("hint", ["typing", "pep585"])
def test_jit_isinstance_of_a_tensor_against_a_list_type(hint):
    h = typing.List[str] if hint == "typing" else list[str]  # noqa: UP006

    def fn(x):
        if torch.jit.isinstance(x, h):
            return x * 2
        return x

    check(fn, t(4), counts=False)


@pytest.mark.parametrize("op", [torch.add, torch.sub])
def test_add_sub_with_alpha_into_out(op):
    def fn(inp, other, out):
        return op(inp, other, alpha=2, out=out)

    check(fn, lambda: (torch.randn(2, 3, 4), 1, torch.zeros(2, 3, 4)), counts=False)


def test_add_of_python_floats_with_alpha_into_a_0d_out():
    def fn(out):
        return torch.add(2, 1.1, alpha=0.4, out=out)

    check(fn, lambda: (torch.tensor(0.0),), counts=False)


def test_size_compared_with_a_tuple_under_dynamic():
    def fn(x):
        if x.size() != (5, 1, 2, 3):
            return x.cos()
        return x.sin()

    c = kiln.compile(fn, dynamic=True)
    for shape in [(5, 1, 3, 4), (5, 1, 2, 3), (5, 1, 3, 4)]:
        x = torch.ones(*shape)
        same(c(x), fn(x))


def test_size_compared_with_a_tuple_static_shapes():
    def fn(x):
        if x.size() != (5, 1, 2, 3):
            return x.cos()
        return x.sin()

    c = kiln.compile(fn)
    for shape in [(5, 1, 2, 3), (5, 1, 3, 4)]:
        x = torch.ones(*shape)
        same(c(x), fn(x))


def test_torch_check_on_an_item_raises_for_a_negative_value():
    def fn(x):
        y = x.item()
        torch._check(y >= 0)
        if y >= 0:
            return x * 2
        return x * 3

    c = kiln.compile(fn)
    same(c(torch.tensor([3])), fn(torch.tensor([3])))
    with pytest.raises(RuntimeError):
        c(torch.tensor([-2]))


def test_addr_with_alpha_beta_into_out():
    def fn(inp, v1, v2, out):
        return torch.addr(inp, v1, v2, alpha=2, beta=5, out=out)

    check(fn, lambda: (torch.randn(2, 3), torch.randn(2), torch.randn(3), torch.zeros(2, 3)), counts=False)


def test_setting_requires_grad_on_an_input_midway():
    def fn(x):
        z = x + 4
        x.requires_grad = True
        return x * z

    c = kiln.compile(fn)
    e, k = torch.zeros(5), torch.zeros(5)
    oe, ok = fn(e), c(k)
    same(ok, oe)
    oe.sum().backward()
    ok.sum().backward()
    same(k, e)
    same(k.grad, e.grad)
    not_more_than_dynamo(fn, lambda: (torch.zeros(5),))


def test_callable_object_made_inside():
    class MyCallable:
        def __call__(self, x):
            return x + 1

    def fn(x):
        return MyCallable()(x)

    check(fn, lambda: (torch.zeros(1),), fullgraph=True)


def test_relu_in_place_on_one_of_many_overlapping_views():
    def fn(xs):
        xs[0].relu_()
        return torch.cat(xs).sum()

    def mk():
        src = torch.randn(16 * 9)
        return ([src.as_strided((4, 4), (4, 1), 3 + 16 * i) for i in range(8)],)

    c = kiln.compile(fn)
    for _ in range(2):
        src = torch.randn(16 * 9)
        ksrc = src.clone()
        e = [src.as_strided((4, 4), (4, 1), 3 + 16 * i) for i in range(8)]
        k = [ksrc.as_strided((4, 4), (4, 1), 3 + 16 * i) for i in range(8)]
        same(c(k), fn(e))
        same(ksrc, src)


def test_numpy_tobytes_between_in_place_updates():
    def fn(x):
        x += 1
        z = x.tobytes()
        x += 1
        return z

    a, b = np.array([1, 2]), np.array([1, 2])
    assert kiln.compile(fn)(a) == fn(b)
    assert (a == b).all()


def test_numpy_default_none_int_str_arguments():
    def fn(x=None):
        if x is None:
            x = np.ones(3)
        elif isinstance(x, int):
            x = np.ones(6)
        elif isinstance(x, str):
            x = np.ones(9)
        return x ** 2

    c = kiln.compile(fn)
    for args in [(np.zeros((2, 2)),), (), (10,), ("10",)]:
        got, want = c(*args), fn(*args)
        assert type(got) is type(want) and np.array_equal(got, want)


@pytest.mark.parametrize("which", ["add_after", "reset_other", "identity"])
def test_assigning_tensor_data(which):
    def func1(x, y):
        x.data = y
        x.add_(1)
        return x

    def func2(x, y):
        x.data = y
        y.data = torch.zeros([0])
        return x

    def func3(x, y):
        z = x
        x.data = y
        y.data = torch.zeros([0])
        return torch.tensor(x is z)

    fn = {"add_after": func1, "reset_other": func2, "identity": func3}[which]
    rg = fn is not func1
    c = kiln.compile(fn)
    for _ in range(3):
        ea, eb = torch.ones(6, requires_grad=rg), torch.ones(6, requires_grad=rg)
        ka, kb = torch.ones(6, requires_grad=rg), torch.ones(6, requires_grad=rg)
        oe, ok = fn(ea, eb), c(ka, kb)
        same(ka, ea)
        same(kb, eb)
        assert torch.equal(oe, ok)
        if rg:
            g = torch.randn(6)
            ea.backward(g)
            ka.backward(g.clone())
            same(ka.grad, ea.grad)


def test_assigning_tensor_data_of_another_dtype():
    def fn(x, y):
        x.data = y.to(dtype=torch.bfloat16)

    check(fn, lambda: (torch.tensor([], dtype=torch.float32), torch.tensor([1.0, 2, 3])), counts=False)


def test_context_manager_class_made_but_not_entered():
    class UserCtx:
        def __enter__(self):
            return 1

        def __exit__(self, *a):
            pass

    def fn(x, y):
        ucm = UserCtx()  # noqa: F841
        return x * x

    check(fn, lambda: (torch.rand(2, 2), torch.rand(2, 2)), fullgraph=True)


def test_context_manager_class_whose_init_mutates_a_list_argument():
    class UserCtx:
        def __init__(self, x):
            x[0] = 10

        def __enter__(self):
            return 1

        def __exit__(self, *a):
            pass

    def fn(x, y):
        ucm = UserCtx(y)  # noqa: F841
        return x * y[0]

    check(fn, lambda: (torch.rand(2, 2), [5]), fullgraph=True)


def test_context_manager_class_init_counting_calls():
    class UserCtx:
        def __init__(self, k):
            k[0] += 1

        def __enter__(self):
            return 1

        def __exit__(self, *a):
            pass

    def fn(x, counter):
        x = x * x
        ucm = UserCtx(counter)  # noqa: F841
        return x * x

    counter = [0]
    c = kiln.compile(fn)
    x = torch.rand(2, 2)
    same(c(x, counter), fn(x, counter))
    assert counter[0] == 2
    for _ in range(10):
        c(x, counter)
    assert counter[0] == 12


def test_arange_up_to_an_item_then_mask():
    class PaddingNet(nn.Module):
        def forward(self, lengths):
            row = torch.arange(0, lengths.max().item(), 1)
            mask = (row < torch.unsqueeze(lengths, dim=-1)).type(torch.float32)
            return mask[:, :, None]

    m = PaddingNet()
    c = kiln.compile(m)
    for lens in ([5, 4, 4, 4], [2, 7, 1]):
        x = torch.tensor(lens, dtype=torch.int32)
        same(c(x), m(x))


def test_int_enum_with_classmethod_properties_as_slice_indices():
    class Idx(enum.IntEnum):
        _X = 0
        _Y = 1
        _HEADING = 2

        @classmethod
        def size(cls):
            return 5

        @classmethod
        @property
        def POINT(cls):
            return slice(cls._X, cls._Y + 1)

        @classmethod
        @property
        def HEADING(cls):
            return cls._HEADING

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, Idx.size()))

        def forward(self, x):
            s = self.mlp(x)
            s[..., Idx.POINT] = s[..., Idx.POINT].tanh() * 32
            s[..., Idx.HEADING] = s[..., Idx.HEADING].tanh() * torch.pi
            return s

    m = M().eval()
    check(m, t(1, 10), compiled=kiln.compile(m, fullgraph=True), counts=False)


def test_unpacking_too_many_values_raises_value_error():
    def myfn(arg):
        (a, b) = arg  # noqa: F841

    def fn(x):
        myfn((1, 2, 3))
        return x

    check(fn, t(2), counts=False)


def test_class_read_from_a_closure_cell_that_changes():
    def run():
        def fn(x):
            return T(5).x + x

        c = kiln.compile(fn)
        x = torch.randn(4)
        T = IncByOne
        same(c(x), fn(x))
        T = IncByTwo
        same(c(x), fn(x))

    run()


def test_membership_in_a_range():
    def fn(x):
        if 3 in range(10):
            return x + 1
        return x + 2

    check(fn, t(4))


def test_add_in_place_through_as_strided_of_an_input():
    def fn(a):
        a.as_strided((2,), (1,), 0).add_(1.0)
        return a

    check(fn, t(2, 4))


def test_add_in_place_through_as_strided_of_a_diagonal_view():
    def fn(a):
        a.diagonal().as_strided((2,), (1,), 0).add_(1.0)
        return a

    check(fn, t(2, 4), counts=False)


def test_clone_with_preserve_format_keeps_a_solves_strides():
    def fn(src):
        q, r = torch.linalg.qr(src)
        rhs = torch.ones(q.shape[0], 1)
        a = torch.linalg.solve_triangular(r, q.T @ rhs, upper=True)
        return a.stride(), a.clone(memory_format=torch.preserve_format).stride()

    assert kiln.compile(fn)(torch.rand(5, 5)) == fn(torch.rand(5, 5))


def test_clone_of_a_non_dense_view_has_dense_strides():
    def fn(x):
        return x.t()[::2, ::2].clone()

    x = torch.randn(10, 8)
    got, want = kiln.compile(fn)(x), fn(x)
    same(got, want)
    assert got.stride() == want.stride() == (1, 4)


def test_asserts_on_shapes_and_values_under_dynamic():
    def fn(x):
        assert x.shape[0] > 3
        assert x[0].sum() > 0
        assert 1 % (x.shape[0] // 2) != 0
        assert 32 * (x.shape[0] // 2) ** 2 - 16 * (x.shape[0] // 2) != 0
        return x.cos()

    def f_fail(x):
        assert x.shape[0] < 3

    same(kiln.compile(fn, dynamic=True)(torch.ones(6, 4)), fn(torch.ones(6, 4)))
    with pytest.raises(AssertionError):
        kiln.compile(f_fail, dynamic=True)(torch.ones(6, 4))


def test_detectron2_instances_cat():
    class Instances:
        def __init__(self, image_size, **kwargs):
            self._image_size = image_size
            self._fields = {}
            for k, v in kwargs.items():
                self.set(k, v)

        @property
        def image_size(self):
            return self._image_size

        def __setattr__(self, name, val):
            if name.startswith("_"):
                super().__setattr__(name, val)
            else:
                self.set(name, val)

        def __getattr__(self, name):
            if name == "_fields" or name not in self._fields:
                raise AttributeError(f"Cannot find field '{name}'")
            return self._fields[name]

        def __len__(self):
            for v in self._fields.values():
                return v.__len__()
            raise NotImplementedError("empty")

        def set(self, name, value):
            data_len = len(value)
            if len(self._fields):
                assert len(self) == data_len
            self._fields[name] = value

        def get(self, name):
            return self._fields[name]

        @staticmethod
        def cat(lists):
            assert all(isinstance(i, Instances) for i in lists)
            assert len(lists) > 0
            if len(lists) == 1:
                return lists[0]
            image_size = lists[0].image_size
            if not isinstance(image_size, torch.Tensor):
                for i in lists[1:]:
                    assert i.image_size == image_size
            ret = Instances(image_size)
            for k in lists[0]._fields:
                values = [i.get(k) for i in lists]
                v0 = values[0]
                if isinstance(v0, torch.Tensor):
                    values = torch.cat(values, dim=0)
                elif isinstance(v0, list):
                    values = list(itertools.chain(*values))
                elif hasattr(type(v0), "cat"):
                    values = type(v0).cat(values)
                else:
                    raise ValueError(type(v0))
                ret.set(k, values)
            return ret

    inst = [Instances((16, 16), a=torch.randn(16, 16), b=torch.randn(16, 16)) for _ in range(3)]

    def fn(instances):
        return instances[0].cat(instances)

    got, want = kiln.compile(fn, fullgraph=True)(inst), fn(inst)
    assert type(got) is type(want)
    same(got.__dict__, want.__dict__)


@pytest.mark.xfail(strict=True, reason="weakref.ref(tensor) made in the function breaks ('call to weakref.ReferenceType with tensor arguments'); TorchDynamo: fullgraph ok")
def test_weakref_made_inside_and_called():
    def fn(x, y):
        return weakref.ref(x)() * y

    check(fn, lambda: (torch.randn(4), torch.randn(4)), fullgraph=True)


def test_weakref_argument_compared_by_identity():
    weight = torch.randn(4)
    other = torch.randn(4)

    def fn(x_weak, w, y):
        if x_weak is not None and x_weak() is not w:
            return torch.sin(y)
        return torch.cos(y)

    c = kiln.compile(fn, fullgraph=True)
    y = torch.randn(4)
    wr = weakref.ref(weight)
    same(c(wr, weight, y), fn(wr, weight, y))
    same(c(wr, other, y), fn(wr, other, y))


def test_weakref_proxy_attribute_of_a_module():
    class Trainer:
        def __init__(self, x):
            self.foo = x

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.trainer = None

        def foo(self):
            return self.trainer.foo

    x = torch.randn(4)
    model = Model()
    trainer = Trainer(x)
    model.trainer = weakref.proxy(trainer)
    same(kiln.compile(model.foo, fullgraph=True)(), x)


def test_weakref_dereferenced_before_a_break():
    weight = torch.randn(4)

    def fn(x_weak, w, y):
        y = torch.sin(y)
        referent = x_weak()
        torch._dynamo.graph_break()
        if referent is not w:
            return torch.sin(y)
        return torch.cos(y)

    c = kiln.compile(fn)
    wr, y = weakref.ref(weight), torch.randn(4)
    same(c(wr, weight, y), fn(wr, weight, y))
    same(c(wr, torch.randn(4), y), fn(wr, torch.randn(4), y))
    kg, kb = kiln_counts(fn, wr, weight, y)
    assert kg <= dynamo_counts(fn, wr, weight, y)[0]


@pytest.mark.xfail(strict=True, reason="weakref.ref(tensor) made in the function breaks ('call to weakref.ReferenceType with tensor arguments'); TorchDynamo: fullgraph ok")
def test_weakref_to_an_intermediate_returned():
    def fn(t_):
        t_ = t_ * 2
        return weakref.ref(t_), t_

    t0 = torch.randn(2, 2, requires_grad=True)
    wr, y = kiln.compile(fn, fullgraph=True)(t0)
    assert wr() is y
    same(y, t0 * 2)


def test_weakref_whose_referent_dies_between_calls():
    def fn(x_weak, y):
        if x_weak() is not None:
            return torch.sin(y)
        return torch.cos(y)

    weight = torch.randn(4)
    wr = weakref.ref(weight)
    y = torch.randn(4)
    c = kiln.compile(fn, fullgraph=True)
    same(c(wr, y), fn(wr, y))
    del weight
    gc.collect()
    same(c(wr, y), fn(wr, y))


def test_weakref_callback_fires_when_the_referent_is_dropped_outside():
    called = []

    def fn(x):
        y = x + 1
        ref = weakref.ref(y, lambda r: called.append(1))
        torch._dynamo.graph_break()
        return y, ref

    y, _ = kiln.compile(fn)(torch.ones(3))
    del y
    gc.collect()
    assert called == [1]


def test_super_with_no_arguments_in_a_staticmethod_raises_the_same_error():
    class A:
        @staticmethod
        def foo():
            return super().__init__()

    def fn(obj):
        return obj.foo()

    with pytest.raises(RuntimeError) as e1:
        fn(A())
    with pytest.raises(RuntimeError) as e2:
        kiln.compile(fn)(A())
    assert str(e1.value) == str(e2.value)


@pytest.mark.xfail(strict=True, reason="super(Cls, Cls) / zero-arg super() in a classmethod breaks: kiln's super rejects a type as 2nd argument ('obj must be an instance or subtype of type'); TorchDynamo: fullgraph ok")
def test_super_of_class_and_class_in_a_staticmethod():
    class Parent:
        @staticmethod
        def greet():
            return 5

    class Child(Parent):
        @staticmethod
        def greet(x):
            return x * super(Child, Child).greet()

    child = Child()

    def fn(x):
        return child.greet(x)

    check(fn, t(4), fullgraph=True)


def test_super_calling_a_classmethod_sees_the_instances_class():
    class Parent:
        @classmethod
        def greet(cls):
            if cls == Parent:
                return 4
            if cls == Child:
                return 3
            if cls == GrandChild:
                return 5
            return 2

    class Child(Parent):
        def greet(self, x):
            return x * super().greet()

    class GrandChild(Child):
        pass

    gc_ = GrandChild()

    def fn(x):
        return gc_.greet(x)

    check(fn, t(4), fullgraph=True)


@pytest.mark.xfail(strict=True, reason="super(Cls, Cls) / zero-arg super() in a classmethod breaks: kiln's super rejects a type as 2nd argument ('obj must be an instance or subtype of type'); TorchDynamo: fullgraph ok")
def test_super_through_two_classmethods_reads_the_subclass_attribute():
    class GrandParent:
        @classmethod
        def greet(cls, x):
            return cls.A * x

    class Parent(GrandParent):
        @classmethod
        def greet(cls, x):
            return super().greet(x)

    class Child(Parent):
        A = 5

        @classmethod
        def greet(cls, x):
            return super().greet(x)

    child = Child()

    def fn(x):
        return child.greet(x)

    check(fn, t(4), fullgraph=True)


def test_super_init_through_a_diamond():
    class A:
        def __init__(self):
            super().__init__()
            self.a = 5

    class Nothing:
        pass

    class B(Nothing, A):
        def __init__(self):
            super().__init__()
            self.b = 10

        def run(self, x):
            return self.a * self.b * x

    def fn(x):
        return B().run(x)

    check(fn, t(4), fullgraph=True)


def test_in_place_mul_bumps_the_version_counter():
    def fn(x):
        return x.mul_(2)

    x = torch.randn(4)
    v = x._version
    kiln.compile(fn)(x)
    assert x._version > v


def test_callable_of_a_module():
    class M(nn.Module):
        def forward(self, x):
            return x.sin()

    def fn(x, m):
        return x + 1, callable(m)

    check(fn, lambda: (torch.randn(2), M()), fullgraph=True)


def test_stk_autograd_function_checks_transposed_strides_in_backward():
    def is_t(x):
        return not x.is_contiguous() and x.stride()[0] == 1 and x.stride()[1] == x.size()[0]

    class SDD(torch.autograd.Function):
        @staticmethod
        def forward(ctx, lhs, rhs):
            ctx.save_for_backward(lhs, rhs)
            return torch.full_like(lhs, 1.0, dtype=lhs.dtype, device=lhs.device)

        @staticmethod
        def backward(ctx, dy):
            lhs, rhs = ctx.saved_tensors[:2]
            dl = torch.full_like(lhs, 1.0 if is_t(lhs) else 2.0) if ctx.needs_input_grad[0] else None
            dr = torch.full_like(rhs, 1.0 if is_t(rhs) else 2.0) if ctx.needs_input_grad[1] else None
            return dl, dr

    x1 = torch.randn(8, 8, requires_grad=True)
    y1 = torch.randn(8, 8).transpose(0, 1).requires_grad_(True)
    x2 = x1.detach().clone().requires_grad_(True)
    y2 = y1.detach().clone().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_(True)
    SDD.apply(x1, y1).sum().backward()
    kiln.compile(lambda: SDD.apply(x2, y2), fullgraph=True)().sum().backward()
    same(x2.grad, x1.grad)
    same(y2.grad, y1.grad)


@pytest.mark.xfail(strict=True, reason="nn.Module built in the function storing a tensor attribute (self._data = t) breaks ('expected a Python value for attribute value, got a tensor'); TorchDynamo: fullgraph ok")
def test_module_property_read_inside_init_made_in_the_function():
    class Matrix(nn.Module):
        def __init__(self, data):
            super().__init__()
            self._data = data
            self.foo = 10 * self.blocking

        @property
        def data(self):
            return self._data

        @property
        def blocking(self):
            return self.data.shape[1]

    def fn(x):
        return Matrix(x)

    v = kiln.compile(fn, fullgraph=True)(torch.randn(10, 20))
    assert type(v) is Matrix and v.foo == 200 and v.data.shape == (10, 20)


def test_classmethod_on_a_class_with_slots():
    class Mock:
        __slots__ = ("_a",)

        def __init__(self):
            self._a = 2

        @classmethod
        def _m(cls):
            return 3

        def run(self, x):
            return torch.sin(x) * self._a * self._m()

    def fn(x):
        return Mock().run(x)

    check(fn, t(4), fullgraph=True)


def test_parametrized_parameter_then_parametrization_removed():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.param = nn.Parameter(torch.randn(10, 10))

        def forward(self, x):
            return self.param @ x

    class Sin(nn.Module):
        def forward(self, x):
            return torch.sin(x)

    m = M()
    torch.nn.utils.parametrize.register_parametrization(m, "param", Sin())
    c = kiln.compile(m)
    inp = torch.randn(10, 10)
    same(c(inp), m(inp))
    torch.nn.utils.parametrize.remove_parametrizations(m, "param")
    same(c(inp), m(inp))


def test_module_property_reading_a_closure_variable():
    x0 = torch.randn(10, 10)

    class Mod(nn.Module):
        @property
        def y(self):
            return torch.ones(10, 10) + x0

        def forward(self, x):
            return x @ self.y

    mod = Mod()

    def fn(x):
        return mod(x)

    check(fn, t(10, 10), fullgraph=True)


def test_module_global_function_replaced_between_calls():
    g = globals()
    old = g["global_fn"]

    def foo(x, y):
        return global_fn(x) + y

    try:
        c = kiln.compile(foo, fullgraph=True)
        x, y = torch.ones(1), torch.ones(1)
        same(c(x, y), foo(x, y))
        g["global_fn"] = lambda v: torch.cos(v)
        same(c(x, y), foo(x, y))
    finally:
        g["global_fn"] = old


def test_list_reverse_between_two_loops_of_matmuls():
    def ladder(x):
        trail = x.size(-1)
        assert trail > 2
        weights = []
        for s in [trail, trail - 1, trail - 2]:
            weights.append(torch.ones(s, s - 1))
        for w in weights:
            x = x @ w
        weights.reverse()
        for w in weights:
            x = x @ w.t()
        return x

    check(ladder, t(3, 4), fullgraph=True)


def test_key_error_from_an_empty_global_dict_caught():
    d = {}

    def fn(x):
        try:
            y = d[0]
        except KeyError:
            y = 1
        return x + y

    check(fn, t(3, 3))


def test_issubclass_of_an_arguments_class():
    def fn(x, y):
        if issubclass(x.__class__, np.ndarray):
            return y + 1
        return y

    c = kiln.compile(fn)
    for a in (np.ones([3, 3]), [1, 2]):
        same(c(a, torch.zeros(2)), fn(a, torch.zeros(2)))


def test_torchscript_function_with_default_as_module_attribute():
    @torch.jit.script
    def fast_cos(x, c: float = 2.0):
        return torch.cos(x) * c

    class Mod(nn.Module):
        def __init__(self):
            super().__init__()
            self.fast_cos = fast_cos

        def forward(self, x):
            return self.fast_cos(x)

    m = Mod()
    check(m, t(4), compiled=kiln.compile(m), counts=False)


def test_str_enum_with_missing_hook_constructed_by_value():
    class ExplicitEnum(str, enum.Enum):
        @classmethod
        def _missing_(cls, value):
            raise ValueError(f"{value} is not a valid {cls.__name__}")

    class PaddingStrategy(ExplicitEnum):
        LONGEST = "longest"
        MAX_LENGTH = "max_length"

    def fn(x):
        if PaddingStrategy("longest") == PaddingStrategy.LONGEST:
            return torch.sin(x)
        return torch.cos(x)

    check(fn, t(3, 3), fullgraph=True)


def test_getattr_with_default_on_the_type_of_an_argument():
    class MyClass:
        foo: int = 1

    def fn(x, m):
        if getattr(type(m), "foo", 0):
            return x + MyClass.foo
        return x

    c = kiln.compile(fn, fullgraph=True)
    x = torch.zeros(())
    same(c(x, MyClass()), fn(x, MyClass()))
    same(c(x, 0), fn(x, 0))


def test_grad_and_underscore_grad_are_one_attribute():
    def fn(x, y):
        x._grad = y + 1
        y.grad = x + 2
        return x.grad.data, y._grad.data

    check(fn, lambda: (torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)), counts=False)


def test_make_fx_tracing_check_in_activation_module():
    def fn(x):
        torch.nn.modules.activation._is_make_fx_tracing()
        return torch.sin(x)

    check(fn, t(4), fullgraph=True)


def test_module_attribute_int_changed_in_forward_indexes_a_tensor():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.nums = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
            self.t = 5

        def forward(self):
            self.num = self.nums[self.t // 12]
            self.t += 1
            return self.num

    m, km = M(), M()
    c = kiln.compile(km)
    for _ in range(10):
        same(c(), m())
    assert km.t == m.t


@pytest.mark.parametrize("method", ["random_", "uniform_"])
def test_random_and_uniform_in_place_with_positional_and_keyword_bounds(method):
    def op(tensor, args, kwargs):
        return getattr(tensor, method)(*args, **kwargs)

    c = kiln.compile(op)
    for args, kwargs in [([], {"from": -10, "to": 10}), ([-10], {"to": 10}), ([-10, 10], {})]:
        x = torch.randn(2, 3)
        r = c(x, args, kwargs)
        assert r is x and bool(((x >= -10) & (x <= 10)).all())


def test_data_mutated_after_being_saved_for_backward():
    def fn(x):
        out = x.sin()
        x.data.mul_(2)
        return out

    x = torch.randn(4, requires_grad=True)
    kx = x.detach().clone().requires_grad_(True)
    out, kout = fn(x), kiln.compile(fn)(kx)
    same(kout, out)
    out.sum().backward()
    kout.sum().backward()
    same(kx.grad, x.grad)
    same(kx, x)


@pytest.mark.parametrize("lens", [(3, 3), (3, 5)])
@pytest.mark.xfail(strict=True, reason="returning a map object: fullgraph raises 'returns a value kiln cannot rebuild'; TorchDynamo: fullgraph ok")
def test_map_over_two_lists_returned_lazily(lens):
    def f(a, b):
        return a[0] * b[0] + a[1] * b[1]

    def g(x, y):
        return map(f, x, y)

    x = [torch.randn(5) for _ in range(lens[0])]
    y = [torch.randn(5) for _ in range(lens[1])]
    got, want = kiln.compile(g, fullgraph=True)(x, y), g(x, y)
    assert type(got) is type(want)
    same(tuple(got), tuple(want))


# ==============================================================================================
# part 3: guards on nested state, complex, hooks, strides, module wrappers, out=, misc builtins
# ==============================================================================================

def test_attribute_of_an_object_in_a_tuple_in_a_dict_changes():
    class Foo:
        def __init__(self):
            self.x = 10

    d = {"a": 2, "b": (Foo(),)}

    def fn(x, d):
        return x * d["a"] * d["b"][0].x

    c = kiln.compile(fn)
    inp = torch.randn(3, 3)
    same(c(inp, d), fn(inp, d))
    d["b"][0].x = 12
    same(c(inp, d), fn(inp, d))


def test_multiply_a_complex_view_by_an_imaginary_scalar_and_backward():
    def fn(x):
        return torch.mul(x, 2j)

    xr = torch.randn(4, 2, requires_grad=True)
    xk = xr.detach().clone().requires_grad_(True)
    want, got = fn(torch.view_as_complex(xr)), kiln.compile(fn)(torch.view_as_complex(xk))
    same(got, want)
    torch.view_as_real(want).sum().backward()
    torch.view_as_real(got).sum().backward()
    same(xk.grad, xr.grad)


def test_add_a_complex_tensor_to_its_conjugate():
    def fn(x):
        return x + x.conj()

    check(fn, lambda: (torch.randn(4, dtype=torch.complex64, requires_grad=True),), counts=False)


@pytest.mark.xfail(strict=True, reason="a torch._dynamo.disable'd forward pre-hook: kiln traces into the disable wrapper ('call to torch._C._dynamo.eval_frame.set_eval_frame') and captures nothing; TorchDynamo: 1 graph (linear) around the hook")
def test_disabled_forward_pre_hook_on_a_builtin_submodule():
    @torch._dynamo.disable
    def hook(module, inp):
        return inp

    class Wrapper(nn.Module):
        def __init__(self, lin):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return self.lin(x)

    lin = nn.Linear(10, 5)
    lin.register_forward_pre_hook(hook)
    m = Wrapper(lin)
    check(m, t(3, 10), compiled=kiln.compile(m), counts=False)
    not_more_than_dynamo(m, t(3, 10))


def test_inputs_with_changing_strides_do_not_recompile_much():
    def fn(x, y):
        return x * y

    calls = []
    for i in range(1, 4):
        x = torch.randn(4, i)
        calls.append((x if i == 1 else x[:, 0:1], torch.randn(4, 1)))
    assert recompiles(fn, calls) <= max(2, dynamo_frames(fn, calls))


def test_compiled_module_training_flag_follows_the_module():
    m = nn.Linear(3, 3)
    m.eval()
    c = kiln.compile(m)
    assert not c.training
    c.train()
    assert c.training and m.training
    m.eval()
    assert not c.training


def test_module_whose_init_was_patched_with_functools_wraps():
    class M(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return x.mul(5.0)

    def patch_init(init):
        @functools.wraps(init)
        def wrapper(module, *args, **kwargs):
            if not hasattr(module, "_ds_child_entered"):
                module._ds_child_entered = True
            init(module, *args, **kwargs)
        return wrapper

    M.__init__ = patch_init(M.__init__)
    m = M()
    check(m, t(10), compiled=kiln.compile(m), counts=False)


def test_os_fspath_of_a_string():
    def fn(x):
        os.fspath(".")
        return torch.sin(x)

    check(fn, t(4), fullgraph=True)


def test_two_equal_outputs_are_distinct_tensors():
    def fn(v):
        return v * 2, v * 2

    a, b = kiln.compile(fn)(torch.randn(2, requires_grad=True))
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    a.data.add_(1)
    assert not torch.equal(a, b)


def test_outputs_made_in_and_out_of_no_grad_keep_their_requires_grad():
    def fn(v):
        with torch.no_grad():
            out0 = v + 1
        out1 = v + 1
        return out0, out1

    check(fn, lambda: (torch.randn(2, requires_grad=True),))


def test_two_equal_scalar_outputs_are_distinct_tensors():
    def fn(v):
        x, y = v * 2, v * 2
        return x[0], y[0]

    a, b = kiln.compile(fn)(torch.randn(2, requires_grad=True))
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


def test_kiln_compile_called_inside_a_compiled_function():
    def gn(x, c=None):
        if c is None:
            c = 2
        return c * x

    def outer(x):
        return kiln.compile(gn)(x)

    x = torch.randn(4)
    same(kiln.compile(outer)(x), gn(x))


def test_deepspeed_like_parameters_dict_replaced_by_an_ordered_dict_subclass():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(2, 2)
            self.fc2 = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc2(self.fc1(x))

    class ZeroDict(collections.OrderedDict):
        def __init__(self, parent_module=None, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._parent_module = parent_module

        def __getitem__(self, key):
            param = super().__getitem__(key)
            if param is None:
                return param
            return param

    m = M()
    for mod in m.modules():
        new = ZeroDict(parent_module=mod)
        for k, p in mod._parameters.items():
            new[k] = p
        mod._parameters = new
    x = torch.ones(2)
    with torch.no_grad():
        same(kiln.compile(m, fullgraph=True)(x), m(x))


def test_typed_dict_constructed_with_total_as_a_key():
    class Inputs(typing.TypedDict):
        type: typing.Literal["pixel_values"]
        data: torch.Tensor

    def fn(x, y):
        obj = Inputs(data=y, total=False)
        return x * obj["data"], obj

    check(fn, lambda: (torch.randn(4), torch.randn(4)), fullgraph=True)


def test_list_comprehension_in_a_forward_skipped_non_recursively():
    class Module(nn.Module):
        def __init__(self):
            super().__init__()
            self._num = 4

        @torch._dynamo.disable(recursive=False)
        def forward(self, x):
            return sum([i * torch.cos(x) for i in range(self._num)])

    mod = Module()

    def fn(x):
        return mod(x)

    check(fn, t(4), counts=False)


def test_categorical_subclass_passed_as_a_class_argument():
    class SubCateg(torch.distributions.Categorical):
        pass

    def fn(t_, d):
        categ = d(logits=t_)
        return categ.log_prob(categ.sample()) + categ.probs + categ.logits

    c = kiln.compile(fn)
    for _ in range(2):
        x = torch.randn(10)
        r = c(x, SubCateg)
        assert r.shape == (10,)
        want = torch.distributions.Categorical(logits=x)
        lp = r - want.probs - want.logits
        assert torch.allclose(lp, lp[0].expand(10)) and bool((lp <= 0).all())


def test_torch_check_with_bitwise_or_and_floor_on_a_size():
    def fn(x):
        torch._check(math.floor((x.size(0) | 3) * 4) == 12)
        return x.sin()

    check(fn, t(2), dynamic=True, counts=False)


def test_split_under_a_device_context_manager():
    def fn(x):
        return x.split(4, 0)

    c = kiln.compile(fn, fullgraph=True)
    x = torch.zeros(12)
    res = c(x)
    with torch.device("cpu"):
        same(c(x), res)


def test_bound_method_of_the_parent_stored_on_a_child_module():
    class DilateConv(nn.Module):
        def __init__(self, dilate_func=None):
            super().__init__()
            self.dilate_func = dilate_func

        def forward(self, x):
            return self.dilate_func() * torch.sin(x)

    class Main(nn.Module):
        def __init__(self):
            super().__init__()
            self.mod = DilateConv(self.dilate_func)
            self.a = 4

        def dilate_func(self):
            return self.a

        def forward(self, x):
            return self.mod(x)

    m = Main()
    check(m, t(4), compiled=kiln.compile(m, fullgraph=True), counts=False)


@pytest.mark.parametrize("op", ["is", "is not"])
def test_is_between_a_symbolic_size_and_a_list(op):
    if op == "is":
        def fn(x, xs):
            return x + 1 if x.size(0) is xs else x * 2
    else:
        def fn(x, xs):
            return x + 1 if x.size(0) is not xs else x * 2

    check(fn, lambda: (torch.randn(2), [1, 2]), dynamic=True, fullgraph=True, counts=False)


def test_copy_an_int_into_a_tensor():
    def fn(x):
        return x.copy_(1)

    check(fn, lambda: (torch.zeros(2),), fullgraph=True)


def test_bitwise_operators_on_a_symbolic_size():
    def fn(x):
        z = x.shape[0]
        z |= z >> 1
        z |= z << 1
        z &= z | (z > 1)
        y = (z > 1) | (z <= 1)
        z = (z | z) % 6
        return y, z

    check(fn, t(3, 3), dynamic=True, fullgraph=True, counts=False)


def test_branches_on_bitwise_and_or_of_sizes():
    def fn(x):
        if x.shape[0] | x.shape[1] > 4:
            x = x + 1
        if x.shape[0] & x.shape[1] > 2:
            return x + 1
        return x - 1

    c = kiln.compile(fn, dynamic=True)
    for shape in [(3, 3), (4, 1), (2, 8), (5, 6)]:
        x = torch.randn(*shape)
        same(c(x), fn(x))


@pytest.mark.parametrize("factory", ["ones", "zeros", "empty"])
def test_factory_into_out_of_changing_size(factory):
    def fn(size, out):
        return getattr(torch, factory)(size, out=out)

    c = kiln.compile(fn)
    for size in [(2, 3), (3, 4)]:
        out = torch.empty(size)
        r = c(size, out)
        assert r is out and r.shape == size
        if factory != "empty":
            same(r, fn(size, torch.empty(size)))


def test_dataclass_attribute_of_a_module_made_into_a_tensor():
    @dataclasses.dataclass
    class MyData:
        value: float

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.my_data = MyData(value=3.14)

        def forward(self, x):
            return x + torch.tensor(self.my_data.value)

    m = M()
    check(m, t(2, 2), compiled=kiln.compile(m), counts=False)


def test_torch_typename_of_typing_any():
    def fn(obj):
        return torch.typename(obj)

    assert kiln.compile(fn)(typing.Any) == fn(typing.Any)


@pytest.mark.xfail(strict=True, reason="WRONG VALUES under backend='eager': torch.rand after manual_seed draws other numbers than eager (TorchDynamo's eager backend draws the same)")
def test_random_indices_are_not_dropped_as_dead_code():
    def fn(latent):
        x = torch.rand(2, 12)
        idx = torch.argsort(torch.rand(*x.shape), dim=-1)[:, :6]
        return latent[torch.arange(2).unsqueeze(-1), idx][:, :3]

    latent = torch.randn(2, 12, 4, 8)
    torch.manual_seed(54321)
    want = fn(latent)
    torch.manual_seed(54321)
    got = kiln.compile(fn, backend="eager", fullgraph=True)(latent)
    same(got, want)


def test_str_isalnum_called_unbound():
    def fn(x, c):
        str.isalnum(c)
        return x.sin()

    check(fn, lambda: (torch.randn(3), "foobar"), fullgraph=True)


def test_parameters_replaced_in_forward_under_no_grad():
    class Model2(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 5, kernel_size=3)
            self.batchnorm = nn.BatchNorm2d(5)
            self.conv_weight = torch.randn(5, 3, 3, 3)
            self.conv_bias = torch.randn(5)

        def forward(self, x):
            self.conv.weight = nn.Parameter(self.conv_weight)
            self.conv.bias = nn.Parameter(self.conv_bias, requires_grad=False)
            self.conv.eval()
            return F.relu(self.batchnorm(self.conv(x)))

    m = Model2()

    @functools.wraps(m)
    def wrapper(*args, **kwargs):
        return m(*args, **kwargs)

    x = torch.randn(1, 3, 10, 10)
    with torch.no_grad():
        m.train(False)
        want = m(x)
        got = kiln.compile(wrapper)(x)
    same(got, want)


def test_amp_foreach_unscale_and_non_finite_check():
    def fn(grads, found_inf, inv_scale):
        return torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)

    check(fn, lambda: ([torch.ones(10), torch.tensor([1.0, float("inf")])], torch.full((1,), 0.0),
                       torch.full((1,), 0.25)), counts=False)


def test_reset_between_two_compiles_of_the_same_function():
    def fn(x):
        return x + 1

    c = kiln.compile(fn)
    kiln.reset()
    same(c(torch.ones(3)), torch.full((3,), 2.0))
    c = kiln.compile(fn)
    same(c(torch.ones(3)), torch.full((3,), 2.0))


def test_reading_a_deleted_local_raises_unbound_local_error():
    def fn(x):
        y = x + 1
        del y
        z = y + 1  # noqa: F821
        return z

    check(fn, lambda: (torch.ones(3),), counts=False)


def test_nanmean_into_a_0d_out():
    def fn(x, out):
        torch.nanmean(x, out=out)

    check(fn, lambda: (torch.randn(4), torch.tensor(0.0)), fullgraph=True)


def test_comprehension_variable_also_a_cell_after_a_break():
    keys = range(10)
    allowed = [0, 1, 2, 3]

    def fn(x):
        x = x + 1
        torch._dynamo.graph_break()
        key = [key for key in keys if key in allowed]

        def inner():
            nonlocal key

        return x + key[0]

    check(fn, lambda: (torch.ones(3),))


def test_assertion_error_raised_in_a_with_block_after_a_break(capsys):
    cell = 0

    def fn(x):
        x = x + 1 + 2
        torch._dynamo.graph_break()
        with contextlib.nullcontext():
            print(cell)
            raise AssertionError

    with pytest.raises(AssertionError):
        kiln.compile(fn)(torch.ones(3))


def test_unbind_copy_into_a_tuple_of_outs():
    def fn(eye, out):
        torch.unbind_copy(eye, out=out)

    check(fn, lambda: (torch.eye(3), (torch.zeros(3), torch.zeros(3), torch.zeros(3))), fullgraph=True)


def test_setitem_of_a_grad_row_into_a_plain_tensor_then_autograd_function():
    class MyFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.matmul(x, x.t())

        @staticmethod
        def backward(ctx, g):
            return g

    def fn(x, y):
        x[0] = y[0]
        return MyFn.apply(x)

    def mk():
        torch.manual_seed(123)
        return torch.randn(10, 10), torch.randn(10, 10, requires_grad=True)

    x1, y1 = mk()
    fn(x1, y1).sum().backward()
    x2, y2 = mk()
    kiln.compile(fn)(x2, y2).sum().backward()
    assert x2.requires_grad == x1.requires_grad
    same(y2.grad, y1.grad)


def test_parameter_constructed_in_the_function():
    def fn(x):
        param = nn.Parameter(torch.ones(10))
        return param * 2 + x

    check(fn, lambda: (torch.randn(10),), counts=False)


def test_select_scatter_of_an_int_tensor_into_a_float_tensor():
    class M(nn.Module):
        def forward(self, x):
            return torch.select_scatter(x, torch.tensor([0]), 1, 0)

    m = M()
    check(m, t(1, 10), compiled=kiln.compile(m), counts=False)


def test_autograd_function_stashing_tensors_on_ctx_mutated_in_backward():
    class Mutating(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, z):
            ctx.b = b
            ctx.save_for_backward(a)
            return z + 1

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            ctx.b.mul_(2)
            return None, None, g + 2 + a

    def fn(*args):
        return Mutating.apply(*args)

    c = kiln.compile(fn)
    a, b = torch.zeros(4), torch.ones(4)
    z1, z2 = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    o1, o2 = c(a, b, z1), c(a, b, z2)
    o1.sum().backward()
    o2.sum().backward()
    same(b, torch.full((4,), 4.0))
    same(z2.grad, torch.full((4,), 3.0))


def test_property_setter_and_dict_get_with_a_disabled_len():
    class Container:
        def __init__(self):
            self._len_value = 0

        @property
        def _len(self):
            return self.__dict__.get("_len_value", 0)

        @_len.setter
        def _len(self, value):
            self._len_value = value

        def add(self, n):
            self._len = self._len + n

        @torch.compiler.disable()
        def __len__(self):
            return self._len

    c_ = Container()

    def fn(x):
        c_.add(x.shape[0])
        return len(c_)

    assert kiln.compile(fn)(torch.randn(5)) == 5
    assert c_._len_value == 5


def test_one_hot_raises_on_out_of_range_classes():
    c = kiln.compile(F.one_hot, fullgraph=True)
    a = torch.arange(0, 5) % 3
    with pytest.raises(RuntimeError):
        c(a, 1)
    with pytest.raises(RuntimeError):
        c(torch.tensor([-1, 0, 1]), 3)
    same(c(a, 3), F.one_hot(a, 3))


def test_checkpoint_with_a_selective_policy_from_a_set():
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    def policy(heavy, ctx, func, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if func in heavy else CheckpointPolicy.PREFER_RECOMPUTE

    def g(x):
        return torch.mm(x, x).sin().exp()

    def fn(x, pol):
        return checkpoint(g, x, use_reentrant=False, context_fn=pol)

    c = kiln.compile(fn)
    for _ in range(2):
        x = torch.randn(4, 4, requires_grad=True)
        kx = x.detach().clone().requires_grad_()
        pol = functools.partial(create_selective_checkpoint_contexts,
                                functools.partial(policy, {torch.ops.aten.mm.default}))
        want, got = fn(x, pol), c(kx, pol)
        same(got, want)
        want.sum().backward()
        got.sum().backward()
        same(kx.grad, x.grad)


def test_lr_scheduler_made_in_the_function_and_returned():
    model = nn.Linear(10, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def fn(x, optimizer):
        sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        return x * 2, sched

    x = torch.randn(10, 10)
    r, sched = kiln.compile(fn)(x, opt)
    same(r, x * 2)
    assert isinstance(sched, torch.optim.lr_scheduler.StepLR) and sched.optimizer is opt


def test_int_from_a_tensor_element_as_a_range_bound_in_a_loop():
    def fn(x, n):
        acc = x
        for i in range(int(n[0])):
            acc = acc + i
        return acc

    c = kiln.compile(fn)
    for k in (3, 5):
        same(c(torch.zeros(2), torch.tensor([k])), fn(torch.zeros(2), torch.tensor([k])))
