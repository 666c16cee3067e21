"""Two-operand einsums that are one batched product run as one sgemm in the native program:
against ``np.einsum`` on the binding's shapes (transposed operands, an output of columns before
rows, ``...``, implicit outputs), and the others run ``np.einsum`` with the reason."""

from __future__ import annotations

import numpy as np
import pytest

import metadef as md
from metadef.backends.x86.einsum import plan
from metadef.ir import GraphBuilder
from metadef.shape import parse_type

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(5)


def _session(equation: str, a: str, b: str) -> md.Session:
    g = GraphBuilder("einsum")
    y, = g.node("Einsum", [g.input("a", parse_type(a)), g.input("b", parse_type(b))], {"equation": equation})
    g.output(y)
    return md.compile(g.build(), target="x86", cache=False)


@pytest.mark.parametrize(("equation", "a", "b", "sizes"), [
    ("bhqd,bhkd->bhqk", "f32[n,3,q,8]", "f32[n,3,k,8]", {"n": 2, "q": 5, "k": 7}),  # attention scores
    ("bhqk,bhkd->bhqd", "f32[n,3,q,k]", "f32[n,3,k,8]", {"n": 2, "q": 5, "k": 7}),  # attention values
    ("bsd,de->bse", "f32[n,s,6]", "f32[6,4]", {"n": 3, "s": 5}),                     # a linear layer
    ("bsd,ed->bse", "f32[n,s,6]", "f32[4,6]", {"n": 3, "s": 5}),                     # ... its weights [out, in]
    ("ki,kj->ij", "f32[k,5]", "f32[k,4]", {"k": 9}),                                 # A^T B
    ("ik,jk->ji", "f32[5,k]", "f32[4,k]", {"k": 9}),                                 # (A B^T)^T
    ("bij,bjk->bki", "f32[n,4,6]", "f32[n,6,3]", {"n": 2}),                          # columns before rows
    ("...ij,...jk->...ik", "f32[n,2,4,6]", "f32[n,2,6,3]", {"n": 3}),                # ellipsis
    ("ij,jk", "f32[4,6]", "f32[6,3]", {}),                                           # implicit output
    ("bhid,bhjd->bhij", "f32[n,2,1,8]", "f32[n,2,k,8]", {"n": 1, "k": 1}),           # ones everywhere
])
def test_products_run_as_one_sgemm(equation: str, a: str, b: str, sizes: dict[str, int]) -> None:
    sess = _session(equation, a, b)
    feeds = {name: RNG.standard_normal([sizes.get(d, d) if isinstance(d, str) else d for d in
                                        (int(x) if x.isdigit() else x for x in t[4:-1].split(","))]
                                       ).astype(np.float32) for name, t in (("a", a), ("b", b))}
    got = sess.run(feeds)
    want = np.einsum(equation, feeds["a"], feeds["b"])
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-5, atol=1e-5)
    kinds = sess.executable.programs.bound(sizes).call_kinds
    assert kinds == {"einsum as sgemm": 1}, kinds


@pytest.mark.parametrize(("equation", "shapes", "why"), [
    ("bij,bjk->bik", [(2, 3, 4), (1, 4, 5)], "index 'b' has sizes 2 and 1 (broadcast)"),
    ("ij,jk->i", [(3, 4), (4, 5)], "an index is summed in one operand alone"),
    ("ii,ij->ij", [(3, 3), (3, 4)], "an index repeats within an operand or the output (a diagonal)"),
    ("bij,jbk->bik", [(2, 3, 4), (4, 2, 5)], "its batch indices do not lead the operands and the output in one order"),
    ("ijk,kj->i", [(2, 3, 4), (4, 3)], "an operand would need a copy (its indices are not grouped as one product "
                                        "reads them)"),
    ("ij,kl->ikjl", [(2, 3), (4, 5)], "the output interleaves the indices of its two operands"),
])
def test_other_einsums_say_why(equation: str, shapes: list[tuple[int, ...]], why: str) -> None:
    assert plan(equation, shapes) == why


def test_a_copying_einsum_runs_np_einsum_and_matches() -> None:
    sess = _session("ijk,kj->i", "f32[2,3,4]", "f32[4,3]")
    feeds = {"a": RNG.standard_normal((2, 3, 4)).astype(np.float32),
             "b": RNG.standard_normal((4, 3)).astype(np.float32)}
    np.testing.assert_allclose(next(iter(sess.run(feeds).values())), np.einsum("ijk,kj->i", feeds["a"], feeds["b"]),
                               rtol=1e-5, atol=1e-5)
    assert "einsum as sgemm" not in sess.executable.programs.bound({}).call_kinds
