"""Session.run checks its inputs and says what was wrong and what was expected."""

import numpy as np
import pytest

import metadef as md
from metadef.core.errors import InputError
from metadef.ir import parse_graph

TEXT = """graph g(%a: f32[batch,seq], %b: f32[batch,seq]) -> (%y) {
  %y: f32[batch,seq] = Add(%a, %b)
  return %y
}"""


@pytest.fixture
def sess():
    return md.compile(parse_graph(TEXT), target="reference")


def test_describes_its_inputs_and_outputs(sess):
    assert [str(s) for s in sess.inputs] == ["a: f32[batch,seq]", "b: f32[batch,seq]"]
    assert [str(s) for s in sess.outputs] == ["y: f32[batch,seq]"]
    assert repr(sess).startswith("Session[reference]")


def test_any_batch_size_runs(sess):
    for n in (1, 3, 7):
        a = np.ones((n, 5), np.float32)
        assert sess.run({"a": a, "b": a})["y"].shape == (n, 5)


def test_wrong_dtype_names_the_input_and_the_fix(sess):
    with pytest.raises(InputError) as e:
        sess.run({"a": np.ones((2, 3)), "b": np.ones((2, 3), np.float32)})
    assert str(e.value) == ("input 'a' has dtype float64, expected float32 (shape [batch,seq]); "
                            "convert it with .astype(np.float32)")


def test_wrong_rank_and_disagreeing_symbols(sess):
    ok = np.ones((2, 3), np.float32)
    with pytest.raises(InputError, match=r"input 'a' has shape \[2\], expected \[batch,seq\]: rank 1 but 2"):
        sess.run({"a": np.ones(2, np.float32), "b": ok})
    with pytest.raises(InputError, match=r"input 'b' has shape \[4, 3\].*symbol batch is already 2"):
        sess.run({"a": ok, "b": np.ones((4, 3), np.float32)})


def test_unknown_and_missing_names(sess):
    ok = np.ones((2, 3), np.float32)
    with pytest.raises(InputError, match=r"unknown input name\(s\) \['c'\]; this model's inputs are: a: f32"):
        sess.run({"a": ok, "b": ok, "c": ok})
    with pytest.raises(InputError, match=r"missing input b: f32\[batch,seq\]"):
        sess.run({"a": ok})
    with pytest.raises(InputError, match="unknown output name"):
        sess.run({"a": ok, "b": ok}, outputs=["z"])


def test_symbol_constraints_are_checked():
    g = parse_graph(TEXT)
    g.env.constrain("seq", hi=4)
    sess = md.compile(g)
    big = np.ones((1, 5), np.float32)
    with pytest.raises(InputError, match=r"seq=5 is above its maximum 4"):
        sess.run({"a": big, "b": big})


def test_unknown_target_lists_the_available_ones():
    with pytest.raises(md.MetadefError, match=r"unknown target 'tpu'; available targets: .*reference"):
        md.compile(parse_graph(TEXT), target="tpu")
