"""Every zoo model, optimized at ``aggressive``, on the x86 backend vs ONNX Runtime.

Several batch sizes (and BERT sequence lengths) run on one compiled session; with
``metadef.codegen`` present, the number of LLVM compilations must not change between them.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import metadef as md
from metadef.backends import base
from metadef.backends.x86 import X86Backend
from metadef.runtime.session import Session
from metadef.testing.oracle import compare_with_onnxruntime

try:
    from metadef.codegen import compile_count
except ImportError:  # the codegen engineer's package is not there yet: fallbacks run instead
    compile_count = None

pytestmark = [pytest.mark.slow, pytest.mark.jit]

SIZES = {
    "mlp": [{"batch": 1}, {"batch": 3}],
    "resnet50": [{"batch": 1}, {"batch": 3}],
    "mobilenetv2": [{"batch": 1}, {"batch": 3}],
    "bert": [{"batch": 1, "seq": 37}, {"batch": 3, "seq": 37}, {"batch": 1, "seq": 128},
             {"batch": 3, "seq": 128}],
}


@functools.cache
def _optimized(name: str) -> tuple[object, md.Graph]:
    proto = md.zoo.build(name)
    return proto, md.optimize(md.import_onnx(proto), level="aggressive")


@pytest.fixture
def x86_target() -> str:
    assert "x86" in base.available_backends()
    return "x86"


@pytest.mark.parametrize("name", list(SIZES))
def test_zoo_model_matches_onnxruntime_without_recompiling(name: str, x86_target: str) -> None:
    proto, graph = _optimized(name)
    exe = X86Backend().compile(graph)
    sess = Session(graph, exe, x86_target)
    compiled = compile_count() if compile_count is not None else None
    info = md.zoo.describe(name)
    for dims in SIZES[name]:
        feeds = info.example_inputs(**dims)
        check = compare_with_onnxruntime(proto, feeds, graph=graph, target=x86_target)
        assert check.ok, (dims, check.outputs)
        ours = sess.run(feeds)
        for out in check.outputs:
            assert ours[out.name].shape == out.shape
    if compile_count is not None:
        assert compile_count() == compiled, "a new batch size / sequence length compiled code"
    assert all(p.reason for p in exe.plan)
    for dims in SIZES[name]:
        program = exe.programs.bound(dims)
        try:  # the planned arena against the lifetime lower bound; one native program, no Python step
            assert program.plan.peak <= 1.1 * program.plan.lower_bound, program.describe()
            assert program.python_steps == 0, program.python_reasons
        finally:
            exe.programs.give_back(program)


@pytest.mark.skipif(compile_count is None, reason="metadef.codegen is not available yet")
def test_no_compilation_at_run_time() -> None:
    _, graph = _optimized("mlp")
    exe = X86Backend().compile(graph)
    assert any(p.kind.startswith("generated") or "generated" in p.kind for p in exe.plan), exe.summary()
    before = compile_count()
    sess = Session(graph, exe, "x86")
    for batch in (1, 2, 5, 8):
        sess.run(md.zoo.describe("mlp").example_inputs(batch=batch))
    assert compile_count() == before
    X86Backend().compile(graph)  # the same structures again: served from the kernel cache
    assert compile_count() == before


def test_outputs_are_fresh_arrays_the_caller_owns(x86_target: str) -> None:
    _, graph = _optimized("mlp")
    sess = md.compile(graph, target=x86_target)
    feeds = md.zoo.describe("mlp").example_inputs(batch=2)
    first = sess.run(feeds)["probs"]
    keep = first.copy()
    second = sess.run(feeds)["probs"]
    assert first is not second and np.array_equal(first, keep)
