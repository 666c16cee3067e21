"""Weight storage formats: float16 / bfloat16 / int8 / int4 / pruned, in the file and back."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metadef as md
from metadef.core.errors import FormatError
from metadef.format import open_mdef, save_graph
from metadef.format.quantize import (
    FLOAT16,
    INT4,
    INT8,
    PLAIN,
    SPARSE,
    decode_tensor,
    encode_tensor,
    encode_weights,
    find_weights,
    stored_nbytes,
)
from metadef.ir import parse_graph

RNG = np.random.default_rng(0)


def _round_trip(w: np.ndarray, precision: str, axis: int, prune: float | None = None) -> tuple[np.ndarray, object]:
    enc = encode_tensor(w, precision, out_axis=axis, prune=prune)
    assert stored_nbytes(w.shape, w.dtype, enc.format, enc.flags, enc.params) == len(enc.blob)
    return decode_tensor(enc.blob, w.shape, w.dtype, enc.format, enc.flags, enc.params), enc


@pytest.mark.parametrize("shape,axis", [((64, 48), 0), ((48, 64), 1), ((32, 8, 3, 3), 0), ((960, 1, 3, 3), 0),
                                        ((4, 5, 70), 2)])
def test_int8_is_per_channel_and_within_half_a_step(shape: tuple[int, ...], axis: int) -> None:
    w = RNG.standard_normal(shape).astype(np.float32)
    back, enc = _round_trip(w, "int8", axis)
    assert enc.format == INT8 and back.dtype == np.float32 and back.shape == shape
    scale = np.abs(np.moveaxis(w, axis, 0).reshape(shape[axis], -1)).max(1) / 127
    err = np.abs(np.moveaxis(back - w, axis, 0).reshape(shape[axis], -1)).max(1)
    assert np.all(err <= scale / 2 * 1.0001 + 1e-9)
    assert len(enc.blob) == w.size + 4 * shape[axis] + (-(4 * shape[axis]) % 8)


@pytest.mark.parametrize("shape,axis", [((64, 48), 0), ((48, 64), 1), ((32, 8, 3, 3), 0), ((4, 5, 70), 2)])
def test_int4_is_blockwise_along_the_reduction_axis(shape: tuple[int, ...], axis: int) -> None:
    w = RNG.standard_normal(shape).astype(np.float32)
    back, enc = _round_trip(w, "int4", axis)
    assert enc.format == INT4 and enc.quantization["block"] == 32
    rows = np.moveaxis(w, axis, 0).reshape(shape[axis], -1)
    red = rows.shape[1]
    pad = np.zeros((rows.shape[0], -(-red // 32) * 32), np.float32)
    pad[:, :red] = rows
    scale = np.abs(pad.reshape(rows.shape[0], -1, 32)).max(2) / 7
    err = np.abs(np.moveaxis(back - w, axis, 0).reshape(shape[axis], -1))
    bound = np.repeat(scale, 32, axis=1)[:, :red] * 0.5 * 1.001 + 1e-3 * np.repeat(scale, 32, axis=1)[:, :red]
    assert np.all(err <= bound + 1e-7)
    assert len(enc.blob) / w.nbytes < 0.16


def test_float_casts_and_never_upcasting() -> None:
    w = RNG.standard_normal((40, 40)).astype(np.float32)
    back, enc = _round_trip(w, "float16", 0)
    assert enc.format == FLOAT16 and np.array_equal(back, w.astype(np.float16).astype(np.float32))
    back, enc = _round_trip(w, "bf16", 0)
    assert np.array_equal(back, w.astype(ml_dtypes.bfloat16).astype(np.float32))
    for keep in ("fp32", "fp64"):
        assert encode_tensor(w, keep, out_axis=0).format == PLAIN
    w64 = w.astype(np.float64)
    back, enc = _round_trip(w64, "fp32", 0)
    assert back.dtype == np.float64 and np.array_equal(back, w.astype(np.float64))
    with pytest.raises(FormatError, match="float16's range"):
        encode_tensor(np.full((40, 40), 1e6, np.float32), "fp16", out_axis=0)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8", "int4"])
def test_pruning_zeroes_small_weights_and_stores_a_bitmap(precision: str) -> None:
    w = RNG.standard_normal((128, 64)).astype(np.float32)
    back, enc = _round_trip(w, precision, 0, prune=1.5)  # ~87% of |w| < 1.5
    assert enc.flags & SPARSE and enc.quantization["sparse"]["nnz"] < w.size * 0.2
    assert np.all(back[np.abs(w) < 1.5] == 0)
    dense = encode_tensor(w, precision, out_axis=0)
    assert len(enc.blob) < len(dense.blob) if dense.format != PLAIN else len(enc.blob) < w.nbytes


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 80), axis=st.integers(0, 1),
       precision=st.sampled_from(["fp16", "bf16", "int8", "int4"]), prune=st.sampled_from([None, 0.0, 0.5]))
def test_any_shape_round_trips_to_its_dtype_and_shape(rows: int, cols: int, axis: int, precision: str,
                                                      prune: float | None) -> None:
    w = np.random.default_rng(rows * 100 + cols).standard_normal((rows, cols)).astype(np.float32)
    back, _enc = _round_trip(w, precision, axis, prune)
    assert back.shape == w.shape and back.dtype == w.dtype and not back.flags.writeable
    tolerance = {"fp16": 1e-3, "bf16": 1e-2, "int8": 1e-2, "int4": 0.2}[precision]
    assert np.abs(back - np.where(np.abs(w) < (prune or 0), 0, w)).max() <= tolerance * np.abs(w).max() + 1e-6


def test_bad_parameters_are_format_errors() -> None:
    shape, f32 = (64, 32), np.dtype(np.float32)
    good = {"quantization": {"scheme": "int4", "axis": 0, "block": 32, "scale_dtype": "float16"}}
    assert stored_nbytes(shape, f32, INT4, 0, good) == 64 * 2 + 64 * 16
    bad = [(INT4, 0, {"quantization": {**good["quantization"], "axis": 2}}),
           (INT4, 0, {"quantization": {**good["quantization"], "block": 0}}),
           (INT4, 0, {"quantization": {**good["quantization"], "scale_dtype": "int8"}}),
           (INT8, 0, good), (INT4, 0, None), (9, 0, good), (INT4, 4, good),
           (INT4, SPARSE, {"quantization": {**good["quantization"], "sparse": {"nnz": 10**9}}}),
           (INT4, SPARSE, {"quantization": {**good["quantization"], "sparse": {"nnz": "3"}}})]
    for fmt, flags, params in bad:
        with pytest.raises(FormatError):
            stored_nbytes(shape, f32, fmt, flags, params)


GRAPH = """graph g(%x: f32[n,64], %img: f32[n,8,16,16]) -> (%y, %c, %e) {
  %w: f32[64,32] = const
  %wt: f32[32,64] = const
  %b: f32[32] = const
  %k: f32[32,8,3,3] = const
  %small: f32[4,8] = const
  %emb: f32[100,32] = const
  %ids: i64[3] = const [1, 2, 3]
  %m: f32[n,32] = MatMul(%x, %w) @mm
  %g: f32[n,32] = Gemm(%x, %wt, %b) {transB=1} @gemm
  %s: f32[n,32] = Add(%m, %g) @add
  %y: f32[n,32] = Add(%s, %b) @bias
  %c: f32[n,32,14,14] = Conv(%img, %k) @conv1
  %e: f32[3,32] = Gather(%emb, %ids) @embed
  %unused: f32[4,8] = Relu(%small) @small_relu
  return %y, %c, %e
}"""


def _graph():
    shapes = {"w": (64, 32), "wt": (32, 64), "b": (32,), "k": (32, 8, 3, 3), "small": (4, 8), "emb": (100, 32)}
    return parse_graph(GRAPH, {k: RNG.standard_normal(s).astype(np.float32) for k, s in shapes.items()})


def test_weights_and_their_output_axis_come_from_how_the_graph_reads_them() -> None:
    found = {w.value.name: (w.out_axis, [n.name for n in w.readers]) for w in find_weights(_graph())}
    assert found == {"w": (1, ["mm"]), "wt": (0, ["gemm"]), "k": (0, ["conv1"]), "emb": (0, ["embed"])}


def test_quantized_file_dequantizes_lazily_and_runs(tmp_path: Path) -> None:
    graph = md.import_onnx(md.zoo.build("mlp"))
    plain = save_graph(graph, tmp_path / "f32.mdef")
    feeds = md.zoo.describe("mlp").example_inputs(batch=4)
    expected = md.compile(graph).run(feeds)["probs"]
    for scheme, ratio, tol in [("float16", 0.51, 1e-3), ("int8", 0.26, 1e-2), ("int4", 0.15, 0.1)]:
        path = md.save(graph, tmp_path / f"{scheme}.mdef", quantize=scheme)
        assert path.stat().st_size / plain.stat().st_size < ratio
        f = open_mdef(path, checksum_verify="always")
        assert f.verify().ok and not f._views  # nothing dequantized yet
        info = f.tensor_info("fc1.weight")
        assert info.quantization["scheme"] == scheme and info.quantization["node"] == "/fc1/Gemm"
        assert f.tensor_info("fc1.bias").format == PLAIN  # biases stay float32
        assert f.tensor("fc1.weight").dtype == np.float32 and len(f._views) == 1
        got = md.compile(f.graph()).run(feeds)["probs"]
        np.testing.assert_allclose(got, expected, atol=tol)


def test_saving_a_loaded_quantized_graph_writes_plain_tensors(tmp_path: Path) -> None:
    path = md.save(md.import_onnx(md.zoo.build("mlp")), tmp_path / "q.mdef", quantize="int8")
    f = open_mdef(path)
    again = open_mdef(save_graph(f.graph(), tmp_path / "again.mdef", metadata=f.user_metadata()))
    assert "tensors" not in again.layers["parameters"] or not again.layers["parameters"]["tensors"]
    assert all(again.tensor_info(n).format == PLAIN for n in again.tensor_names())
    np.testing.assert_array_equal(again.tensor("fc1.weight"), f.tensor("fc1.weight"))


def test_encode_weights_reports_each_weight_and_refuses_a_bad_threshold() -> None:
    seen = []
    out = encode_weights(_graph(), quantize="int8", on_tensor=lambda w, e: seen.append(w.value.name))
    assert sorted(out) == sorted(seen) == ["emb", "k", "w", "wt"]
    with pytest.raises(FormatError, match="prune"):
        encode_weights(_graph(), prune=-1.0)


_FUZZ_CACHE: dict[str, bytes] = {}


def _quantized_bytes(tmp: Path) -> bytes:
    if "q" not in _FUZZ_CACHE:
        graph = parse_graph(GRAPH.replace("%emb: f32[100,32]", "%emb: f32[100,32]"), {
            k: np.random.default_rng(1).standard_normal(s).astype(np.float32) for k, s in
            {"w": (64, 32), "wt": (32, 64), "b": (32,), "k": (32, 8, 3, 3), "small": (4, 8), "emb": (100, 32)}.items()})
        path = md.save(graph, tmp / "fuzz.mdef", precision={"mm": "int4", "gemm": "int8", "conv1": "fp16"}, prune=0.5)
        _FUZZ_CACHE["q"] = path.read_bytes()
    return _FUZZ_CACHE["q"]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_damaged_quantized_files_give_typed_errors_only(data: st.DataObject, tmp_path_factory) -> None:
    raw = bytearray(_quantized_bytes(tmp_path_factory.mktemp("q")))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    path = tmp_path_factory.mktemp("f") / "x.mdef"
    path.write_bytes(bytes(raw))
    try:
        f = open_mdef(path, checksum_verify="never")
        for name in f.tensor_names():
            f.tensor(name)
    except FormatError:
        pass
