"""Transposes that swap two blocks of axes run as ``md_transpose``; other permutations keep the
generated kernel. Against the reference backend, on one and two threads."""

from __future__ import annotations

import numpy as np
import pytest

import metadef as md
from metadef.backends.x86.transpose import merged_transpose
from metadef.ir import GraphBuilder
from metadef.shape import parse_type

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("shape,perm,routine", [
    ((3, 8, 33, 35), (0, 2, 3, 1), True),     # NCHW -> NHWC, 8x8 blocks and their edges
    ((3, 33, 35, 8), (0, 3, 1, 2), True),     # NHWC -> NCHW
    ((70, 130), (1, 0), True),                # a matrix
    ((1, 9, 1, 300), (0, 3, 2, 1), True),     # axes of length 1 moved too
    ((4, 128, 12, 64), (0, 2, 1, 3), False),  # whole rows move: the generated kernel
    ((2, 3, 4, 5), (3, 1, 0, 2), False),      # no two blocks
])
@pytest.mark.parametrize("dtype", ["f32", "i32", "i64"])
@pytest.mark.parametrize("threads", [1, 2])
def test_transposes_match_the_reference(shape: tuple[int, ...], perm: tuple[int, ...], routine: bool, dtype: str,
                                        threads: int) -> None:
    g = GraphBuilder("t")
    dims = ",".join(["n", *map(str, shape[1:])])
    y, = g.node("Transpose", [g.input("x", parse_type(f"{dtype}[{dims}]"))], {"perm": list(perm)})
    g.output(y)
    graph = g.build()
    x = (RNG.standard_normal(shape) * 100).astype({"f32": np.float32, "i32": np.int32, "i64": np.int64}[dtype])
    sess = md.compile(graph, target="x86", cache=False, threads=threads)
    np.testing.assert_array_equal(sess.run({"x": x})[y.name], np.transpose(x, perm))
    kinds = sess.executable.programs.bound({"n": shape[0]}).call_kinds
    assert (kinds.get("transpose", 0) == 1) == (routine and dtype != "i64"), kinds


def test_merged_transpose_finds_the_two_blocks() -> None:
    assert merged_transpose((2, 3, 4, 5), (0, 1, 2, 3)) is None  # nothing moves
    assert merged_transpose((2, 3, 4, 5), (2, 3, 0, 1)) == (1, 6, 20)
    assert merged_transpose((2, 3, 4, 5), (0, 3, 1, 2)) == (2, 12, 5)
    assert merged_transpose((6, 1, 7), (1, 2, 0)) == (1, 6, 7)
