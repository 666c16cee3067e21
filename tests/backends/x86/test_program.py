"""x86 native programs: one call per segment, the arena, caller buffers, threads, bad input.

Every check compares the native program with the step-by-step Python path of the same
executable and with the reference backend, on real LLVM-compiled code.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest

import metadef as md
from metadef.backends.reference import ReferenceBackend
from metadef.codegen import compile_count
from metadef.codegen.native_gemm import conv1x1_width
from metadef.core.errors import BackendError, InputError
from metadef.ir import parse_graph
from metadef.runtime.session import Session

pytestmark = pytest.mark.jit

RNG = np.random.default_rng(7)

# conv (padded, strided) + bias + relu, a 1x1 conv, depthwise conv, flatten (a view), gemm,
# softmax: every native form, and an ArgMax step (runs from Python) in the middle
CNN = """graph cnn(%x: f32[n,3,10,10]) -> (%p, %s) {
  %w1: f32[8,3,3,3] = const
  %b1: f32[8] = const
  %c1: f32[n,8,5,5] = Conv(%x, %w1, %b1) {pads=[1,1,1,1], strides=[2,2]} @conv1
  %r1: f32[n,8,5,5] = Relu(%c1) @relu1
  %wd: f32[8,1,3,3] = const
  %c2: f32[n,8,5,5] = Conv(%r1, %wd) {group=8, pads=[1,1,1,1]} @dw
  %wp: f32[4,8,1,1] = const
  %c3: f32[n,4,5,5] = Conv(%c2, %wp) @pw
  %f: f32[n,100] = Flatten(%c3) @flat
  %wg: f32[10,100] = const
  %bg: f32[10] = const
  %g: f32[n,10] = Gemm(%f, %wg, %bg) {transB=1} @fc
  %p: f32[n,10] = Softmax(%g) {axis=1} @softmax
  %s: i64[n,1] = ArgMax(%g) {axis=1} @argmax
  return %p, %s }"""


def _graph(text: str) -> md.Graph:
    """The graph, each ``%name: f32[dims] = const`` drawn at random."""
    consts = {name: RNG.standard_normal([int(d) for d in dims.split(",")], dtype=np.float32)
              for name, dims in re.findall(r"%(\w+): f32\[([\d,]+)\] = const", text)}
    return parse_graph(text, constants=consts)


@pytest.fixture(scope="module")
def cnn() -> tuple[md.Graph, Session]:
    g = _graph(CNN)
    return g, md.compile(g, target="x86")


def _in_threads(work: Callable[[int], None], count: int) -> None:
    """Run ``work(k)`` for k < count in as many threads at once; re-raise the first failure."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def _reference(g: md.Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return Session(g, ReferenceBackend().compile(g), "reference").run(feeds)


def test_every_native_form_matches_the_reference_at_random_batch_sizes(cnn: tuple[md.Graph, Session]) -> None:
    g, sess = cnn
    sess.run({"x": RNG.standard_normal((1, 3, 10, 10), dtype=np.float32)})
    compiled = compile_count()
    for n in RNG.integers(1, 9, size=5):
        feeds = {"x": RNG.standard_normal((int(n), 3, 10, 10), dtype=np.float32)}
        got, want = sess.run(feeds), _reference(g, feeds)
        np.testing.assert_allclose(got["p"], want["p"], rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(got["s"], want["s"])
        steps = sess.executable.run_steps(feeds, {"n": int(n)})
        np.testing.assert_allclose(got["p"], steps[0], rtol=1e-5, atol=1e-7)
    assert compile_count() == compiled  # new batch sizes compile nothing


def test_the_program_is_native_but_for_the_argmax_step(cnn: tuple[md.Graph, Session]) -> None:
    _, sess = cnn
    program = sess.executable.programs.bound({"n": 2})
    try:
        assert program.python_steps == 1 and program.python_reasons[0][0] == "argmax"
        assert program.views == 1
        assert program.plan.peak <= 1.1 * program.plan.lower_bound
        assert "arena" in program.describe()
    finally:
        sess.executable.programs.give_back(program)


def test_outputs_go_into_caller_buffers(cnn: tuple[md.Graph, Session]) -> None:
    g, sess = cnn
    feeds = {"x": RNG.standard_normal((3, 3, 10, 10), dtype=np.float32)}
    buffer = np.full((3, 10), np.nan, np.float32)
    got = sess.run(feeds, outputs={"p": buffer})
    assert got["p"] is buffer and got["s"].tolist() == np.argmax(buffer, axis=1, keepdims=True).tolist()
    np.testing.assert_allclose(buffer, _reference(g, feeds)["p"], rtol=1e-4, atol=1e-6)
    with pytest.raises(InputError, match=r"output buffer 0 is float32\[2, 10\]"):
        sess.run(feeds, outputs={"p": np.empty((2, 10), np.float32)})
    with pytest.raises(InputError, match="C-contiguous"):
        sess.run(feeds, outputs={"p": np.empty((10, 3), np.float32).T})
    with pytest.raises(InputError, match="unknown output"):
        sess.run(feeds, outputs={"q": buffer})
    g2 = _graph("graph g(%x: f32[n,4]) -> (%y) { %y: f32[n,4] = Exp(%x) @exp return %y }")
    x = RNG.standard_normal((2, 4), dtype=np.float32)
    with pytest.raises(InputError, match="shares memory with input 0"):  # in place: not allowed
        md.compile(g2, target="x86").run({"x": x}, outputs={"y": x})


def test_read_only_and_bfloat16_inputs_are_read_in_place(cnn: tuple[md.Graph, Session]) -> None:
    # a run reads its inputs' addresses out of the array objects: read-only arrays and
    # ml_dtypes' bfloat16 (which numpy will not export as writeable buffers) alike
    _, sess = cnn
    x = RNG.standard_normal((2, 3, 10, 10), dtype=np.float32)
    frozen = x.copy()
    frozen.flags.writeable = False
    np.testing.assert_array_equal(sess.run({"x": frozen})["p"], sess.run({"x": x})["p"])
    g16 = parse_graph("graph g(%x: bf16[n,2,2]) -> (%y) { %y: bf16[n,4] = Flatten(%x) @flat return %y }")
    sess16 = md.compile(g16, target="x86")
    assert sess16.executable.programs.bound({"n": 2}).call_steps == [("flat", "copy")]
    x16 = np.array([[[1, -2], [3.5, 0]]] * 2, dtype=ml_dtypes.bfloat16)
    assert sess16.run({"x": x16})["y"].astype(np.float32).tolist() == [[1, -2, 3.5, 0]] * 2


def test_runs_from_several_threads_at_once_agree(cnn: tuple[md.Graph, Session]) -> None:
    # each thread's runs give exactly the answers of the same runs one at a time (against the
    # reference, within float32's rounding: this random net's logits reach the hundreds, so a
    # softmax output of 0.03 may differ by 1e-4 of itself with the kernels a race picked)
    g, sess = cnn
    inputs = [{"x": RNG.standard_normal((1 + i % 3, 3, 10, 10), dtype=np.float32)} for i in range(8)]
    want = [sess.run(f)["p"] for f in inputs]
    for f, w in zip(inputs, want):
        np.testing.assert_allclose(w, _reference(g, f)["p"], rtol=1e-3, atol=1e-6)

    def work(k: int) -> None:
        for r in range(20):
            i = (k + r) % len(inputs)
            np.testing.assert_array_equal(sess.run(inputs[i])["p"], want[i])

    _in_threads(work, 4)


def test_addresses_are_read_from_the_array_objects() -> None:
    """A run's input and output addresses come from the ndarray objects themselves (numpy's
    ``data`` field, found and checked at import), not through ``array.ctypes``."""
    from metadef.backends.x86 import addresses
    assert addresses._DATA_FIELD is not None  # (CPython and numpy here: the fast way is taken)
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    frozen = base[1:]
    frozen.flags.writeable = False
    for a in (base, base[2:], base.T.copy(), np.zeros(3, np.int8), base.astype(ml_dtypes.bfloat16), frozen,
              np.full((), 2.0, np.float32)):
        assert addresses.address(a) == a.ctypes.data
    assert addresses.address(base[:0]) == addresses._EMPTY_ADDRESS


def test_bad_inputs_get_clear_errors(cnn: tuple[md.Graph, Session]) -> None:
    _, sess = cnn
    x = RNG.standard_normal((2, 3, 10, 10), dtype=np.float32)
    with pytest.raises(InputError, match="dtype float64"):
        sess.run({"x": x.astype(np.float64)})
    with pytest.raises(InputError, match="'x' has shape"):
        sess.run({"x": x[0]})  # rank 3
    with pytest.raises(InputError, match="'x' has shape"):
        sess.run({"x": x[:, :, :9]})  # a static dim broken
    with pytest.raises(InputError, match="missing input"):
        sess.run({})
    with pytest.raises(BackendError, match="read by conv1"):  # the executable without the Session
        sess.executable.run({"x": x[:, :, :9]}, {"n": 2})
    strided = np.asfortranarray(x)  # non-contiguous input: copied, same answer
    np.testing.assert_allclose(sess.run({"x": strided})["p"], sess.run({"x": x})["p"], rtol=1e-6)


def test_outputs_that_are_inputs_constants_views_or_repeated() -> None:
    g = _graph("""graph g(%x: f32[n,4]) -> (%x, %k, %v, %y, %y) {
      %k: f32[2] = const
      %y: f32[n,4] = Relu(%x) @relu
      %v: f32[4,n] = Transpose(%y) {perm=[1,0]} @t
      return %x, %k, %v, %y, %y }""")
    sess = md.compile(g, target="x86")
    x = RNG.standard_normal((3, 4), dtype=np.float32)
    out = list(sess.executable.run({"x": x}, {"n": 3}))
    want = [x, g.constants[0].const, np.maximum(x, 0).T, np.maximum(x, 0), np.maximum(x, 0)]
    for o, w in zip(out, want):
        np.testing.assert_allclose(o, w, rtol=1e-6)
    assert out[0] is not x and out[3] is not out[4]  # the caller owns every output


def test_a_view_that_is_a_graph_output_is_copied_out() -> None:
    g = _graph("""graph g(%x: f32[n,2,2]) -> (%f, %y) {
      %y: f32[n,2,2] = Exp(%x) @exp
      %f: f32[n,4] = Flatten(%y) @flat
      return %f, %y }""")
    sess = md.compile(g, target="x86")
    x = RNG.standard_normal((2, 2, 2), dtype=np.float32)
    got = sess.run({"x": x})
    np.testing.assert_allclose(got["f"], np.exp(x).reshape(2, 4), rtol=1e-6)
    assert not np.shares_memory(got["f"], got["y"])


@pytest.mark.parametrize(("choice", "products"), [
    ("winograd", "sgemm"), ("winograd", "own micro-kernel, epilogue fused"),
    ("winograd", "own micro-kernel, pixels as rows"), ("winograd4", "sgemm"),
    ("winograd4", "own micro-kernel, epilogue fused"), ("winograd4", "own micro-kernel, pixels as rows"),
    ("im2col", None)])
# F(2x2): rows of 3, 5, 6, 10, 17 and 32 tiles (the input transform takes 4, 8 or 16 at a
# time); F(4x4): rows of 4, 5, 9, 14 and 16 tiles (4 at a time, the last step overlapping;
# narrower images take F(2x2))
@pytest.mark.parametrize(("size", "pad"), [(9, 1), (8, 0), (7, 2), (12, 1), (20, 1), (33, 1), (64, 1), (14, 1),
                                           (56, 1)])
def test_3x3_convs_by_winograd_or_im2col_match_the_reference(monkeypatch: pytest.MonkeyPatch, choice: str,
                                                             products: str | None, size: int, pad: int) -> None:
    """Winograd's products (16 for F(2x2), 36 for F(4x4)) through sgemm or our kernels
    (pixels as columns where a tile of 16 fits, as rows), or im2col, against the reference,
    on 1 and 2 threads."""
    from metadef.backends.x86 import conv1x1, conv_direct, winograd
    from metadef.codegen.native_winograd import winograd_fits
    monkeypatch.setattr(conv_direct, "PREFER", conv_direct.IM2COL)
    monkeypatch.setattr(winograd, "known_choice", lambda key, names: None)
    monkeypatch.setattr(winograd, "measured_choice", lambda key, candidates: (choice, "forced by the test"))
    monkeypatch.setattr(conv1x1, "PREFER", products)
    out = size + 2 * pad - 2
    g = _graph(f"""graph g(%x: f32[n,8,{size},{size}]) -> (%y) {{
      %w: f32[12,8,3,3] = const
      %b: f32[12] = const
      %y: f32[n,12,{out},{out}] = Conv(%x, %w, %b) {{pads=[{pad},{pad},{pad},{pad}]}} @conv
      return %y }}""")
    feeds = {"x": RNG.standard_normal((2, 8, size, size), dtype=np.float32)}
    m = 4 if choice == "winograd4" and winograd_fits(4, out) else 2
    want = _reference(g, feeds)["y"]
    # F(4x4)'s rounding error: ~1e-5 of the outputs' scale (the direct conv's, and F(2x2)'s: ~1e-6)
    atol = 1e-4 if m == 2 else 3e-5 * float(np.abs(want).max())
    for threads in (1, 2):  # both split their phases across the threads
        sess = md.compile(g, target="x86", cache=False, threads=threads)
        np.testing.assert_allclose(sess.run(feeds)["y"], want, rtol=1e-4, atol=atol)
        program = sess.executable.programs.bound({"n": 2})
        sess.executable.programs.give_back(program)
        expect = f"conv2d winograd F({m}x{m},3x3)" if choice != "im2col" else "conv2d im2col"
        assert any(kind.startswith(expect) for kind in program.call_kinds), program.call_kinds
        own = sum(v for kind, v in program.call_kinds.items() if kind.startswith("conv2d winograd product own"))
        group = winograd.winograd_group(2, 8, 12, out, out, m)  # (images sharing each product)
        tiles = group * (-(-out // m)) ** 2
        columns = products == conv1x1.OWN and tiles >= conv1x1_width()  # (a block of the kernel's pixels)
        assert own == (2 // group * (m + 2) ** 2 if products == conv1x1.OWN_T or columns else 0)
        if threads == 2 and own:  # the products (and their transposes) run as one group each: one barrier
            groups = sum(segment.count for segment in program.segments)
            flips = 2 if products == conv1x1.OWN_T else 1
            assert groups == program.native_calls - 2 // group * flips * ((m + 2) ** 2 - 1), program.describe()


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(("products", "rows"), [("sgemm", False), ("own micro-kernel, epilogue fused", False),
                                                ("own micro-kernel, pixels as rows", False),
                                                ("own micro-kernel, pixels as rows", True)])
def test_winograd_products_shared_by_a_group_of_images_match_the_reference(
        monkeypatch: pytest.MonkeyPatch, m: int, products: str, rows: bool) -> None:
    """More output channels than an image has tiles: the images of a batch share each product
    (their tiles side by side in the workspace), in groups that fit its size (here 2 and 1 of 3);
    by planes, and (``rows``) on pixel rows, the NCHW input and output transposed."""
    from metadef.backends.x86 import conv1x1, winograd
    monkeypatch.setattr(winograd, "ROWS_BETWEEN_PLANES", rows)
    monkeypatch.setattr(winograd, "known_choice", lambda key, names: None)
    monkeypatch.setattr(winograd, "measured_choice",
                        lambda key, candidates: ("winograd4" if m == 4 else "winograd", "forced by the test"))
    monkeypatch.setattr(conv1x1, "PREFER", products)
    two_images = 4 * winograd.winograd_workspace(16, 64, 14, 14, m, 2)
    monkeypatch.setattr(winograd, "WINOGRAD_GROUP_BYTES", two_images)
    assert winograd.winograd_group(3, 16, 64, 14, 14, m) == 2
    g = _graph("""graph g(%x: f32[n,16,14,14]) -> (%y) {
      %w: f32[64,16,3,3] = const
      %b: f32[64] = const
      %y: f32[n,64,14,14] = Conv(%x, %w, %b) {pads=[1,1,1,1]} @conv
      return %y }""")
    feeds = {"x": RNG.standard_normal((3, 16, 14, 14), dtype=np.float32)}
    want = _reference(g, feeds)["y"]
    for threads in (1, 2):
        sess = md.compile(g, target="x86", cache=False, threads=threads)
        np.testing.assert_allclose(sess.run(feeds)["y"], want, rtol=1e-4, atol=3e-5 * float(np.abs(want).max()))
        kinds = sess.executable.programs.bound({"n": 3}).call_kinds
        assert any(kind.startswith(f"conv2d winograd F({m}x{m},3x3)") for kind in kinds), kinds
        stem = f"conv2d winograd F({m}x{m},3x3) on pixel rows"
        if rows:  # (two groups of images, each transposed in and out on its own)
            assert kinds[f"{stem} input transpose"] == kinds[f"{stem} input"] == kinds[f"{stem} output transpose"] == 2
        else:
            assert not any("on pixel rows" in kind for kind in kinds), kinds


def test_winograd_weights_made_again_for_a_product_packed_another_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a Winograd conv's products are packed, its transformed weights go (ResNet-50: 90
    MB); a later binding whose products take another kernel (or sgemm, which reads them as
    they are) makes them again."""
    from metadef.backends.x86 import conv1x1, winograd
    monkeypatch.setattr(winograd, "known_choice", lambda key, names: None)
    monkeypatch.setattr(winograd, "measured_choice", lambda key, candidates: ("winograd4", "forced by the test"))
    g = _graph("""graph g(%x: f32[n,8,20,20]) -> (%y) {
      %w: f32[12,8,3,3] = const
      %y: f32[n,12,20,20] = Conv(%x, %w) {pads=[1,1,1,1]} @conv
      return %y }""")
    sess = md.compile(g, target="x86", cache=False, threads=1)
    for n, prefer in ((1, conv1x1.OWN_T), (2, conv1x1.OWN), (3, "sgemm")):
        monkeypatch.setattr(conv1x1, "PREFER", prefer)
        feeds = {"x": RNG.standard_normal((n, 8, 20, 20), dtype=np.float32)}
        want = _reference(g, feeds)["y"]
        np.testing.assert_allclose(sess.run(feeds)["y"], want, rtol=1e-4, atol=3e-5 * float(np.abs(want).max()))


def test_winograd_bindings_built_in_several_threads_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several threads binding a Winograd conv at once, each batch size's products packed
    another way (and the transformed weights dropped after each): every answer is right."""
    from metadef.backends.x86 import conv1x1, winograd
    monkeypatch.setattr(winograd, "known_choice", lambda key, names: None)
    monkeypatch.setattr(winograd, "measured_choice", lambda key, candidates: ("winograd4", "forced by the test"))
    kinds = {1: conv1x1.OWN_T, 2: conv1x1.OWN, 3: conv1x1.BLAS, 4: conv1x1.OWN_C}
    monkeypatch.setattr(conv1x1.WeightProduct, "choice", lambda self, p, bands=(), fresh=False: kinds[p // 16])
    g = _graph("""graph g(%x: f32[n,8,16,16]) -> (%y) {
      %w: f32[24,8,3,3] = const
      %y: f32[n,24,16,16] = Conv(%x, %w) {pads=[1,1,1,1]} @conv
      return %y }""")
    sess = md.compile(g, target="x86", cache=False, threads=1)
    feeds = {n: {"x": RNG.standard_normal((n, 8, 16, 16), dtype=np.float32)} for n in kinds}
    want = {n: _reference(g, f)["y"] for n, f in feeds.items()}

    def work(k: int) -> None:
        for r in range(3):
            n = 1 + (k + r) % len(kinds)
            got = sess.run(feeds[n])["y"]
            np.testing.assert_allclose(got, want[n], rtol=1e-4, atol=3e-5 * float(np.abs(want[n]).max()))

    _in_threads(work, 4)


@pytest.mark.parametrize(("limit", "refused"), [("2", "winograd F(4x4"), ("0", "winograd")])
def test_metadef_winograd_limits_the_tiles_a_conv_may_take(monkeypatch: pytest.MonkeyPatch, limit: str,
                                                           refused: str) -> None:
    """``METADEF_WINOGRAD=2`` keeps a conv off F(4x4) (whose rounding error is ~10x the direct
    conv's), ``0`` off Winograd; the choice is measured among what is left."""
    monkeypatch.setenv("METADEF_WINOGRAD", limit)
    g = _graph("""graph g(%x: f32[n,16,32,32]) -> (%y) {
      %w: f32[16,16,3,3] = const
      %y: f32[n,16,32,32] = Conv(%x, %w) {pads=[1,1,1,1]} @conv
      return %y }""")
    feeds = {"x": RNG.standard_normal((1, 16, 32, 32), dtype=np.float32)}
    sess = md.compile(g, target="x86", cache=False)
    np.testing.assert_allclose(sess.run(feeds)["y"], _reference(g, feeds)["y"], rtol=1e-4, atol=1e-4)
    kinds = [k for k in sess.executable.programs.bound({"n": 1}).call_kinds if k.startswith("conv2d")]
    assert kinds and not any(refused in k for k in kinds), kinds
    monkeypatch.setenv("METADEF_WINOGRAD", "3")
    with pytest.raises(BackendError, match="METADEF_WINOGRAD='3'"):
        md.compile(g, target="x86", cache=False)


@pytest.mark.parametrize("choice", ["winograd", "im2col"])
def test_a_3x3_conv_without_bias_reads_no_bias(monkeypatch: pytest.MonkeyPatch, choice: str) -> None:
    """A conv without a bias passes a null bias pointer: the output transform must not load
    through it (a select of the load did, and crashed the process)."""
    from metadef.backends.x86 import winograd
    monkeypatch.setattr(winograd, "known_choice", lambda key, names: None)
    monkeypatch.setattr(winograd, "measured_choice", lambda key, candidates: (choice, "forced by the test"))
    g = _graph("""graph g(%x: f32[n,8,16,16]) -> (%y) {
      %w: f32[8,8,3,3] = const
      %y: f32[n,8,16,16] = Conv(%x, %w) {pads=[1,1,1,1]} @conv
      return %y }""")
    feeds = {"x": RNG.standard_normal((2, 8, 16, 16), dtype=np.float32)}
    for threads in (1, 2):
        sess = md.compile(g, target="x86", cache=False, threads=threads)
        np.testing.assert_allclose(sess.run(feeds)["y"], _reference(g, feeds)["y"], rtol=1e-4, atol=1e-4)


def test_same_structure_other_weights_in_one_process_gets_its_own_weights() -> None:
    text = """graph g(%x: f32[n,4]) -> (%y) {
      %w: f32[4,3] = const
      %y: f32[n,3] = MatMul(%x, %w) @mm
      return %y }"""
    x = RNG.standard_normal((2, 4), dtype=np.float32)
    for _ in range(3):  # the compile cache keys these graphs alike (weights by dtype and shape)
        g = _graph(text)
        np.testing.assert_allclose(md.compile(g, target="x86").run({"x": x})["y"], x @ g.constants[0].const,
                                   rtol=1e-5)


def test_generated_kernels_split_across_threads_give_the_one_thread_answer() -> None:
    from metadef.backends.x86 import X86Backend

    g = _graph("""graph g(%x: f32[n,64,33,35], %y: f32[n,64,33,35]) -> (%z, %s) {
      %a: f32[n,64,33,35] = Mul(%x, %y) @mul
      %z: f32[n,64,33,35] = Tanh(%a) @tanh
      %s: f32[n,64,33,35] = Softmax(%z) {axis=3} @softmax
      return %z, %s }""")
    one = X86Backend().compile(g, threads=1, cache=False)
    two = X86Backend().compile(g, threads=2, cache=False)
    program = two.programs.bound({"n": 3})
    two.programs.give_back(program)
    assert program.parallel_calls >= 2 and program.threads == 2, program.describe()
    for n in (1, 3, 2):
        feeds = {"x": RNG.standard_normal((n, 64, 33, 35), dtype=np.float32),
                 "y": RNG.standard_normal((n, 64, 33, 35), dtype=np.float32)}
        want = one.run(feeds, {"n": n})
        for _ in range(20):  # the workers race for tasks: the answer must not depend on who wins
            got = two.run(feeds, {"n": n})
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_parallel_programs_from_several_threads_share_the_pool_safely() -> None:
    from metadef.backends.x86 import X86Backend

    g = _graph("""graph g(%x: f32[n,64,40,40]) -> (%z) {
      %a: f32[n,64,40,40] = Sigmoid(%x) @sig
      %z: f32[n,64,40,40] = Mul(%a, %x) @mul
      return %z }""")
    exe = X86Backend().compile(g, threads=2, cache=False)
    feeds = [{"x": RNG.standard_normal((1 + i % 2, 64, 40, 40), dtype=np.float32)} for i in range(4)]
    want = [f["x"] / (1 + np.exp(-f["x"])) for f in feeds]

    def work(k: int) -> None:
        for r in range(25):  # one thread holds the pool, the others run their groups alone
            i = (k + r) % len(feeds)
            got = exe.run(feeds[i], {"n": feeds[i]["x"].shape[0]})[0]
            np.testing.assert_allclose(got, want[i], rtol=1e-5, atol=1e-6)

    _in_threads(work, 3)


@pytest.mark.parametrize("cache", [True, False])
def test_a_declared_type_that_inference_contradicts_is_refused_before_any_code_runs(cache: bool) -> None:
    # native code trusts the declared shapes: here it would write 24 rows into a 6-row output
    g = parse_graph("""graph g(%h: f32[n,24,6], %w: f32[24,5]) -> (%z) {
      %z: f32[n,6,5] = MatMul(%h, %w) @mm
      return %z }""")
    with pytest.raises(md.GraphError, match=r"mm \(MatMul\).*K to agree"):
        md.compile(g, target="x86", cache=cache)


@pytest.mark.parametrize(("choice", "act"), [("winograd", "Relu"), ("winograd", "Clip"), ("im2col", "Relu")])
def test_a_fused_3x3_conv_and_activation_by_winograd_bounds_its_output_transform(
        monkeypatch: pytest.MonkeyPatch, choice: str, act: str) -> None:
    """Conv + Relu (or Clip) fused: Winograd applies the bounds as its output transform stores
    (no epilogue kernel); im2col puts them in our kernel's stores."""
    from metadef.backends.x86 import conv1x1, winograd
    monkeypatch.setattr(winograd, "known_choice", lambda key, names: None)
    monkeypatch.setattr(winograd, "measured_choice", lambda key, candidates: (choice, "forced by the test"))
    monkeypatch.setattr(conv1x1, "PREFER", conv1x1.OWN)
    bounds = "" if act == "Relu" else ", %lo, %hi"
    consts = "" if act == "Relu" else "%lo: f32[] = const [-0.5]\n      %hi: f32[] = const [0.75]\n      "
    g = _graph(f"""graph g(%x: f32[n,8,9,9]) -> (%z) {{
      %w: f32[12,8,3,3] = const
      %b: f32[12] = const
      {consts}%y: f32[n,12,9,9] = Conv(%x, %w, %b) {{pads=[1,1,1,1]}} @conv
      %z: f32[n,12,9,9] = {act}(%y{bounds}) @act
      return %z }}""")
    g = md.optimize(g, level="aggressive")
    feeds = {"x": RNG.standard_normal((2, 8, 9, 9), dtype=np.float32)}
    sess = md.compile(g, target="x86", cache=False)
    np.testing.assert_allclose(sess.run(feeds)["z"], _reference(g, feeds)["z"], rtol=1e-4, atol=1e-4)
    kinds = sess.executable.programs.bound({"n": 2}).call_kinds
    assert "epilogue" not in kinds, kinds
    assert any(k.startswith("conv2d winograd" if choice == "winograd" else "conv2d im2col") for k in kinds), kinds
