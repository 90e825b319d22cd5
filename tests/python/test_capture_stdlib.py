"""Standard-library helpers over tensors (issue 15, part 1): itertools, functools.reduce, the
operator module, sum(start=), sorted(key=), dict(a=x) are traced through their Python models
(kiln/_polyfills.py) into one graph, as TorchDynamo's polyfills are; results equal eager's."""
import collections
import functools
import itertools
import operator
import typing

import pytest
import torch

import kiln

CASES = {
    "chain": lambda x, y: sum(itertools.chain([x], [y, x * 2])),
    "product": lambda x, y: sum(a * b for a, b in itertools.product([x, y], [1.0, 2.0])),
    "product_repeat": lambda x, y: sum(a - b for a, b in itertools.product([x, y], repeat=2)),
    "combinations": lambda x, y: sum(a * b for a, b in itertools.combinations([x, y, x + 1], 2)),
    "permutations": lambda x, y: sum(a - 2 * b for a, b in itertools.permutations([x, y, x * 3], 2)),
    "zip_longest": lambda x, y: [a if b is None else a * b for a, b in itertools.zip_longest([x, y], [2.0])][1] + 1,
    "islice": lambda x, y: sum(itertools.islice([x, y, x * 2, y * 3, x * 4], 1, 5, 2)),
    "accumulate": lambda x, y: list(itertools.accumulate([x, y, x]))[-1] * list(itertools.accumulate([x, y], operator.mul))[-1],
    "accumulate_initial": lambda x, y: list(itertools.accumulate([x, y], initial=torch.ones(4, 5)))[2],
    "repeat": lambda x, y: sum(itertools.repeat(x, 3)) + y,
    "reduce": lambda x, y: functools.reduce(operator.add, [x, y, x * 2]),
    "reduce_initial": lambda x, y: functools.reduce(lambda a, b: a * b + 1, [x, y], torch.zeros(4, 5)),
    "operator_functions": lambda x, y: operator.sub(operator.mul(x, y), operator.truediv(x, 2.0)) + operator.neg(y),
    "operator_matmul_getitem": lambda x, y: operator.getitem(operator.matmul(x, y.t()), 0),
    "sum_start": lambda x, y: sum([x, y], start=torch.ones(4, 5)),
    "sum_start_positional": lambda x, y: sum((x, y, x), torch.zeros(4, 5)),
    "sorted_key": lambda x, y: sorted([x[:3], y, x[:2]], key=lambda t: t.shape[0])[0] * 2,
    "sorted_reverse_stable": lambda x, y: sorted([x, y, x * 2], key=lambda t: t.dim(), reverse=True)[1] + 1,
    "dict_kwargs": lambda x, y: dict(a=x, b=y)["b"] - dict(a=x)["a"],
    "dict_mapping_and_kwargs": lambda x, y: dict({"a": x}, b=y)["a"] * 3,
    "dict_pairs": lambda x, y: dict([("a", x), ("b", y)])["b"] + 1,
}


@pytest.mark.parametrize("name", list(CASES))
def test_traced_into_one_graph_like_eager(name):
    fn = CASES[name]
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    want = fn(x, y)
    e = kiln.explain(fn)(x, y)
    assert e.graph_count == 1 and not e.break_reasons, e.break_reasons
    torch.testing.assert_close(kiln.compile(fn)(x, y), want)
    x2, y2 = torch.randn(4, 5), torch.randn(4, 5)
    torch.testing.assert_close(kiln.compile(fn)(x2, y2), fn(x2, y2))


def test_an_iterator_a_loop_broke_out_of_goes_on_where_it_stopped():
    # iter(it) is it: the second loop starts at the element after the one the first stopped on
    def fn(x, y):
        it = iter([x, y, x * 3])
        for v in it:
            break
        out = v
        for w in it:
            out = out + w * 10
        return out

    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(kiln.compile(fn)(x, y), fn(x, y))
    assert kiln.explain(fn)(x, y).graph_count == 1


def test_reduce_of_nothing_raises_like_eager():
    def fn(x):
        return functools.reduce(operator.add, [t for t in [x] if t.dim() > 5])

    with pytest.raises(TypeError, match="empty"):
        fn(torch.randn(2))
    with pytest.raises(TypeError, match="empty"):
        kiln.compile(fn)(torch.randn(2))


@pytest.mark.parametrize("fn, error, match", [
    (lambda x: max([t for t in [x] if t.dim() > 5], key=lambda t: t.numel()), ValueError, "empty"),
    (lambda x: min([], default=x) * 2, None, None),
    (lambda x: max(x, x + 1, key=lambda t: t.numel(), default=x), TypeError, "default"),
])
def test_min_max_edge_cases_behave_like_eager(fn, error, match):
    x = torch.randn(3)
    if error is None:
        torch.testing.assert_close(kiln.compile(fn)(x), fn(x))
        return
    with pytest.raises(error, match=match):
        fn(x)
    with pytest.raises(error, match=match):
        kiln.compile(fn)(x)


def test_min_max_keep_the_first_of_equal_keys():
    def fn(x, y, z):
        ts = [x, y, z]  # equal numel: the first wins, for max as for min
        return max(ts, key=lambda t: t.numel()) * 2 + min(ts, key=lambda t: t.shape[0]) * 3

    x, y, z = torch.randn(4), torch.randn(4), torch.randn(4)
    torch.testing.assert_close(kiln.compile(fn)(x, y, z), fn(x, y, z))
    assert kiln.explain(fn)(x, y, z).graph_count == 1


def test_list_slice_stores_and_deletes_like_eager():
    def fn(x, y):
        a = [x, y, x * 2, y * 2, x * 3, y * 3]
        a[1:3] = (t + 1 for t in (x, y, x))  # a generator of another length
        a[5:2] = [y * 7]                     # an empty range inserts at its start
        del a[-1:0:-3]                       # an extended slice walked backwards
        a[::2] = [t * 0.5 for t in a[::2]]
        return torch.stack(a), len(a)

    x, y = torch.randn(3), torch.randn(3)
    want = fn(x, y)
    got = kiln.compile(fn)(x, y)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]
    assert kiln.explain(fn)(x, y).graph_count == 1


def test_extended_slice_of_another_length_raises_like_eager():
    def fn(x):
        a = [x, x + 1, x + 2]
        a[::2] = [x]
        return a[0]

    with pytest.raises(ValueError, match="extended slice"):
        fn(torch.randn(2))
    with pytest.raises(ValueError, match="extended slice"):
        kiln.compile(fn)(torch.randn(2))


def test_dict_merges_keep_pythons_order_and_precedence():
    def fn(x, y):
        d = dict.fromkeys("abc", x)
        d |= [("b", y), ("d", x + y)]
        e = {"a": y * 3, "z": x} | d
        e.update(((k, v * 2) for k, v in d.items() if k != "a"), c=y - 1)
        return list(e), torch.stack(list(e.values()))

    x, y = torch.randn(3), torch.randn(3)
    want, got = fn(x, y), kiln.compile(fn)(x, y)
    assert got[0] == want[0]
    torch.testing.assert_close(got[1], want[1])
    assert kiln.explain(fn)(x, y).graph_count == 1


Pair = collections.namedtuple("Pair", ["left", "right"])


class Scaled(typing.NamedTuple):
    value: torch.Tensor
    scale: float = 2.0


def test_namedtuples_made_inside_are_one_graph_and_returned_as_their_class():
    def fn(x, y):
        p = Pair(x * 2, right=y)
        q = p._replace(left=p.left + 1)
        s = Scaled(q.right)
        return Pair(q.left * s.scale, s.value - p.left), s

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    e = kiln.explain(fn)(x, y)
    assert e.graph_count == 1 and not e.break_reasons, e.break_reasons
    got, want = kiln.compile(fn)(x, y), fn(x, y)
    assert type(got[0]) is Pair and type(got[1]) is Scaled
    torch.testing.assert_close(got[0].left, want[0].left)
    torch.testing.assert_close(got[0].right, want[0].right)
    torch.testing.assert_close(got[1].value, want[1].value)
    assert got[1].scale == 2.0


def test_a_namedtuple_across_a_graph_break_keeps_its_class():
    def fn(x):
        p = Pair(x + 1, x * 2)
        print("", end="")  # a break: the tuple is handed to the resume function
        return p.left * p.right, p

    x = torch.randn(5)
    got, want = kiln.compile(fn)(x), fn(x)
    assert type(got[1]) is Pair
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1].right, want[1].right)


def test_a_partials_keywords_are_overridden_by_the_calls():
    def gate(x, bias=0.0, scale=1.0):
        return torch.sigmoid(x * scale + bias)

    def fn(x, y):
        g = functools.partial(gate, bias=0.5, scale=2.0)
        return g(x) + g(y, bias=-1.0) + g(x, scale=0.5, bias=0.0)

    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(kiln.compile(fn)(x, y), fn(x, y))
    e = kiln.explain(fn)(x, y)
    assert e.graph_count == 1 and not e.break_reasons, e.break_reasons


def test_typed_dicts_keep_their_class_order_and_factory():
    def fn(x, y):
        d = collections.OrderedDict([("q", x), ("k", y)])
        d["v"] = x + y
        d.move_to_end("q")
        first = d.popitem(last=False)
        groups = collections.defaultdict(list)
        for i, t in enumerate([x, y, x * 2]):
            groups[i % 2].append(t)
        missing = groups.get(5)  # get() calls no factory
        return d, first, groups, missing, isinstance(groups, collections.defaultdict), d.copy()

    x, y = torch.randn(3), torch.randn(3)
    want, got = fn(x, y), kiln.compile(fn)(x, y)
    assert type(got[0]) is collections.OrderedDict and list(got[0]) == list(want[0])
    assert type(got[2]) is collections.defaultdict and got[2].default_factory is list
    assert type(got[5]) is collections.OrderedDict
    assert got[1][0] == want[1][0] and got[3] is None and got[4] is True
    for k in want[0]:
        torch.testing.assert_close(got[0][k], want[0][k])
    for k in want[2]:
        torch.testing.assert_close(torch.stack(got[2][k]), torch.stack(want[2][k]))
    e = kiln.explain(fn)(x, y)
    assert e.graph_count == 1 and not e.break_reasons, e.break_reasons
