"""x86: a batch run in pieces gives the whole batch's answer, decided once per binding."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import metadef as md
from metadef.backends.reference import ReferenceBackend
from metadef.backends.x86 import pieces
from metadef.codegen import compile_count
from metadef.core.errors import BackendError
from metadef.ir import parse_graph
from metadef.runtime.session import Session

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(11)

CNN = """graph cnn(%x: f32[n,3,12,12], %scale: f32[8,1,1]) -> (%p, %f) {
  %w1: f32[8,3,3,3] = const
  %b1: f32[8] = const
  %c1: f32[n,8,6,6] = Conv(%x, %w1, %b1) {pads=[1,1,1,1], strides=[2,2]} @conv1
  %r1: f32[n,8,6,6] = Relu(%c1) @relu1
  %s1: f32[n,8,6,6] = Mul(%r1, %scale) @scale
  %wd: f32[8,1,3,3] = const
  %c2: f32[n,8,6,6] = Conv(%s1, %wd) {group=8, pads=[1,1,1,1]} @dw
  %f: f32[n,288] = Flatten(%c2) @flat
  %wg: f32[10,288] = const
  %g: f32[n,10] = Gemm(%f, %wg) {transB=1} @fc
  %p: f32[n,10] = Softmax(%g) {axis=1} @softmax
  return %p, %f }"""


@pytest.fixture(scope="module")
def cnn() -> tuple[md.Graph, Session]:
    shapes = {"w1": (8, 3, 3, 3), "b1": (8,), "wd": (8, 1, 3, 3), "wg": (10, 288)}
    g = parse_graph(CNN, constants={k: RNG.standard_normal(s, dtype=np.float32) for k, s in shapes.items()})
    return g, md.compile(g, target="x86")


def _feeds(n: int) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((n, 3, 12, 12), dtype=np.float32),
            "scale": RNG.standard_normal((8, 1, 1), dtype=np.float32)}


def test_pieces_of_every_size_give_the_whole_batchs_outputs(cnn: tuple[md.Graph, Session]) -> None:
    g, sess = cnn
    exe = sess.executable
    assert exe.samples == "n"
    feeds = _feeds(5)
    inputs = [feeds["x"], feeds["scale"]]  # %scale has no batch: every piece reads it whole
    want = ReferenceBackend().compile(g).run(feeds, {"n": 5})
    for way in (1, 2, 3, 5, pieces.Pieces(1, 2), pieces.Pieces(2, 3)):  # (on 2 or 3 threads at once)
        got = pieces.run_pieces(exe, inputs, {"n": 5}, way)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_binding_decides_once_by_measurement_and_compiles_nothing(cnn: tuple[md.Graph, Session],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    g, sess = cnn
    exe = sess.executable
    monkeypatch.setattr(pieces, "CACHE_BYTES", 0)  # let the rule time pieces on this small graph
    monkeypatch.setattr(pieces, "WEIGHTS_FACTOR", 0)
    sess.run(_feeds(1))
    compiled = compile_count()
    feeds = _feeds(4)
    got = sess.run(feeds)
    decided = {k: v for k, v in exe._pieces.items() if k[0] == (("n", 4),)}
    assert len(decided) == 1
    way = next(iter(decided.values()))
    assert way is None or way.size in pieces.PIECES
    want = ReferenceBackend().compile(g).run(feeds, {"n": 4})
    np.testing.assert_allclose(got["p"], want[0], rtol=1e-4, atol=1e-6)
    sess.run(feeds)
    assert {k: v for k, v in exe._pieces.items() if k[0] == (("n", 4),)} == decided  # not measured again
    assert compile_count() == compiled


def test_the_measuring_first_run_answers_into_the_callers_buffers(cnn: tuple[md.Graph, Session],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    g, sess = cnn
    exe = sess.executable
    monkeypatch.setattr(pieces, "CACHE_BYTES", 0)
    monkeypatch.setattr(pieces, "WEIGHTS_FACTOR", 0)
    runs = {"whole": 0}
    whole = exe.run_whole

    def counted(*args: object, **kwargs: object) -> list[np.ndarray]:
        runs["whole"] += 1
        return whole(*args, **kwargs)

    monkeypatch.setattr(exe, "run_whole", counted)
    feeds = _feeds(6)
    buffer = np.full((6, 10), np.nan, np.float32)
    got = sess.run(feeds, outputs={"p": buffer})  # (a binding not run before: measured now)
    assert any(k[0] == (("n", 6),) for k in exe._pieces)
    assert got["p"] is buffer
    want = ReferenceBackend().compile(g).run(feeds, {"n": 6})
    np.testing.assert_allclose(buffer, want[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["f"], want[1], rtol=1e-4, atol=1e-5)
    measuring = runs["whole"]  # (the untimed run and the race's rounds: the answer is the last one's)
    sess.run(feeds, outputs={"p": buffer})
    way = next(v for k, v in exe._pieces.items() if k[0] == (("n", 6),))
    assert runs["whole"] == measuring + (way is None)


def test_pieces_write_into_caller_buffers_and_check_inputs(cnn: tuple[md.Graph, Session]) -> None:
    g, sess = cnn
    exe = sess.executable
    for threads in (1, 2):
        exe._pieces[((("n", 3),), threads)] = pieces.Pieces(2, threads)  # pieces of 2 and 1
    feeds = _feeds(3)
    buffer = np.full((3, 10), np.nan, np.float32)
    got = sess.run(feeds, outputs={"p": buffer})
    assert got["p"] is buffer
    want = ReferenceBackend().compile(g).run(feeds, {"n": 3})
    np.testing.assert_allclose(buffer, want[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["f"], want[1], rtol=1e-4, atol=1e-5)
    with pytest.raises(BackendError, match="input %x"):  # the executable's own check, no Session
        exe.run({"x": np.zeros((3, 3, 12, 11), np.float32), "scale": feeds["scale"]}, {"n": 3})


def test_the_rule_runs_a_small_batch_whole(cnn: tuple[md.Graph, Session]) -> None:
    _, sess = cnn
    assert pieces.split_rule(sess.executable, {"n": 8}, 2) == []  # kilobytes of intermediates
    assert pieces.split_rule(sess.executable, {"n": 1}, 2) == []


def test_the_rule_times_pieces_one_after_another_and_on_the_threads_at_once(cnn: tuple[md.Graph, Session],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    exe = cnn[1].executable
    monkeypatch.setattr(pieces, "CACHE_BYTES", 0)
    # the weights outweigh its intermediates: only samples one a thread, on the threads at once
    assert [str(w) for w in pieces.split_rule(exe, {"n": 6}, 2)] == ["1 on 2 threads"]
    assert pieces.split_rule(exe, {"n": 6}, 1) == []  # (one thread: whole)
    assert pieces.split_rule(exe, {"n": 3}, 4) == []  # (fewer samples than threads: whole)
    monkeypatch.setattr(pieces, "WEIGHTS_FACTOR", 0)
    assert [str(w) for w in pieces.split_rule(exe, {"n": 6}, 2)] == ["1", "2", "1 on 2 threads", "2 on 2 threads"]
    assert [str(w) for w in pieces.split_rule(exe, {"n": 2}, 1)] == ["1"]


def test_runs_in_pieces_from_several_threads_at_once_agree(cnn: tuple[md.Graph, Session]) -> None:
    g, sess = cnn
    exe = sess.executable
    for threads in (1, 2):
        exe._pieces[((("n", 4),), threads)] = pieces.Pieces(1, threads)
    inputs = [_feeds(4) for _ in range(6)]
    want = [ReferenceBackend().compile(g).run(f, {"n": 4})[0] for f in inputs]
    got: list[np.ndarray | None] = [None] * len(inputs)

    def work(k: int) -> None:
        got[k] = sess.run(inputs[k])["p"]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
