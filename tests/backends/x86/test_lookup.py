"""``ai.metadef::Lookup`` on x86: ``md_lookup`` against numpy's indexing for every element
size, both 8-bit types, sizes around its 64-element blocks and split over tasks; the op in
a graph, in programs of one and two threads and step by step."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import metadef as md
from metadef.backends.x86.lookup import lookup_node
from metadef.codegen.native import ENTRY, native_function
from metadef.codegen.native_lookup import lookup_dims
from metadef.core.errors import MetadefError
from metadef.ir import Graph, GraphBuilder
from metadef.ops import get_op, infer_types
from metadef.shape import parse_type

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("table_dtype", [np.uint8, np.int8, np.float16, np.float32, np.int64])
def test_md_lookup_is_numpys_indexing(dtype: type, table_dtype: type) -> None:
    info = np.iinfo(dtype)
    run = ENTRY(native_function("md_lookup"))
    table = RNG.integers(-100, 100, 256).astype(table_dtype)
    for count in (0, 1, 63, 64, 65, 200, 4099):
        x = RNG.integers(info.min, int(info.max) + 1, count).astype(dtype)
        want = table[x.astype(np.int64) - info.min]
        for tasks in (1, 3):
            y = np.zeros(count, table_dtype)
            for task in range(tasks):
                dims = lookup_dims(count, table.itemsize, signed=dtype is np.int8, task=task, tasks=tasks)
                run((ctypes.c_void_p * 3)(x.ctypes.data, table.ctypes.data, y.ctypes.data),
                    (ctypes.c_int64 * len(dims))(*dims))
            np.testing.assert_array_equal(y, want)


def _lookup_graph(kind: str, table: np.ndarray) -> Graph:
    b = GraphBuilder("g")
    y, = b.node("Lookup", [b.input("x", parse_type(f"{kind}[n,s,7]")), b.const("table", table)],
                domain="ai.metadef", name="/lookup")
    b.output(y)
    return b.build()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_lookup_runs_natively_at_any_size(threads: int) -> None:
    table = (np.arange(256) * 3 % 251).astype(np.uint8)
    graph = _lookup_graph("i8", table)
    sess = md.compile(graph, target="x86", threads=threads, cache=False)
    reference = md.compile(graph, target="reference")
    for n, s in ((1, 1), (3, 50), (40, 100)):  # (the last splits over the threads)
        feeds = {"x": RNG.integers(-128, 128, (n, s, 7)).astype(np.int8)}
        np.testing.assert_array_equal(sess.run(feeds)[graph.outputs[0].name],
                                      reference.run(feeds)[graph.outputs[0].name])
    assert sess.executable.plan[0].reason == "Lookup: md_lookup (our kernel)"


def test_a_lookup_runs_step_by_step_too() -> None:
    table = np.linspace(-1, 1, 256).astype(np.float32)
    graph = _lookup_graph("u8", table)
    choice = lookup_node(graph.nodes[0])
    x = RNG.integers(0, 256, (2, 5, 7)).astype(np.uint8)
    y, = choice.kernel([x, table], [graph.outputs[0].type])
    np.testing.assert_array_equal(y, table[x])


def test_the_lookup_op_checks_its_types() -> None:
    metaop = get_op("Lookup", "ai.metadef")
    y, = infer_types(metaop, "/l", [parse_type("u8[b,s,3072]"), parse_type("f32[256]")], {})
    assert str(y) == "f32[b,s,3072]"
    with pytest.raises(MetadefError, match="256"):
        infer_types(metaop, "/l", [parse_type("u8[b]"), parse_type("f32[255]")], {})
    with pytest.raises(MetadefError, match="int8, uint8"):
        infer_types(metaop, "/l", [parse_type("f32[b]"), parse_type("f32[256]")], {})
    b = GraphBuilder("g")
    y, = b.node("Lookup", [b.input("x", parse_type("u8[n]")), b.input("t", parse_type("f32[256]"))],
                domain="ai.metadef")
    b.output(y)
    assert "computed at run time" in str(lookup_node(b.build().nodes[0]))
