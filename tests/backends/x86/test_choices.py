"""Whatever the measured races choose, programs give the reference backend's answers.

The x86 backend picks kernels by timing them at bind time (Winograd or im2col, direct or
im2col, which product, fused epilogue or not), so which code runs depends on the host and its
load: a path that only runs when it wins a noisy race crashed CI once (a conv whose Relu was not
fused, run image by image: its calls were rebuilt without their sequence). Here each race's
candidates still run once (their timers are exercised), but the winner is drawn at random
(seeded), on small graphs covering the convs' and products' ways, at several shapes and on one
and two threads."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

import metadef as md
from metadef.backends.reference import ReferenceBackend
from metadef.backends.x86 import native, pieces
from metadef.ir import GraphBuilder, Value
from metadef.runtime.session import Session
from metadef.shape import parse_type

pytestmark = pytest.mark.jit


@pytest.fixture
def fresh_choices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[..., str]], None]:
    """No choice known yet (an empty cache, an empty memory of choices); calling the fixture with
    ``pick(key, names) -> name`` has every race run its candidates once and ``pick`` decide."""
    monkeypatch.setenv("METADEF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_CONV_CHOICES", {})

    def use(pick: Callable[[tuple, list[str]], str]) -> None:
        def remember(key: tuple, names: object, times: Mapping[str, float],
                     handicaps: Mapping[str, float] | None = None) -> tuple[str, str]:
            winner = pick(key, sorted(times))
            return real_remember(key, names, {n: 0.0 if n == winner else 1.0 for n in times})

        def race(candidates: Mapping[str, Callable[[], None]], rounds: int = 3, warm_up: bool = True
                 ) -> dict[str, float]:
            return real_race(candidates, rounds=1, warm_up=False)

        real_remember, real_race = native.remember_choice, native.race
        for module in (native, pieces):  # (pieces: whole batch or samples on the threads)
            monkeypatch.setattr(module, "remember_choice", remember)
            monkeypatch.setattr(module, "race", race)
    return use


def _check(g: md.Graph, shapes: Mapping[str, list[tuple[int, ...]]], threads: int, seed: int) -> None:
    sess = md.compile(g, target="x86", cache=False, threads=threads)
    assert not sess.executable.fallbacks, sess.executable.summary()
    reference = Session(g, ReferenceBackend().compile(g), "reference")
    rng = np.random.default_rng(seed)
    for k in range(len(next(iter(shapes.values())))):
        feeds = {name: rng.standard_normal(dims[k], dtype=np.float32) for name, dims in shapes.items()}
        got, want = sess.run(feeds), reference.run(feeds)
        for name in want:
            scale = max(1.0, float(np.abs(want[name]).max()))  # (sums of hundreds of products)
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5 * scale, err_msg=f"{name} at {k}")


class _Builder:
    """A GraphBuilder that makes its constants from a seeded generator."""

    def __init__(self, seed: int, x: str) -> None:
        self.b, self.rng = GraphBuilder("g"), np.random.default_rng(seed)
        self.x = self.b.input("x", parse_type(x))

    def const(self, name: str, *shape: int) -> Value:
        return self.b.const(name, self.rng.standard_normal(shape, dtype=np.float32))

    def op(self, op: str, *inputs: Value, **attrs: object) -> Value:
        out, = self.b.node(op, list(inputs), attrs, name=f"/{op.lower()}{len(self.b.nodes)}")
        return out

    def graph(self, *outputs: Value) -> md.Graph:
        for v in outputs:
            self.b.output(v)
        return md.optimize(self.b.build(), level="aggressive")


def strided(seed: int) -> md.Graph:
    """A stride-2 conv with bias and Relu, then a 3x3 conv adding the Relu's output."""
    g = _Builder(seed, "f32[n,8,h,w]")
    r = g.op("Relu", g.op("Conv", g.x, g.const("w", 8, 8, 3, 3), g.const("b", 8), pads=[1, 1, 1, 1], strides=[2, 2]))
    return g.graph(g.op("Add", g.op("Conv", r, g.const("v", 8, 8, 3, 3), pads=[1, 1, 1, 1]), r))


def pointwise(seed: int) -> md.Graph:
    """A bottleneck of pointwise convs with a residual, then a stride-2 pointwise conv."""
    g = _Builder(seed, "f32[n,32,h,w]")
    a = g.op("Relu", g.op("Conv", g.x, g.const("w1", 16, 32, 1, 1), g.const("b1", 16)))
    y = g.op("Relu", g.op("Add", g.op("Conv", a, g.const("w2", 32, 16, 1, 1)), g.x))
    return g.graph(y, g.op("Conv", y, g.const("w3", 24, 32, 1, 1), strides=[2, 2]))


def depthwise(seed: int) -> md.Graph:
    """A stride-2 depthwise conv with Relu6, a max pool, a pointwise projection."""
    g = _Builder(seed, "f32[n,16,h,w]")
    d = g.op("Conv", g.x, g.const("w", 16, 1, 3, 3), g.const("b", 16), group=16, pads=[1, 1, 1, 1], strides=[2, 2])
    c = g.op("Clip", d, g.b.const("lo", np.float32(0.0)), g.b.const("hi", np.float32(6.0)))
    m = g.op("MaxPool", c, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    return g.graph(g.op("Conv", m, g.const("p", 24, 16, 1, 1)))


def mlp(seed: int) -> md.Graph:
    """Two products with bias, a Relu between."""
    g = _Builder(seed, "f32[n,40]")
    h = g.op("Relu", g.op("Add", g.op("MatMul", g.x, g.const("w1", 40, 64)), g.const("b1", 64)))
    return g.graph(g.op("Add", g.op("MatMul", h, g.const("w2", 64, 10)), g.const("b2", 10)))


def mixed(seed: int) -> md.Graph:
    """A grouped conv, a dilated conv with a residual, a transposed conv with Relu, a 1-D conv."""
    g = _Builder(seed, "f32[n,12,h,w]")
    a = g.op("Relu", g.op("Conv", g.x, g.const("wg", 12, 4, 3, 3), g.const("bg", 12), group=3, pads=[1, 1, 1, 1]))
    d = g.op("Add", g.op("Conv", a, g.const("wd", 12, 12, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2]), g.x)
    t = g.op("Relu", g.op("ConvTranspose", d, g.const("wt", 12, 8, 3, 3), g.const("bt", 8), strides=[2, 2],
                          pads=[1, 1, 1, 1], output_padding=[1, 1]))
    rows = g.op("Reshape", t, g.b.const("shape", np.array([0, 8, -1], np.int64)))
    return g.graph(g.op("Conv", rows, g.const("w1", 16, 8, 5), pads=[2, 2], strides=[2]))


GRAPHS: dict[str, tuple[Callable[[int], md.Graph], dict[str, list[tuple[int, ...]]]]] = {
    "strided": (strided, {"x": [(1, 8, 9, 7), (2, 8, 16, 16), (3, 8, 5, 12)]}),
    "pointwise": (pointwise, {"x": [(1, 32, 8, 8), (2, 32, 14, 14), (3, 32, 6, 10)]}),
    "depthwise": (depthwise, {"x": [(1, 16, 9, 9), (2, 16, 16, 16), (3, 16, 7, 12)]}),
    "mlp": (mlp, {"x": [(1, 40), (8, 40), (33, 40)]}),
    "mixed": (mixed, {"x": [(1, 12, 7, 9), (2, 12, 16, 16), (3, 12, 5, 12)]})}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_any_choices_the_races_make_give_the_reference_answers(fresh_choices: Callable, name: str,
                                                                seed: int) -> None:
    build, shapes = GRAPHS[name]
    g = build(seed)
    drawn = random.Random(f"{name}/{seed}")
    fresh_choices(lambda key, names: drawn.choice(names))
    for threads in (1, 2, 3):  # (3: splits into odd numbers of tasks, as on larger machines)
        _check(g, shapes, threads, seed)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_strided_conv_whose_relu_stays_apart_runs_image_by_image(fresh_choices: Callable, threads: int) -> None:
    """The conv with its Relu in the stores loses to im2col + sgemm, so the group runs the conv
    alone, then the Relu as a kernel of its own; the conv alone goes direct, an image a task:
    its calls, moved to write into the epilogue's input, were rebuilt without the sequence
    each image's were (``md_run_sequence`` on nothing: a segfault)."""
    def pick(key: tuple, names: list[str]) -> str:
        if key[0] == "direct conv":
            return "direct" if key[-3] == -np.inf else "im2col"  # (its bounds: no Relu in the stores)
        return "sgemm" if "sgemm" in names and key[-2] == 0.0 else names[0]

    fresh_choices(pick)
    g = strided(0)
    _check(g, {"x": [(2, 8, 16, 16), (4, 8, 12, 10)]}, threads, 0)
    sess = md.compile(g, target="x86", cache=False, threads=threads)
    sess.run({"x": np.ones((2, 8, 16, 16), np.float32)})
    program = sess.executable.programs.bound({"n": 2, "h": 16, "w": 16})
    sess.executable.programs.give_back(program)
    steps = [what for step, what in program.call_steps if step.startswith("Conv_0") or "conv" in step]
    assert "conv2d direct own kernel" in steps and "epilogue" in steps, program.call_steps


@pytest.mark.slow
@pytest.mark.parametrize(("name", "threads", "seed"), [("resnet50", 2, 0), ("resnet50", 2, 1), ("mobilenetv2", 1, 0),
                                                      ("bert", 2, 0)])
def test_zoo_models_with_any_choices_match_onnxruntime(fresh_choices: Callable, name: str, threads: int,
                                                       seed: int) -> None:
    """The zoo's models on their real shapes (Winograd's sizes and groups, bands, pieces, pixel-major
    values, attention), each race won by a random candidate, at two batch sizes; ResNet-50's
    batch of 3 on 2 threads runs whole (seed 0) or an image a thread (seed 1)."""
    import onnxruntime as ort

    drawn, made = random.Random(f"{name}/{seed}"), []

    def pick(key: tuple, names: list[str]) -> str:
        made.append(key)
        if key[0] == "pieces":
            return pieces.WHOLE if seed == 0 else next(n for n in names if n != pieces.WHOLE)
        return drawn.choice(names)

    fresh_choices(pick)
    proto = md.zoo.build(name)
    sess = md.compile(md.optimize(md.import_onnx(proto), level="aggressive"), target="x86", cache=False,
                      threads=threads)
    assert not sess.executable.fallbacks, sess.executable.summary()
    oracle = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    info = md.zoo.describe(name)
    for dims in ({"batch": 1, "seq": 24}, {"batch": 3, "seq": 40}) if name == "bert" else ({"batch": 1}, {"batch": 3}):
        feeds = info.example_inputs(**dims)
        got = sess.run(feeds)
        for (output, ours), want in zip(got.items(), oracle.run(list(got), feeds)):
            np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()),
                                       err_msg=f"{name} {output} at {dims}")
    assert len(made) >= 5, made  # (the races ran, and were decided here)
    if name == "resnet50":  # (at 3 images on 2 threads: whole, or an image a thread)
        assert any(key[0] == "pieces" for key in made), made
