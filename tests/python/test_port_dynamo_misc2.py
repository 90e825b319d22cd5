"""Python semantics around tensors, ported from TorchDynamo's test/dynamo/_test_misc_part5..8.py
(rewritten, not copied; cases about Dynamo's own internals, config flags, FX text, export, logging,
tensor subclasses, torch.func and CUDA are left out, and so are those test_capture_semantics.py and
test_port_dynamo_state.py already have).

Every case runs the code eagerly and under kiln.compile on fresh inputs (twice, so a stale guard
shows), compares results, raised exception types and what the call did to its arguments; where a
case is about capture, kiln's graph / break counts are compared with torch._dynamo.explain's on the
same code (kiln may have fewer, never more)."""
import collections
import dataclasses
import functools
import gc
import inspect
import itertools
import math
import operator
import random
import sys
import types
import typing
import weakref

import numpy as np
import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree

import kiln


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

from _port_check import (check, clone_tree, dynamo_counts, dynamo_frames, kiln_counts, not_more_than_dynamo,  # noqa: F401
                         outcome, recompiles, same, t)


# ==============================================================================================
# part 5: classes, metaclasses, super, exceptions, with/try nesting, RNG state
# ==============================================================================================

def test_metaclass_instancecheck_decides_isinstance():
    class A:
        pass

    class Meta(type):
        def __instancecheck__(cls, instance):
            return True

    class B(metaclass=Meta):
        pass

    obj = A()

    def fn(x, o):
        return x + 1 if isinstance(o, B) else x - 1

    check(fn, lambda: (torch.rand(4), obj))


@pytest.mark.xfail(strict=True, reason="a class whose __new__ returns another type breaks the graph ('call to ...Child'); TorchDynamo: 0 breaks")
def test_new_returning_another_type_skips_init_even_with_custom_instancecheck():
    class Meta(type):
        def __instancecheck__(cls, instance):
            return isinstance(instance, Base) and instance.tag == cls._tag

    class Base:
        def __init__(self, tag="default"):
            self.tag = tag

    class Child(Base, metaclass=Meta):
        _tag = "child"

        def __new__(cls):
            return Base(tag="child")

    def fn(x):
        obj = Child()
        return x + len(obj.tag), obj.tag, type(obj) is Base

    check(fn, t(3))


@pytest.mark.xfail(strict=True, reason="a class whose __new__ returns object() breaks twice ('call to Child', 'call to builtins.object'); TorchDynamo: 0 breaks")
def test_new_returning_object_skips_a_raising_init():
    class AlwaysTrue(type):
        def __instancecheck__(cls, instance):
            return True

    class Child(metaclass=AlwaysTrue):
        def __new__(cls):
            return object()

        def __init__(self):
            raise AssertionError("must not run")

    def fn(x):
        o = Child()
        return x + 1, type(o) is object

    check(fn, t(3))


def test_list_multiplication_aliases_its_rows():
    def fn(x):
        data = [[None] * 3] * 3
        for i in range(3):
            data[0][i] = x if i == 0 else data[0][i - 1] + 1
        return data[0][-1], data[2][1], data[1] is data[2]

    check(fn, t(4))


def test_is_compiling_is_true_inside_the_compiled_function():
    def fn(x):
        a = torch.compiler.is_compiling()
        b = torch.compiler.is_dynamo_compiling()
        return x + (1 if a else 0) + (10 if b else 0), torch.compiler.is_exporting()

    x = torch.randn(3)
    got = kiln.compile(fn)(x)
    want = torch.compile(fn, backend="eager")(x)
    torch._dynamo.reset()
    same(got, want)


def test_generator_state_restored_after_a_break_repeats_the_draw():
    def fn():
        state = torch.default_generator.get_state()
        x = torch.rand([2, 3])
        if state.dtype != "float32":
            x = x * 2
        torch._dynamo.graph_break()
        torch.default_generator.set_state(state)
        y = torch.rand([2, 3])
        return x, y

    x, y = kiln.compile(fn)()
    torch.testing.assert_close(x, y * 2)


def test_generator_state_restored_inside_one_graph_repeats_the_draw():
    def fn(z):
        state = torch.get_rng_state()
        x = torch.rand([2, 3])
        torch.set_rng_state(state)
        y = torch.rand([2, 3])
        return x + z, y + z

    x, y = kiln.compile(fn)(torch.zeros(2, 3))
    torch.testing.assert_close(x, y)


def test_manual_seed_inside_makes_two_calls_draw_the_same():
    def fn(z):
        torch.manual_seed(7)
        return torch.rand(4) + z

    c = kiln.compile(fn)
    torch.testing.assert_close(c(torch.zeros(4)), c(torch.zeros(4)))


def test_categorical_entropy_lazy_property():
    def fn(x):
        return torch.distributions.Categorical(probs=x).entropy()

    check(fn, lambda: (torch.rand(4, 4),), counts=False)


def test_iterating_rows_of_an_input_and_updating_them_in_place():
    def fn(x):
        for y in x:
            y.add_(1.0)
        return y

    c = kiln.compile(fn)
    for shape in [(10, 10), (9, 10), (10, 10)]:
        args = (torch.randn(*shape),)
        ea, ka = clone_tree(args), clone_tree(args)
        same(c(*ka), fn(*ea))
        same(ka, ea)


def test_an_unused_fstring_of_a_shape_and_a_used_one():
    def fn(x):
        f"{x.shape[0]}"
        return x.sin()

    def gn(x):
        s = f"{x.shape[0]}"
        return x.sin(), s

    for f in (fn, gn):
        c = kiln.compile(f, dynamic=True)
        for n in (10, 9, 7):
            x = torch.randn(n, 11)
            same(c(x), f(x))


def test_branch_on_a_closed_over_tensors_data_follows_its_changes():
    state = torch.tensor([0.5, 0.5])

    def nested(s):
        if state[0] < 10:
            return s * s
        return s

    def fn(x, y):
        return (x + 1) * (nested(y) + 10)

    c = kiln.compile(fn)
    x, y = torch.randn(2), torch.randn(2)
    same(c(x, y), fn(x, y))
    state[0] = 20.0
    same(c(x, y), fn(x, y))
    state[0] = 1.0
    same(c(x, y), fn(x, y))


def test_super_classmethod_and_unbound_parent_calls_follow_a_class_attribute():
    class A:
        a = 4

        def add(self, x):
            return x + 10

        def mul(self, x):
            return x * 0.1

    class B(A):
        coeff = 4

        def add(self, x):
            return x + 20

        @classmethod
        def cube(cls, x):
            return cls.coeff * x * x * x

        def mul(self, x):
            return super().mul(x) * x * 0.2

    class C(B):
        def add(self, x):
            return super().cube(x) + A.add(self, x) + B.mul(self, x) + super(B, self).add(x) + super().a * x

    fn = C().add
    c = kiln.compile(fn, fullgraph=True)
    x = torch.rand(4)
    same(c(x), fn(x))
    A.a = 5
    same(c(x), fn(x))
    B.coeff = 2
    same(c(x), fn(x))


def test_isinstance_of_a_class_with_a_plain_metaclass():
    class Meta(type):
        pass

    class MyClass(metaclass=Meta):
        pass

    def fn(x, y):
        return x + 1 if isinstance(y, MyClass) else x - 1

    check(fn, lambda: (torch.rand(4, 4), MyClass()))
    check(fn, lambda: (torch.rand(4, 4), 3), counts=False)


def test_tuple_of_an_iterator_argument_consumes_it():
    def inner(*args):
        acc = torch.ones(10, 10)
        for a in args:
            acc.add_(a)
        return acc

    def fn(params):
        return inner(*tuple(params))

    c = kiln.compile(fn)
    for n in (3, 3, 4):
        inputs = [torch.randn(10, 10) for _ in range(n)]
        it_k, it_e = iter(tuple(inputs)), iter(tuple(inputs))
        same(c(it_k), fn(it_e))
        assert list(it_k) == list(it_e) == []


def test_argwhere_of_a_meshgrid_then_indexed_store():
    def fn(tensor, mapping):
        xx, yy = torch.meshgrid(mapping, tensor, indexing="ij")
        indices = torch.argwhere(xx == yy)
        out = torch.zeros_like(tensor)
        out[indices[:, 1]] = indices[:, 0]
        return out

    check(fn, lambda: (torch.tensor([1, 2, 3, 5, 6, 7]), torch.tensor([0, 3, 4, 5, 7])), counts=False)
    check(fn, lambda: (torch.randint(0, 8, (6,)), torch.randint(0, 8, (5,))), counts=False)


def test_size_compared_with_a_tuple_argument():
    def fn(x, y, tup):
        z = x * y
        if x.size() == tup:
            return z.cos()
        return z.sin()

    c = kiln.compile(fn)
    x = torch.randn(4, 4)
    for tup in [(4, 4), (4, 5), (4, 4), [4, 4]]:
        same(c(x, x, tup), fn(x, x, tup))


def test_int_list_argument_values_change():
    def fn(x, y):
        return torch.sin(x + y[1] % 2)

    x = torch.randn(6)
    calls = [(x, [i, i + 1, i + 2]) for i in range(10, 25, 3)]
    k = recompiles(fn, calls)
    d = dynamo_frames(fn, calls)
    assert k <= d, (k, d)


def test_builtins_isinstance_monkeypatched_between_calls():
    import builtins

    class MyClass:
        pass

    real = builtins.isinstance

    def patched(obj, classinfo):
        if real(obj, MyClass):
            return False
        return real(obj, classinfo)

    def fn(x, y):
        return x + 1 if isinstance(y, MyClass) else x - 1

    c = kiln.compile(fn)
    x, y = torch.ones(2, 3), MyClass()
    same(c(x, y), x + 1)
    try:
        builtins.isinstance = patched
        want = fn(x, y)
        got = c(x, y)
    finally:
        builtins.isinstance = real
    same(got, want)
    same(c(x, y), x + 1)


def test_real_imag_and_T_of_a_complex_input():
    def fn(x, y):
        return torch.mul(torch.add(x.real.T, y), x.imag)

    def make():
        return torch.complex(torch.rand(4, 4), torch.rand(4, 4)), torch.rand(4, 4)

    check(fn, make, counts=False)


def test_T_of_an_input():
    check(lambda x, y: torch.add(x.T, y), lambda: (torch.rand(4, 4), torch.rand(4, 4)))


def test_typing_cast_is_the_identity():
    from typing import cast

    def fn(x):
        return cast(torch.Tensor, torch.add(x, 1.0)) + cast(int, x.shape[0])

    check(fn, t(3, 4))


def test_typing_cast_of_self_in_a_mixin_with_two_module_types():
    from typing import cast

    class Mixin:
        def as_module(self):
            return cast(nn.Module, self)

    class A(Mixin, nn.Module):
        pass

    class B(Mixin, nn.Module):
        pass

    def fn(mod, x):
        m = mod.as_module()
        return x + (1 if m is mod else 2)

    c = kiln.compile(fn)
    for m in (A(), B(), A()):
        x = torch.randn(4)
        same(c(m, x), fn(m, x))


def test_a_function_stored_on_an_instance_is_not_bound():
    def my_add(*args):
        a, b = args
        return a + b

    class K:
        def __init__(self, func):
            self.add = func

    obj = K(my_add)
    check(lambda x: obj.add(x, 2), t(2, 3))


def test_a_function_stored_on_a_class_is_bound():
    def my_add(*args):
        o, a, b = args
        return o.x + a + b

    class K:
        add = my_add

        def __init__(self, x):
            self.x = x

    obj = K(0.5)
    c = check(lambda x: obj.add(x, 2), t(2, 3))
    obj.x = 1.5
    x = torch.randn(2, 3)
    same(c(x), obj.add(x, 2))


def test_custom_attribute_on_an_input_tensor_read_and_changed():
    def fn(x):
        return x.custom_attr * x

    c = kiln.compile(fn)
    x = torch.rand(2, 2)
    x.custom_attr = 3.14
    same(c(x), fn(x))
    x.custom_attr = 2.0
    same(c(x), fn(x))


def test_custom_attribute_set_on_an_input_tensor_stays_on_it():
    def fn(x):
        x.custom_attr = 3.14
        return x.custom_attr * x

    x = torch.rand(2, 2)
    same(kiln.compile(fn)(x), fn(x.clone()))
    assert x.custom_attr == 3.14


def test_in_place_update_before_a_raise_is_kept():
    def fn(a):
        a += 1
        raise RuntimeError("smoge")

    c = kiln.compile(fn)
    a = torch.ones(2)
    with pytest.raises(RuntimeError, match="smoge"):
        c(a)
    same(a, torch.full((2,), 2.0))


def test_nested_try_raises_from_the_inner_handler():
    def fn():
        def test1(*, is_sparse):
            a = torch.ones(2, 3)
            if is_sparse:
                return torch.addmm(a, a.to_sparse_csr(), a)
            return torch.addmm(a, a, a)

        try:
            test1(is_sparse=False)
        except RuntimeError:
            try:
                test1(is_sparse=True)
            except RuntimeError:
                raise RuntimeError("smoge")

    check(fn, counts=False)


def test_a_local_changed_in_an_except_block():
    def fn():
        x = torch.ones(1)
        try:
            raise RuntimeError("bad")
        except RuntimeError:
            x += 1
        return x

    check(fn)


def test_nested_set_grad_enabled_blocks():
    def fn(x):
        with torch.set_grad_enabled(True):
            with torch.set_grad_enabled(False):
                x = x + 1
                a = torch.is_grad_enabled()
            with torch.set_grad_enabled(True):
                x = x + 1
                b = torch.is_grad_enabled()
            return x, a, b

    check(fn, lambda: (torch.ones(1, requires_grad=True),))
    check(fn, lambda: (torch.ones(1),))


def test_nested_sequential_try_blocks():
    def fn(x):
        try:
            try:
                x = x + 1
            except Exception:
                pass
            try:
                try:
                    x = x + 1
                except Exception:
                    pass
            except Exception:
                pass
        except Exception:
            pass
        return x

    check(fn, lambda: (torch.ones(1),))


def test_nested_try_and_with_blocks_with_breaks():
    def fn(x, n):
        with torch.set_grad_enabled(True):
            with torch.set_grad_enabled(False):
                x = x + 1
                torch._dynamo.graph_break()
            try:
                with torch.set_grad_enabled(False):
                    x = x + 1
                    if n == 0:
                        torch._dynamo.graph_break()
            except Exception:
                pass
            with torch.set_grad_enabled(False):
                x = x + 1
                torch._dynamo.graph_break()
            x = x + 1
        return x, torch.is_grad_enabled()

    for n in (0, 1):
        check(fn, lambda: (torch.ones(1, requires_grad=True), n), counts=False)


def test_ordered_dict_made_from_a_dict_across_a_break():
    od = collections.OrderedDict

    def fn(x):
        d1 = dict()  # noqa: C408
        d1["a"] = 1
        d2 = od(d1)
        d2["b"] = 2
        torch._dynamo.graph_break()
        if isinstance(d2, od):
            return x + d2["a"] + d2["b"], d2
        return x, d2

    check(fn, t(2), counts=False)


def test_interpolate_scale_factor_argument_changes():
    def fn(x, y, z):
        a = F.interpolate(x, scale_factor=z, mode="bilinear", align_corners=False)
        b = F.interpolate(y, scale_factor=z, mode="bilinear", align_corners=False)
        return a * b

    c = kiln.compile(fn)
    y = torch.randn(3, 3, 3, 4)
    for z in (1.0, 2.0, 1.5, 1.0):
        same(c(y, y, z), fn(y, y, z))


def test_a_size_from_item():
    def fn(x):
        n = x.item()
        return torch.empty((n - 1) // 2).shape[0], torch.zeros((n - 1) // 2) + 1

    c = kiln.compile(fn)
    for v in (4, 1, 9, 4):
        x = torch.tensor([v])
        same(c(x), fn(x))


def test_tolist_unpacked_into_python_ints():
    def fn(a):
        a = a * 100
        u0, u1, u2, u3, u4 = a.tolist()
        return a * u0 * u1

    c = check(fn, lambda: (torch.randint(1, 6, (5,)),))
    x = torch.tensor([1, 2, 3, 4, 5])
    same(c(x), fn(x))


def test_mark_static_size_change_stays_right():
    def fn(x):
        return x.cos()

    c = kiln.compile(fn)
    y = torch.randn(3)
    torch._dynamo.mark_static(y, 0)
    same(c(y), fn(y))
    z = torch.randn(4)
    same(c(z), fn(z))


# ==============================================================================================
# part 6: global torch state set inside, sets, strings, generators, itertools, closures
# ==============================================================================================

def test_set_grad_enabled_false_inside_leaves_it_off_after_the_call():
    prior = torch.is_grad_enabled()
    seen = []

    def fn(x):
        seen.append(torch.is_grad_enabled())
        torch.set_grad_enabled(False)
        return x + 1

    c = kiln.compile(fn)
    try:
        for _ in range(2):
            torch.set_grad_enabled(True)
            x = torch.randn(10, requires_grad=True)
            out = c(x)
            assert torch.is_grad_enabled() is False
            assert out.requires_grad is False  # the add ran after grad was switched off
    finally:
        torch.set_grad_enabled(prior)
    assert seen == [True, True] or seen == [True]  # a captured list append may be replayed once per call


def test_use_deterministic_algorithms_changed_inside_leaves_it_changed():
    prior = torch.are_deterministic_algorithms_enabled()
    prior_warn = torch.is_deterministic_algorithms_warn_only_enabled()

    def fn(x):
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(False, warn_only=False)
        return x + (1 if was else 2)

    c = kiln.compile(fn)
    try:
        for _ in range(2):
            torch.use_deterministic_algorithms(True, warn_only=True)
            x = torch.randn(10)
            same(c(x), x + 1)
            assert torch.are_deterministic_algorithms_enabled() is False
            assert torch.is_deterministic_algorithms_warn_only_enabled() is False
    finally:
        torch.use_deterministic_algorithms(prior, warn_only=prior_warn)


def test_negated_sizes_times_tensors():
    def fn(a, b):
        return -a.shape[0] * -b.shape[0] * a * b

    check(fn, lambda: (torch.randn(10), torch.randn(10)))


def test_a_dict_keyed_by_types_picks_a_dtype():
    def fn(d, k, y):
        if d[k] is torch.float32:
            return y.cos(), torch.ones(3, dtype={bool: torch.float32}[bool])
        return y.sin(), torch.ones(3, dtype=d[k])

    dd = {bool: torch.float32, int: torch.int64}
    c = kiln.compile(fn)
    for k in (bool, int, bool):
        y = torch.randn(4)
        same(c(dd, k, y), fn(dd, k, y))
    dd[int] = torch.float32
    y = torch.randn(4)
    same(c(dd, int, y), fn(dd, int, y))


def test_adding_two_sizes_gives_a_size():
    def fn(x):
        s = x.size()
        return s + s, type(s + s)

    check(fn, lambda: (torch.ones(10, 10, 3),))


def test_sum_of_many_int_arguments():
    def foo(*args):
        return 0 if sum(args) == 0 else 1

    c = kiln.compile(foo, dynamic=True)
    assert c(*range(2000)) == foo(*range(2000))
    assert c(*([0] * 2000)) == foo(*([0] * 2000))


@pytest.mark.xfail(strict=True, reason="x.reshape(np.int_(16)): 'shape must be a list of ints', nothing captured; TorchDynamo: 1 graph")
def test_numpy_int_as_a_reshape_size():
    class M(nn.Module):
        def forward(self, x):
            return x.reshape(np.int_(16))

    m = M()
    check(m, lambda: (torch.rand(4, 4),))


def test_int_parameter_as_topk_k():
    class Sampler(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = nn.Parameter(torch.tensor(k, dtype=torch.int32), requires_grad=False)

        def forward(self, logits):
            threshold = torch.topk(logits, self.k, sorted=True)[0][..., -1]
            return torch.ge(logits.squeeze(1), threshold).float()

    m = Sampler(4)
    c = check(m, lambda: (torch.rand(4, 4, 4, 4),), counts=False)
    m.k.data.fill_(2)
    x = torch.rand(4, 4, 4, 4)
    same(c(x), m(x))


def test_roll_by_int_attributes_and_permute_by_a_tensor():
    class Jitter(nn.Module):
        def __init__(self, v):
            super().__init__()
            self.v = v

        def forward(self, x):
            p = torch.tensor([0, 2, 1, 3])
            return torch.roll(torch.roll(x, shifts=self.v - 1, dims=2), shifts=self.v + 1, dims=3).permute(*p)

    m = Jitter(4)
    c = check(m, lambda: (torch.rand(4, 4, 4, 4),), counts=False)
    m.v = 2
    x = torch.rand(4, 4, 4, 4)
    same(c(x), m(x))


@pytest.mark.xfail(strict=True, reason="hasattr on a list/tuple holding tensors breaks ('call to builtins.hasattr with tensor arguments is not captured'); TorchDynamo: 0 breaks")
def test_hasattr_on_modules_lists_tuples_functions_and_constants():
    def bar(x):
        return torch.sin(x)

    baz = functools.partial(lambda x, y: x + y, y=4)

    def fn(xs, tup):
        foo = lambda v: v + 1  # noqa: E731
        flags = (hasattr(torch.nn, "Module"), hasattr(xs, "foo"), hasattr(xs, "__len__"), hasattr(tup, "foo"),
                 hasattr(foo, "__name__"), hasattr(bar, "__name__"), hasattr(baz, "__name__"),
                 hasattr("s", "upper"), hasattr("s", "nope"), hasattr(42, "bit_length"), hasattr(42, "fake"),
                 hasattr(3.14, "is_integer"), hasattr(3.14, "missing"))
        return xs[0] + tup[1] + sum(flags), flags

    check(fn, lambda: ([torch.randn(3)], (torch.randn(3), torch.randn(3))))


def test_descriptor_whose_get_calls_hasattr_on_the_owner():
    class FlagDescriptor:
        def __get__(self, instance, owner):
            return 1 if hasattr(owner, "flag") else 0

    class WithFlag:
        flag = True
        prop = FlagDescriptor()

    class WithoutFlag:
        prop = FlagDescriptor()

    def fn(x, obj):
        return x + obj.prop

    c = kiln.compile(fn, fullgraph=True)
    for o in (WithFlag(), WithoutFlag(), WithFlag()):
        x = torch.randn(3)
        same(c(x, o), fn(x, o))


def test_one_hot_with_a_data_dependent_size():
    def fn(x):
        return F.one_hot(x + 1) + 1

    check(fn, lambda: (torch.arange(20) % 4,))
    check(fn, lambda: (torch.arange(20) % 7,), counts=False)


def test_pytree_flatten_and_unflatten_of_nested_containers():
    def fn(xs):
        flat, spec = pytree.tree_flatten(xs)
        return pytree.tree_unflatten([x.clone() * 2 for x in flat], spec)

    def make():
        xs = [torch.randn(()) for _ in range(3)]
        xsa = (xs, xs)
        return ({"a": xs, "b": xsa, "c": {"aa": xsa, "ab": xs}},)

    check(fn, make)


def test_any_and_all_of_size_comparisons():
    def fn(x):
        t_ = x.size(0) >= 10
        f_ = x.size(0) >= 100
        if any([]) or any([f_]) or any([f_, f_]):
            return x - 1
        if all([f_]) or all([t_, f_]) or all([f_, t_]) or all([f_, f_]):
            return x - 2
        if not (all([]) and all([t_]) and all([t_, t_])):
            return x - 3
        if not (any([t_]) and any([t_, f_]) and any([f_, t_])):
            return x - 4
        return x + 1

    c = kiln.compile(fn, dynamic=True)
    for n in (16, 18, 5, 16):
        x = torch.randn(n)
        same(c(x), fn(x))


def test_torch_check_on_an_item_raises_when_false():
    def fn(x, y):
        z = y.item()
        torch._check(z == 3)
        return x + z

    c = kiln.compile(fn)
    x = torch.randn(4)
    same(c(x, torch.tensor([3])), fn(x, torch.tensor([3])))
    with pytest.raises(RuntimeError):
        fn(x, torch.tensor([4]))
    with pytest.raises(RuntimeError):
        c(x, torch.tensor([4]))


def test_cat_of_mismatched_ranks_from_an_item_raises():
    def fn(x, y):
        return torch.cat([x, torch.ones(y.item())])

    for v in (0, 1, 3):
        check(fn, lambda: (torch.randn(2, 3), torch.tensor([v])), counts=False)


def test_nonzero_of_an_input():
    check(torch.nonzero, lambda: (torch.tensor([1, 0, 3, 2, 0]),), counts=False)
    check(lambda x: torch.nonzero(x) + 1, lambda: (torch.randint(0, 3, (7,)),), counts=False)


def test_sets_of_tensors_made_in_the_function():
    def pop2(x, y):
        s = {x, y}
        return s.pop() * s.pop()

    def add(xs, y):
        s = set()
        s.add(xs[0])
        s.add(xs[1])
        s.add(xs[2])
        s.add(y)
        return y * len(s)

    def remove(x):
        s = set((4, 5))
        s.remove(4)
        return x * len(s)

    def it(xs, y):
        s = set()
        for v in xs:
            s.add(v)
        return y * len(s)

    x, y = torch.randn(10, 10), torch.randn(2, 2)
    same(kiln.compile(pop2)(x, x + 1), pop2(x, x + 1))
    same(kiln.compile(add)([x, x, x, x, y], y), add([x, x, x, x, y], y))
    same(kiln.compile(add)([x, y, x], x), add([x, y, x], x))
    check(remove, t(4))
    same(kiln.compile(it)([x, x, x, x, y], y), it([x, x, x, x, y], y))
    same(kiln.compile(it)([x, y], y), it([x, y], y))


def test_a_set_built_before_a_break_is_used_after_it():
    def fn(xs, y):
        s = set()
        for v in xs:
            s.add(v)
        print("Break!")
        return y * len(s)

    c = kiln.compile(fn)
    x, y = torch.randn(10, 10), torch.randn(2, 2)
    same(c([x, x, x, x, y], y), fn([x, x, x, x, y], y))
    same(c([x, y, torch.randn(1)], y), fn([x, y, torch.randn(1)], y))


g1 = torch.randn(10)


def test_set_size_follows_aliasing_between_arguments_and_a_global():
    g2, g3, g4 = torch.randn(10), torch.randn(10), torch.randn(10)

    def foo(a, b, c):
        return a + len({g1, a, b, c})

    c = kiln.compile(foo)
    for args in [(g2, g3, g4), (g3, g2, g4), (g2, g2, g2), (g3, g3, g3), (g1, g1, g1), (g2, g3, g4), (g1, g2, g1)]:
        same(c(*args), foo(*args))


def test_fstrings_and_format_of_shapes_returned():
    def fn(img):
        x = torch.sin(img)
        a = f"shape {img.shape[-2:]} batch size {img.shape[0]}"
        b = "shape {} batch size {y:.2f}".format(img.shape[-2:], y=img.shape[0])
        return img + x, a, b

    c = check(fn, t(1, 1, 8, 8))
    x = torch.randn(2, 1, 4, 8)
    same(c(x), fn(x))


@pytest.mark.xfail(strict=True, reason='str.__iter__ / next on it break; TorchDynamo: 0 breaks')
def test_next_of_a_string_iterator():
    def fn(x):
        return x + 1 if next("a".__iter__()) == "a" else x

    check(fn, t(3))


def test_torch_assert_with_an_fstring_message_raises_on_a_new_shape():
    def fn(img):
        x = torch.sin(img)
        torch._assert(img.shape[-2] == 8 and img.shape[-1] == 16, f"shape {img.shape}")
        return img + x

    c = kiln.compile(fn)
    x = torch.randn(1, 3, 8, 16)
    same(c(x), fn(x))
    with pytest.raises(AssertionError):
        c(torch.randn(1, 3, 8, 15))
    same(c(x), fn(x))


@pytest.mark.parametrize("make", [lambda: torch.tensor([3]), lambda: torch.tensor([2, 1]),
                                  lambda: torch.tensor([[[2, 1], [2, 1], [2, 1]], [[2, 1], [2, 1], [2, 1]]]),
                                  lambda: torch.tensor(42), lambda: torch.randn(2, 3, 2),
                                  lambda: torch.randint(3, 5, [5, 5])], ids=["1", "1d", "kd", "0d", "float", "kd2"])
def test_tolist_then_python_arithmetic(make):
    def fn(x):
        v = x.tolist()
        out = [i * 4 for i in v] if isinstance(v, list) else [v * 4]
        return out, x * 10

    check(fn, lambda: (make(),), counts=False)


def test_closures_inlined_through_several_levels():
    def outer(a):
        return a + 1

    def direct(x):
        def deep2(c):
            return outer(c)

        def deep(c):
            return deep2(c)

        return deep(x)

    def indirect(x):
        return direct(x)

    check(indirect, t(3))


def test_a_closure_returned_by_a_helper_reads_a_cell_that_changes():
    box = [torch.ones(1)]
    x = box[0]

    def make():
        def inner():
            return x + 2

        return inner

    def start():
        return make()()

    c = kiln.compile(start)
    same(c(), start())
    x.add_(1)
    same(c(), start())


@pytest.mark.xfail(strict=True, reason='deque.pop on a deque argument breaks (fullgraph=True raises); TorchDynamo: one graph')
def test_deque_argument_popped_and_appended_left():
    def fn(q):
        a = q.pop()
        b = q.pop()
        return a * b

    def gn(q, a, b):
        q.appendleft(a)
        q.appendleft(b)
        return q.popleft() * q.popleft()

    a, b = torch.randn(2, 3), torch.randn(2, 3)
    d1, d2 = collections.deque(["foo", a, b]), collections.deque(["foo", a, b])
    same(kiln.compile(fn, fullgraph=True)(d2), fn(d1))
    same(d2, d1)
    d1, d2 = collections.deque(["foo", 10, 10]), collections.deque(["foo", 10, 10])
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    same(kiln.compile(gn, fullgraph=True)(d2, a, b), gn(d1, a, b))
    same(d2, d1)


def test_yield_from_generators():
    def f1(t_list, k):
        def gen(lst):
            yield from [v * k for v in lst]

        return [v * k for v in gen(t_list)]

    def gen2():
        yield 1

    def gen1():
        for _ in range(5):
            yield from gen2()

    def f2(x):
        c = 0
        for i in gen1():
            c = c + i
        return x + c

    def f3(n, mult):
        def tgen():
            for i in range(n):
                yield torch.tensor([i])

        tl = [v * mult for v in tgen()]

        def yf():
            yield from tl

        return [v for v in yf()]

    check(f1, lambda: ([torch.randn(2, 3) for _ in range(3)], 2))
    check(f2, lambda: (torch.zeros(4),))
    check(f3, lambda: (5, torch.tensor([10])))


def test_yield_from_a_user_iterator_whose_stop_iteration_has_a_value():
    class MyIter:
        def __init__(self, seq):
            self.seq = seq
            self.index = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.index += 1
            if self.index <= len(self.seq):
                return self.seq[self.index - 1]
            raise StopIteration(self.index)

    def fn(seq):
        def gen(s):
            r = yield from MyIter(s)
            yield r

        return [i for i in gen(seq)]

    check(fn, lambda: ([torch.randn(2, 3) for _ in range(3)],), counts=False)


@pytest.mark.xfail(strict=True, reason='StopIteration inside a generator (PEP 479) is not captured: the call runs eagerly; TorchDynamo: 1 graph')
def test_stop_iteration_raised_in_a_generator_becomes_runtime_error():
    def gen():
        yield 1
        raise StopIteration("inside")

    def fn(t_):
        try:
            g = gen()
            next(g)
            next(g)
        except RuntimeError:
            return t_ + 100
        except StopIteration:
            return t_ + 200
        return t_

    check(fn, t(2))


def test_a_compiled_generator_function_with_send():
    def sub(tensor):
        m = yield
        yield tensor * m

    def main(t_list):
        for tensor in t_list:
            s = sub(tensor)
            next(s)
            yield from s.send(torch.tensor([10]))

    t_list = [torch.tensor([i]) for i in range(5)]
    same(list(kiln.compile(main)(t_list)), list(main(t_list)))


def test_module_whose_forward_is_a_plain_function_using_a_captured_self():
    mod1, mod2 = nn.Module(), nn.Module()

    def ff1(x):
        self = mod1
        return torch.sigmoid(self.mod2(x) + self.param1)

    def ff2(x):
        self = mod2
        return torch.cos(torch.sin(x) * self.param2 + 10)

    mod1.register_module("mod2", mod2)
    mod1.register_parameter("param1", nn.Parameter(torch.randn(10)))
    mod1.forward = ff1
    mod2.register_parameter("param2", nn.Parameter(torch.randn(10)))
    mod2.forward = ff2
    mod1.eval()
    c = check(mod1, t(10))
    with torch.no_grad():
        mod2.param2.mul_(2)
    x = torch.randn(10)
    same(c(x), mod1(x))


def test_default_dtype_and_device_arguments_of_an_inlined_constructor():
    class Foo:
        def __init__(self, dtype: torch.dtype = torch.float16, device: torch.device = torch.device("cpu")):
            self.value = torch.tensor(10, dtype=dtype, device=device)

    def fn(x):
        return Foo().value + 1, isinstance(x.dtype, torch.dtype), torch.zeros(3, 2, dtype=x.dtype) + x

    check(fn, lambda: (torch.tensor([2, 3], dtype=torch.float16),))


def test_itertools_islice_repeat_count_cycle_of_tensors():
    def f_islice(x):
        return list(itertools.islice(x, 2, 5, 2)), list(itertools.islice(x, 2, 5)), list(itertools.islice(x, 2))

    def f_repeat(x):
        for i in itertools.repeat(100.0, 5):
            x += i
        return x

    def f_inf_repeat(x):
        idx = 0
        for i in itertools.repeat(x):
            x += i
            i += 1
            idx += 1
            if idx > 10:
                break
        return x

    def f_count(x):
        for args in ([], [10], [5, -1]):
            idx = 0
            for i in itertools.count(*args):
                x += i
                idx += 1
                if idx > 10:
                    break
        return x

    def f_cycle(x):
        for it in (iter([]), iter([10, 11.0]), itertools.repeat(-1, 3), itertools.count(10)):
            idx = 0
            x += 1
            for i in itertools.cycle(it):
                x += i
                idx += 1
                if idx > 10:
                    break
        return x

    check(f_islice, t(6, 2))
    check(f_repeat, t(2, 5))


@pytest.mark.xfail(strict=True, reason="itertools.repeat(x) without times, left by break: the whole call runs eagerly ('itertools.repeat without `times` is endless'); TorchDynamo: 1 graph")
def test_itertools_endless_repeat_left_by_break():
    def f_inf_repeat(x):
        idx = 0
        for i in itertools.repeat(x):
            x += i
            i += 1
            idx += 1
            if idx > 10:
                break
        return x

    check(f_inf_repeat, t(2, 5))


@pytest.mark.xfail(strict=True, reason="itertools.count is not captured: inside a loop the whole call runs eagerly (0 graphs); TorchDynamo: 1 graph")
def test_itertools_count_and_cycle_in_loops():
    def f_count(x):
        for args in ([], [10], [5, -1]):
            idx = 0
            for i in itertools.count(*args):
                x += i
                idx += 1
                if idx > 10:
                    break
        return x

    def f_cycle(x):
        for it in (iter([]), iter([10, 11.0]), itertools.repeat(-1, 3), itertools.count(10)):
            idx = 0
            x += 1
            for i in itertools.cycle(it):
                x += i
                idx += 1
                if idx > 10:
                    break
        return x

    check(f_count, t(2, 5))
    check(f_cycle, t(2, 5))


def test_itertools_count_made_outside_advances_per_call():
    counter = itertools.count()
    next(counter)
    next(counter)

    def fn(x):
        return x * (next(counter) + 1)

    c = kiln.compile(fn)
    x = torch.randn(2, 5)
    same(c(x), x * 3)
    same(c(x), x * 4)
    assert next(counter) == 4


def test_itertools_accumulate_of_sizes_tensors_and_operators():
    def f_sizes(x):
        for i in itertools.accumulate([x.size(0), x.size(1)]):
            x *= i
        return x

    def make_f(*a, **kw):
        def f(a_, b, c, d, x):
            lst = [a_, b, c, d, x]
            for i, v in enumerate(lst):
                lst[i] = v * x
            return list(itertools.accumulate(lst, *a, **kw))

        return f

    def make():
        return tuple(torch.tensor([i + 1]) for i in range(4)) + (torch.tensor([[1, 2], [3, 4]]),)

    check(f_sizes, t(2, 3))
    for a, kw in [((), {}), ((operator.mul,), {}), ((operator.sub,), {}), ((operator.pow,), {}),
                  ((), {"func": operator.mul}), ((), {"initial": 100}), ((), {"func": operator.sub, "initial": -1})]:
        check(make_f(*a, **kw), make)


# ==============================================================================================
# part 7: dataclasses, storages, grads, descriptors, dict subclasses, inspect
# ==============================================================================================

@pytest.mark.xfail(strict=True, reason='packaging.version.parse / comparisons break 7 times; TorchDynamo: 0 breaks')
def test_packaging_version_comparison():
    from packaging import version

    def fn(x):
        if version.parse(torch.__version__) >= version.parse("2.0.0"):
            return x + 1
        return x

    check(fn, t(1))


def test_accumulate_with_user_functions_some_with_side_effects():
    rando = random.randint(0, 1)
    seen = []

    def u0(a, b):
        return -1

    def u1(a, b):
        return a * rando + b * rando

    def u2(a, b):
        seen.append(a)
        seen.append(b)
        return a * len(seen)

    for u in (u0, u1, u2):
        def fn(a, b, c, d, x):
            lst = [a, b, c, d, x]
            for i, v in enumerate(lst):
                lst[i] = v * x
            return list(itertools.accumulate(lst, u))

        args = tuple(torch.tensor([i]) for i in range(4)) + (torch.tensor([[1, 2], [3, 4]]),)
        seen.clear()
        want = fn(*args)
        n_eager = len(seen)
        seen.clear()
        got = kiln.compile(fn)(*args)
        same(got, want)
        assert len(seen) == n_eager


def test_a_pure_python_accumulate_generator_returned():
    def accumulate(iterable, func=lambda x, y: x + y):
        it = iter(iterable)
        try:
            acc = next(it)
        except StopIteration:
            return
        yield acc
        for e in it:
            acc = func(acc, e)
            yield acc

    def fn(it):
        return accumulate(it)

    tl = [torch.tensor([i]) for i in range(4)]
    same(list(kiln.compile(fn)(tl)), list(fn(tl)))


def test_groupby_tee_and_membership_in_a_list_iterator():
    def f_group(lst):
        return [(k, list(g)) for k, g in itertools.groupby(lst)], [(k, list(g)) for k, g in itertools.groupby(lst, key=operator.neg)]

    def f_tee(lst):
        a, b = itertools.tee(lst)
        return list(a), list(b)

    def f_in(x):
        it = iter(["my_weight", "not_my_weight"])
        next(it)
        return x + 2 if "my_weight" in it else x + 1

    lst = [1, 2, -2, 3, 4, 4, -4, 0, -2]
    assert kiln.compile(f_group)(lst) == f_group(lst)
    assert kiln.compile(f_tee)(lst) == f_tee(lst)
    check(f_in, lambda: (torch.zeros(3),), counts=False)


@pytest.mark.xfail(strict=True, reason="itertools.groupby / tee and `in` over a list iterator break (groupby: the whole call eager); TorchDynamo: 1 graph, 0 breaks")
def test_groupby_tee_and_list_iterator_membership_capture():
    def f_group(lst, x):
        return [(k, list(g)) for k, g in itertools.groupby(lst)], x + 1

    def f_tee(lst, x):
        a, b = itertools.tee(lst)
        return list(a), list(b), x + 1

    def f_in(x):
        it = iter(["my_weight", "not_my_weight"])
        next(it)
        return x + 2 if "my_weight" in it else x + 1

    mk = lambda: ([1, 2, 2, 3, 4, 4, -4, 0, -2], torch.randn(2))  # noqa: E731
    failures = []
    for f, m in ((f_group, mk), (f_tee, mk), (f_in, lambda: (torch.zeros(3),))):
        try:
            check(f, m)
        except AssertionError as e:
            failures.append(f"{f.__name__}: {e}")
    assert not failures, failures



def test_resizing_an_inputs_storage_to_zero():
    def fn(x):
        y = torch.sin(x + 1)
        storage = x.untyped_storage()
        storage.resize_(0)
        return torch.cos(y), storage

    x = torch.randn(10)
    expected = torch.cos(torch.sin(x + 1))
    y, s = kiln.compile(fn)(x)
    same(y, expected)
    assert x.untyped_storage().size() == 0
    assert s.data_ptr() == x.untyped_storage().data_ptr() and s.size() == 0


def test_frozen_dataclasses_made_in_the_function():
    @dataclasses.dataclass(frozen=True)
    class D:
        x: torch.Tensor
        y: torch.Tensor
        z: int = dataclasses.field(default=5)
        a: int = 6
        lst: list = dataclasses.field(default_factory=lambda: [5])

    @dataclasses.dataclass(frozen=True)
    class K:
        x: torch.Tensor
        z: int = dataclasses.field(kw_only=True)
        a: int = dataclasses.field(kw_only=True)

    def fn(x, y):
        d = D(x, y)
        k = K(x, z=5, a=2)
        return d.x + d.y + d.z + d.a + d.lst[0] + k.x * k.z - k.a

    check(fn, lambda: (torch.ones(2, 2), torch.randn(2, 2)))


def test_frozen_dataclass_across_a_break_and_returned():
    @dataclasses.dataclass(frozen=True)
    class Inner:
        x: int = 2

    @dataclasses.dataclass(frozen=True)
    class D:
        y: torch.Tensor
        ndc: Inner = Inner()

    def fn(y):
        dc = D(y)
        torch._dynamo.graph_break()
        return dc.y + dc.ndc.x, dc

    c = kiln.compile(fn)
    y = torch.randn(2, 2)
    got, want = c(y), fn(y)
    same(got[0], want[0])
    assert type(got[1]) is D and got[1].y is y and got[1].ndc == Inner()


def test_frozen_dataclasses_as_dict_keys():
    @dataclasses.dataclass(frozen=True)
    class In:
        x: float
        y: float

    @dataclasses.dataclass(frozen=True)
    class D:
        b: In
        z: int
        a: int

    def fn(x, y):
        dc = D(b=In(2.4, 4.4), z=5, a=2)
        d = {dc: 2}
        d2 = {In(3.2, 2.5): 1}
        return dc.b.x + dc.b.y + d[D(In(2.4, 4.4), 5, 2)] + d2[In(3.2, 2.5)] + x + y

    check(fn, lambda: (torch.ones(2, 2), torch.randn(2, 2)))


def test_pytree_keys_in_an_fstring_and_treespec_fields():
    from torch.utils._pytree import MappingKey, SequenceKey, tree_flatten

    def fn(x):
        path = (MappingKey("a"), SequenceKey(0))
        flat, spec = tree_flatten({"a": x, "b": [x * 2, x * 3]})
        return sum(flat), spec.num_leaves, spec.num_nodes, spec.is_leaf(), f"path={path}"

    check(fn, t(4))


def test_result_type_follows_the_default_dtype():
    def fn(x):
        return torch.result_type(torch.tensor(1), 1.0), x + 1.0, torch.tensor(1) + 1.5

    c = kiln.compile(fn)
    prior = torch.get_default_dtype()
    try:
        for d in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(d)
            x = torch.tensor([1, 2])
            same(c(x), fn(x))
    finally:
        torch.set_default_dtype(prior)


def test_numpy_ufunc_with_out_returns_the_out_array():
    def fn(x):
        a = np.arange(5)
        out = np.empty((a.shape[0], a.shape[0]))
        res = np.sin(a, out=out)
        return x + 1, res is out, out

    c = kiln.compile(fn)
    x = torch.randn(2)
    got, want = c(x), fn(x)
    same(got[0], want[0])
    assert got[1] is want[1] is True
    np.testing.assert_allclose(got[2], want[2])


def test_dict_unpacking_a_dict_made_after_a_break():
    def create():
        torch._dynamo.graph_break()
        return {0: torch.tensor(3)}

    def fn():
        return {**create()}

    check(fn, counts=False)


def _freed_after_compile(make):
    cleared = []

    def run():
        mod, inp, watch = make()
        weakref.finalize(watch, lambda: cleared.append(True))
        kiln.compile(mod)(inp)

    run()
    gc.collect()
    return bool(cleared)


def test_a_compiled_module_is_freed_when_dropped():
    class Mod(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(10, 10)

        def forward(self, x):
            return self.fc(x)

    def make_custom():
        m = Mod()
        return m, torch.randn(10, 10), m.fc

    def make_seq():
        m = nn.Sequential(nn.Linear(10, 10), nn.ReLU())
        return m, torch.randn(10, 10), m[0]

    def make_lin():
        m = nn.Linear(10, 10)
        return m, torch.randn(10, 10), m

    for make in (make_custom, make_seq, make_lin):
        assert _freed_after_compile(make), make.__name__


def test_conditional_list_comprehension_inside_try():
    def fn(inp):
        try:
            return [torch.sin(x) for x in inp if x is not None]
        except Exception:
            pass

    check(fn, lambda: ([torch.randn(3, 3) for _ in range(3)] + [None],))


def test_slicing_a_sequential_made_in_the_function():
    l1, l2 = nn.Linear(5, 5), nn.Linear(5, 5)

    def fn(x):
        n = nn.Sequential(l1, l2)
        return n[1:](x)

    check(fn, t(5, 5), counts=False)


def test_slice_store_and_load_on_an_object_whose_getitem_breaks():
    class Foo:
        def __init__(self):
            self.stored = None

        def __setitem__(self, key, val):
            self.stored = (key, val)

        def __getitem__(self, key):
            torch._dynamo.graph_break()
            return 1

    foo_e, foo_k = Foo(), Foo()

    def make(foo):
        def fn(x):
            foo[:] = x
            x = x + foo[:]
            return x + 1

        return fn

    x = torch.randn(5, 5)
    same(kiln.compile(make(foo_k))(x), make(foo_e)(x))
    assert foo_k.stored[0] == slice(None) and foo_k.stored[1] is x


def test_super_init_of_a_sequential_subclass_after_a_break():
    class Foo(nn.Sequential):
        def __init__(self, layers):
            torch._dynamo.graph_break()
            super().__init__(*layers)

    def fn(x):
        torch.manual_seed(0)
        return Foo([nn.Linear(3, 3) for _ in range(3)])(x)

    x = torch.randn(3, 3)
    same(kiln.compile(fn)(x), fn(x))


def test_comprehensions_around_a_break():
    def fn(x):
        out = torch.cat([torch.ones(r, 5) * r for r in range(3)])
        torch._dynamo.graph_break()
        out = torch.cat([out * r for r in range(3)])
        return out + x

    check(fn, t(9, 5))


def test_import_error_caught_and_raised():
    def fn1(x):
        try:
            import some_module_that_surely_does_not_exist  # noqa: F401
            return x
        except ImportError:
            pass
        return x.sin()

    def fn2(x):
        import some_module_that_surely_does_not_exist  # noqa: F401
        return x + 1

    check(fn1, t(8), counts=False)
    check(fn2, t(8), counts=False)


def test_int_argument_values_with_dynamic_false():
    def fn(x, const):
        return x + const

    c = kiln.compile(fn, dynamic=False)
    x = torch.randn(3, 3)
    for k in (1, 2, 3, 2, 1):
        same(c(x, k), fn(x, k))


def test_inspect_signature_bind():
    def inner(a, b, *ar, c=10, d=11, **kw):
        pass

    def fn(x, apply_defaults):
        sig = inspect.signature(inner)
        bound = sig.bind(1, 2, 3, d=12, e=15)
        bound.arguments["d"] = 13
        if apply_defaults:
            bound.apply_defaults()
        return bound.args, bound.kwargs, dict(bound.arguments), x + 1

    for ad in (True, False):
        check(fn, lambda: (torch.ones(3, 3), ad), counts=False)


def test_inspect_signature_parameters_default():
    def gn(a: torch.Tensor, b: int = 3) -> torch.Tensor:
        return a + b

    def fn(x, g):
        p = inspect.signature(g).parameters
        k = 1 if p["a"].default is inspect.Parameter.empty else 2
        return torch.sin(x + k) + p["b"].default + p["a"].kind + len(p["a"].name)

    check(fn, lambda: (torch.randn(2, 3), gn))


@pytest.mark.xfail(strict=True, reason="type.__dict__['__dict__'].__get__ (getset descriptor) breaks; TorchDynamo: 0 breaks")
def test_class_dict_through_the_type_dict_descriptor():
    get_dict = type.__dict__["__dict__"].__get__

    class MyClass:
        a = 1
        b = 2
        param = inspect.Parameter("x", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=42)

    def fn(x):
        d = get_dict(MyClass)
        return x + len(d) + d["param"].default

    check(fn, t(3))


def test_grad_attribute_set_and_updated_in_place():
    def fn(x, y):
        x.grad = torch.abs(y)
        x.grad.add_(y)
        return torch.abs(y)

    def gn(x, y):
        x.grad.add_(y)
        return torch.abs(y)

    def make():
        return torch.randn(2, 2), torch.arange(4).reshape(2, 2).to(torch.float)

    for f in (fn, gn):
        c = kiln.compile(f)
        for _ in range(2):
            xe, ye = make()
            xk, yk = xe.clone(), ye.clone()
            if f is gn:
                xe.grad = torch.arange(4.0).reshape(2, 2)
                xk.grad = xe.grad.clone()
            same(c(xk, yk), f(xe, ye))
            same(xk.grad, xe.grad)


def test_new_with_a_size_list():
    def fn(x):
        return x.new(*x.size()).fill_(2) + 5

    c = kiln.compile(fn)
    x = torch.arange(10).view(2, 5)
    got, want = c(x), fn(x)
    same(got, want)
    assert got.stride() == want.stride()


def test_as_strided_to_an_empty_view():
    def fn(x, size, stride):
        return x * x.as_strided(size, stride).view(-1).sum()

    c = kiln.compile(fn, dynamic=True)
    x = torch.randn(3)
    same(c(x, [0, 3], [3, 1]), fn(x, [0, 3], [3, 1]))
    same(c(x, [1, 3], [3, 1]), fn(x, [1, 3], [3, 1]))


def test_hasattr_of_a_submodule_removed_between_calls():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)

        def forward(self, x):
            return self.a(x) if hasattr(self, "a") else x

    m = M()
    c = kiln.compile(m)
    x = torch.randn(3, 3)
    same(c(x), m(x))
    del m.a
    same(c(x), m(x))


@pytest.mark.parametrize("kind", ["ordered", "default", "subclass"])
def test_dict_argument_kinds_reused_and_values_changed(kind):
    class MyDict(dict):
        pass

    if kind == "ordered":
        d = collections.OrderedDict({"foo": 1, "bar": 2})
        d.move_to_end("foo")
    elif kind == "default":
        d = collections.defaultdict()
        d["foo"], d["bar"] = 1, 2
    else:
        d = MyDict({"foo": 1, "bar": 2})

    def fn(x, d):
        return x * d["foo"] * d["bar"]

    kiln.reset()
    c = kiln.compile(fn)
    x = torch.randn(4)
    same(c(x, d), fn(x, d))
    same(c(x, d), fn(x, d))
    assert kiln.stats()["recompiles"] == 0
    d["foo"] = 7
    same(c(x, d), fn(x, d))


def test_isinstance_of_an_iterator():
    def fn(y):
        return y + 1 if isinstance(iter([]), list) else y + 2

    check(fn, lambda: (torch.ones(2),))


def test_lazy_property_descriptor_replaced_by_an_instance_attribute():
    class lazy_property:
        def __init__(self, wrapped):
            self.wrapped = wrapped

        def __get__(self, instance, obj_type=None):
            value = self.wrapped(instance)
            setattr(instance, self.wrapped.__name__, value)
            return value

    class UD:
        @lazy_property
        def length(self):
            return 3

        def run(self, x):
            return x * self.length

    obj = UD()
    c = kiln.compile(lambda x: obj.run(x))
    x = torch.randn(4)
    same(c(x), x * 3)
    assert obj.__dict__["length"] == 3
    obj.length = 5
    same(c(x), x * 5)


@pytest.mark.xfail(strict=True, reason="self.__dict__['field'] = n on an object made in the function breaks; TorchDynamo: 0 breaks")
def test_property_reading_the_instance_dict_and_returned_object():
    class MyClass:
        def __init__(self, n):
            self.__dict__["field"] = n

        field = property(lambda obj: obj.__dict__["field"])

    def fn(x):
        obj = MyClass(42)
        return x + obj.field, obj.field

    check(fn, t(4))


def test_data_and_non_data_descriptor_precedence_over_the_instance_dict():
    class Foo:
        @property
        def x(self):
            return 10

    foo = Foo()
    foo.__dict__["x"] = 999

    class Desc:
        def __init__(self, v):
            self.v = v

        def __get__(self, obj, cls):
            return self.v * 100

    class Bar:
        x = Desc(7)

    bar = Bar()
    bar.__dict__["x"] = 10

    class Validated:
        def __set_name__(self, owner, name):
            self.storage = "_" + name

        def __get__(self, obj, cls):
            return self if obj is None else getattr(obj, self.storage)

        def __set__(self, obj, v):
            setattr(obj, self.storage, v)

    class Baz:
        x = Validated()

        def __init__(self, x):
            self.x = x

    baz = Baz(3)

    def fn(t_):
        return t_ + foo.x + bar.x + baz.x

    c = check(fn, t(4))
    bar.__dict__["x"] = 20
    baz.x = 4
    x = torch.randn(4)
    same(c(x), fn(x))
    del bar.__dict__["x"]
    same(c(x), fn(x))


def test_property_setters_on_an_argument_and_in_init():
    class Box:
        def __init__(self, value):
            self._value = torch.tensor([value], dtype=torch.float32)

        @property
        def value(self):
            return self._value + 1

        @value.setter
        def value(self, v):
            self._value = v * 2

    class Clamped:
        def __init__(self, val):
            self.val = val

        @property
        def val(self):
            return self._val

        @val.setter
        def val(self, v):
            self._val = torch.clamp(v, 0, 100)

    def fn(b):
        b.value = 5
        return b.value

    be, bk = Box(0), Box(0)
    same(kiln.compile(fn)(bk), fn(be))
    same(bk._value, be._value)
    check(lambda x: Clamped(x).val, lambda: (torch.tensor([200.0, -3.0, 7.0]),))


# ==============================================================================================
# part 8: container classes, closures escaping, comparisons, builtins, requires_grad
# ==============================================================================================

def test_dict_of_an_ordered_dict_subclass_that_forbids_updates():
    class FrozenDict(collections.OrderedDict):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for k, v in self.items():
                setattr(self, k, v)
            self.__frozen = True

        def update(self, *a, **k):
            raise Exception("no update")

        def pop(self, *a, **k):
            raise Exception("no pop")

    frozen = FrozenDict({"a": 1})

    def fn(x):
        d = dict(frozen)
        return torch.sin(x) + d["a"] + frozen.a, list(d.items())

    check(fn, t(4))


@pytest.mark.xfail(strict=True, reason="x.__class__(items) for a tuple/list breaks ('tuple.__class__() is not captured yet'); TorchDynamo: 0 breaks")
def test_rebuilding_a_container_through_its_class():
    Point = collections.namedtuple("Point", ["x", "y"])

    def fn(x):
        upd = [v + 1 for v in x]
        return x.__class__(upd)

    def gn(p):
        return p.__class__(*[v + 1 for v in p])

    check(fn, lambda: ((torch.zeros(2, 2), torch.ones(2, 2)),))
    check(fn, lambda: ([torch.zeros(2, 2), torch.ones(2, 2)],))
    c = kiln.compile(gn, fullgraph=True)
    p = Point(torch.zeros(2, 2), torch.ones(2, 2))
    r = c(p)
    assert type(r) is Point
    same(tuple(r), tuple(gn(p)))


def test_random_instance_with_an_overridden_method():
    def fn(x, r):
        random.Random().setstate(r.getstate())
        return x + r.random()

    def get_rng():
        r = random.Random(1)
        orig = r.random
        r.random = lambda: orig()
        return r

    x = torch.randn(3, 3)
    same(kiln.compile(fn)(x, get_rng()), fn(x, get_rng()))


def test_data_ptr_arithmetic():
    def f(a, b):
        return a.data_ptr() + b.data_ptr()

    def g(a):
        return torch.add(a, a.data_ptr() % 1000)

    a, b = torch.randn(4), torch.randn(5)
    assert kiln.compile(f)(a, b) == f(a, b)
    same(kiln.compile(g)(a), g(a))
    a2 = torch.randn(4)
    same(kiln.compile(g)(a2), g(a2))


def test_returning_a_closure_over_a_tensor_made_inside():
    def fn(y):
        x = y * 2

        def nested():
            return x + x

        def func():
            return nested()

        return func, func()

    c = kiln.compile(fn)
    y = torch.randn(3)
    f_k, r_k = c(y)
    f_e, r_e = fn(y)
    same(r_k, r_e)
    same(f_k(), f_e())


def test_a_closure_escaping_through_a_hook_and_nonlocal():
    escaped = []

    def fn(x):
        temp = x * x
        captured = temp + 1
        x.register_hook(lambda _: captured)

        def inner():
            return captured

        escaped.append(inner)
        return temp

    x = torch.ones(4, requires_grad=True)
    kiln.compile(fn)(x).sum().backward()
    xe = torch.ones(4, requires_grad=True)
    fn(xe).sum().backward()
    same(x.grad, xe.grad)
    same(escaped[0](), escaped[1]())


def test_tensor_equals_none_is_false():
    def f(x):
        return torch.tensor(x == None), x != None  # noqa: E711

    check(f, lambda: (torch.tensor(1),), counts=False)


def test_dataclasses_replace_of_an_argument():
    @dataclasses.dataclass(frozen=True)
    class Foo:
        x: int

    def run(x, foo0):
        if dataclasses.is_dataclass(foo0):
            return x + 1, dataclasses.replace(foo0, **{"x": 1})
        return x + 2, foo0

    c = kiln.compile(run)
    res, foo = c(torch.zeros(1), Foo(0))
    same(res, torch.ones(1))
    assert foo == Foo(1)


def test_an_object_reached_through_a_frozenset_and_directly_is_one_object():
    class Foo:
        pass

    def make():
        foo = Foo()
        foo.x = 0
        return torch.ones(1), frozenset([foo]), foo

    def run(x, s, foo0):
        foo1 = list(s)[0]
        foo0.x += 1
        return x + 1, foo1.x

    c = kiln.compile(run)
    for _ in range(2):
        args = make()
        got = c(*args)
        same(got, (torch.ones(1) + 1, 1))
        assert args[2].x == 1


def test_not_equal_uses_eq_or_a_custom_ne():
    class Foo:
        def __init__(self, x):
            self.x = x

        def __eq__(self, other):
            return self.x == other.x

    class Bar(Foo):
        def __init__(self, x):
            super().__init__(x)
            self.ne_called = False

        def __ne__(self, other):
            self.ne_called = True
            return not self.__eq__(other)

    class Baz(Foo):
        def __eq__(self, other):
            torch._dynamo.graph_break()
            return self.x == other.x

    b1, b2 = Bar(0), Bar(0)

    def run(x):
        return x + 1, Foo(0) != Foo(0), Foo(0) != Foo(1), b1 != b2, Baz(0) != Baz(0)

    same(kiln.compile(run)(torch.ones(1)), run(torch.ones(1)))
    assert b1.ne_called


def test_bare_raise_reraises_into_the_right_handler():
    def foo():
        try:
            raise ValueError
        except Exception:
            raise

    def fn(t_):
        try:
            foo()
        except ValueError:
            return t_.sin()
        except Exception:
            return t_.cos()

    check(fn, t(2))


def test_overridden_getattribute_and_getattr():
    class Bar:
        def __init__(self, v):
            self.v = v

    class Foo:
        attribute_map = {}

        def __init__(self):
            self.attribute_map = {"a_premap": "a"}
            self.bar = Bar(5)

        def __setattr__(self, key, value):
            if key in super().__getattribute__("attribute_map"):
                key = super().__getattribute__("attribute_map")[key]
            super().__setattr__(key, value)

        def __getattribute__(self, key):
            if key == "sentinel":
                raise AttributeError()
            if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
                key = super().__getattribute__("attribute_map")[key]
            return super().__getattribute__(key)

        def __getattr__(self, key):
            if key == "sentinel":
                return 5
            raise AttributeError()

    def get_foo():
        f = Foo()
        f.a_premap = 2
        f.b = 3
        return f

    def fn(x, f):
        return x * f.a_premap * f.a * f.b * f.sentinel * f.bar.v

    c = kiln.compile(fn)
    x = torch.randn(4)
    same(c(x, get_foo()), fn(x, get_foo()))
    f = get_foo()
    f.a_premap = 7
    same(c(x, f), fn(x, f))


@pytest.mark.xfail(strict=True, reason='obj.__weakref__ is not modelled: the call runs eagerly; TorchDynamo: 1 graph')
def test_dunder_weakref_of_a_new_object():
    class Foo:
        pass

    def fn(x):
        foo = Foo()
        return torch.cos(x) if foo.__weakref__ else torch.sin(x)

    check(fn, t(4))


@pytest.mark.parametrize("make", [lambda: torch.randint(10, (1,)), lambda: torch.randn(1), lambda: torch.randn(1) == 1,
                                  lambda: torch.tensor(0), lambda: torch.tensor(0.0)], ids=["int", "float", "bool", "zero", "fzero"])
def test_bool_of_an_item(make):
    check(lambda x: bool(x.item()), lambda: (make(),), counts=False)
    check(lambda x: bool(x), lambda: (make(),), counts=False)


def test_bool_of_a_mask_reduction_and_of_a_non_scalar():
    def f_all(mask):
        return bool((mask == 0).all())

    c = kiln.compile(f_all)
    for m in (torch.zeros(2, 3), torch.tensor([[0, 1], [0, 0]])):
        assert c(m) == f_all(m)
    check(lambda x: bool(x), lambda: (torch.tensor([1, 2, 3]),), counts=False)


def test_new_tensor_from_a_data_dependent_count():
    cases = [
        lambda a: a.new_tensor([a.nonzero().squeeze(-1).numel()]),
        lambda a: (n := a.nonzero().squeeze(-1).numel(), a.new_tensor([n, n + 1, n * 2]))[-1],
        lambda a: (n := a.nonzero().squeeze(-1).numel(), a.new_tensor([n * a.shape[0], n + a.shape[0], a.shape[0] - n]))[-1],
        lambda a: (n := a.nonzero().squeeze(-1).numel(), a.new_tensor([[n, n + 1], [n * 2, n - 1]]))[-1],
    ]
    for fn in cases:
        check(fn, lambda: (torch.tensor([1, 0, 0, 5]),), counts=False)
        check(fn, lambda: (torch.randint(0, 2, (6,)),), counts=False)


def test_complex_builtin_added_to_a_tensor():
    def f(x):
        cs = (complex(), complex(1), complex(2, 3), complex(imag=2), complex(real=1), complex(imag=1, real=2),
              complex("1+2j"), complex(1, 2).conjugate())
        return [x + z for z in cs]

    check(f, t(1), counts=False)


def test_bad_complex_arguments_raise_type_error():
    def f(*args, **kwargs):
        return torch.tensor(complex(*args, **kwargs))

    c = kiln.compile(f)
    for args, kw in [((1, 1, 1), {}), ((1, 1), {"fake_arg": 1}), ((), {"fake_arg": 1}), (([],), {}), (("1 + j",), {})]:
        want = outcome(f, args) if not kw else outcome(lambda: f(*args, **kw), ())
        got = outcome(c, args) if not kw else outcome(lambda: c(*args, **kw), ())
        assert got == want


@pytest.mark.xfail(strict=True, reason='bool.__new__, int.from_bytes, float.fromhex, float.hex ... each break (11 breaks); TorchDynamo: 0')
def test_class_methods_of_builtin_types():
    def fn(x):
        return x + 1, (bool.__new__(bool), bool.__new__(bool, 1), bool.__new__(bool, 0),
                       bool.from_bytes(b"\x00" * 8, "big"), bool.from_bytes(b"abcd", "little"),
                       int.__new__(int), int.__new__(int, 42), int.from_bytes(b"\x00\x03", "big"),
                       int.from_bytes(b"\xff", byteorder="big", signed=True), float.fromhex("0x1.ffffp10"),
                       float.hex(1.5))

    check(fn, t(2))


def test_frozenset_keys_of_a_nested_global_dict():
    d = {frozenset({0}): {frozenset({0}): 1}}

    def f(x):
        return x + d[frozenset({0})][frozenset({0})]

    c = check(f, t(3))
    d[frozenset({0})][frozenset({0})] = 5
    x = torch.randn(3)
    same(c(x), f(x))


def test_a_class_statement_in_the_function():
    def f(x):
        x += 1

        class C:
            k = 2

        return x.sin() * C.k

    check(f, t(3))


def test_contiguous_strides_helper_under_dynamic_shapes():
    from torch._prims_common import make_contiguous_strides_for

    def fn(x):
        return x.as_strided(x.shape, make_contiguous_strides_for(x.shape))

    c = kiln.compile(fn, dynamic=True)
    for n in (4, 7):
        x = torch.randn(n, 8)
        same(c(x), fn(x))


def test_requires_grad_set_on_an_input():
    def fn(x):
        x.requires_grad_()
        if x.requires_grad:
            return x * 2
        return x + 1

    def gn(x):
        x.requires_grad_()
        return (x * 2).sum()

    x = torch.randn(3, 3)
    xe = x.clone()
    same(kiln.compile(fn)(x), fn(xe))
    assert x.requires_grad and xe.requires_grad
    xk, xe = torch.randn(3, 3), None
    xe = xk.clone()
    kiln.compile(gn)(xk).backward()
    gn(xe).backward()
    same(xk.grad, xe.grad)


def test_detach_in_place_on_an_intermediate():
    def fn(x):
        y = x * 2
        y.detach_()
        return y + 1, y.requires_grad, y.grad_fn is None

    check(fn, lambda: (torch.randn(3, 3, requires_grad=True),), counts=False)


def test_requires_grad_in_place_on_an_intermediate_returned():
    def fn(x):
        y = x * 2
        y.requires_grad_()
        return y, y * 3, y.is_leaf

    def gn(x):
        a = x.sin()
        b = a.cos()
        b.requires_grad_()
        return b

    check(fn, t(3, 3), counts=False)
    check(gn, t(3, 3), counts=False)


def test_backward_inside_the_function_on_a_leaf_made_inside():
    def fn(x):
        y = x * 2
        y.requires_grad_()
        out = y * 3
        (y ** 2).sum().backward()
        return y.grad * 2 + 1, out.detach(), y.is_leaf

    check(fn, t(3, 3), counts=False)


def test_chunked_loss_backward_inside_the_function():
    def fn(x, targets):
        h = x * 2 + 1
        xd = h.detach().requires_grad_()
        cs = xd.shape[0] // 2
        total = torch.tensor(0.0)
        for s in range(0, xd.shape[0], cs):
            logits = xd[s:s + cs] @ torch.eye(xd.shape[-1])
            loss = F.cross_entropy(logits, targets[s:s + cs])
            loss.backward()
            total = total + loss.detach()
        h.backward(xd.grad)
        return x.grad, total

    targets = torch.randint(0, 8, (4,))
    check(fn, lambda: (torch.randn(4, 8, requires_grad=True), targets), counts=False)


def test_importing_a_module_type_subclass_from_sys_modules():
    class _Cfg(types.ModuleType):
        x = 1

    sys.modules["kiln_test_my_config"] = _Cfg("kiln_test_my_config")
    try:
        def fn(t_):
            import kiln_test_my_config
            return t_ + kiln_test_my_config.x

        c = check(fn, t(2))
        _Cfg.x = 4
        x = torch.randn(2)
        same(c(x), fn(x))
    finally:
        del sys.modules["kiln_test_my_config"]
