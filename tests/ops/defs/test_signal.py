"""Signal ops (DFT, STFT, windows, MelWeightMatrix): shapes, errors, numerics against ORT."""

from __future__ import annotations

import numpy as np
import pytest

import metadef.ops.defs.signal  # noqa: F401  (registers the family until defs/__init__ does)
from metadef.core.errors import ShapeError
from metadef.ops import get_op
from metadef.testing.onnx_cases import check_model, infer_text, one_node_model

SIGNAL_OPS = ["DFT", "STFT", "HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"]
RNG = np.random.default_rng(0)


def test_dft_shapes() -> None:
    x = "f32[batch,n,1]"
    assert infer_text("DFT", [x, None, "i64[]"], {}, [None, None, 1]) == ["f32[batch,n,2]"]
    assert infer_text("DFT", [x, None, "i64[]"], {"onesided": 1}, [None, None, -2]) == \
        ["f32[batch,floor(n/2) + 1,2]"]
    assert infer_text("DFT", ["f32[b,9,2]", "i64[]"], {"inverse": 1, "onesided": 1},
                      [None, 16, 1]) == ["f32[b,16,1]"]
    # the axis fed at run time: the signal dims are fresh, the rank and last dim are known
    assert infer_text("DFT", ["f32[b,8,2]", None, "i64[]"]) == ["f32[dft_0,dft_1,2]"]


def test_stft_window_and_mel_shapes() -> None:
    assert infer_text("STFT", ["f32[b,128,1]", "i64[]", "f32[16]"], {}, [None, 8]) == \
        ["f32[b,15,9,2]"]
    assert infer_text("STFT", ["f32[b,len,1]", "i64[]", None, "i64[]"], {"onesided": 0},
                      [None, 4, None, 8]) == ["f32[b,floor(len/4) - 1,8,2]"]
    assert infer_text("HammingWindow", ["i32[]"], {"output_datatype": 11}, [np.array(5)]) == ["f64[5]"]
    assert infer_text("BlackmanWindow", ["i64[]"]) == ["f32[window_0]"]
    assert infer_text("MelWeightMatrix", ["i64[]", "i64[]", "i64[]", "f32[]", "f32[]"], {},
                      [8, 64]) == ["f32[33,8]"]


def test_signal_errors_name_the_node() -> None:
    with pytest.raises(ShapeError, match=r"DFT \(node /node\).*last dim must be 1 \(real\) or 2"):
        infer_text("DFT", ["f32[b,8,3]"])
    with pytest.raises(ShapeError, match=r"axis 2 must name a signal dim"):
        infer_text("DFT", ["f32[b,8,2]", None, "i64[]"], {}, [None, None, 2])
    with pytest.raises(ShapeError, match=r"STFT.*signal must have rank 3"):
        infer_text("STFT", ["f32[128,1]", "i64[]"])
    with pytest.raises(ShapeError, match=r"HannWindow.*size is -3"):
        infer_text("HannWindow", ["i64[]"], {}, [np.array(-3)])
    with pytest.raises(ShapeError, match=r"MelWeightMatrix.*num_mel_bins must be a scalar"):
        infer_text("MelWeightMatrix", ["i64[2]", "i64[]", "i64[]", "f32[]", "f32[]"])


@pytest.mark.parametrize("attrs,channels,n", [({}, 1, None), ({"onesided": 1}, 1, None),
                                              ({"inverse": 1}, 2, 12), ({}, 2, 6)])
def test_dft_matches_onnxruntime(attrs: dict, channels: int, n: int | None) -> None:
    x = RNG.normal(size=(2, 10, channels)).astype(np.float32)
    consts = {"axis": np.array(1, np.int64)}
    if n is not None:
        consts["dft_length"] = np.array(n, np.int64)
    inputs = ["x", "dft_length" if n is not None else "", "axis"]
    check_model(one_node_model("DFT", {"x": x}, consts, inputs, opset=20, **attrs), {"x": x},
                rtol=1e-4, atol=1e-4)


def test_dft_opset17_axis_attribute() -> None:
    x = RNG.normal(size=(3, 8, 5, 2)).astype(np.float32)
    check_model(one_node_model("DFT", {"x": x}, {}, ["x"], opset=17, axis=2), {"x": x},
                rtol=1e-4, atol=1e-4)


def test_stft_matches_onnxruntime() -> None:
    signal = RNG.normal(size=(2, 64, 1)).astype(np.float32)
    window = np.hanning(16).astype(np.float32)
    model = one_node_model("STFT", {"signal": signal}, {"step": np.array(6, np.int64),
                                                         "window": window},
                           ["signal", "step", "window"], opset=17)
    check_model(model, {"signal": signal}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_onnxruntime_with_constant_and_fed_size(op: str, periodic: int) -> None:
    size = np.array(11, np.int64)
    check_model(one_node_model(op, {}, {"size": size}, ["size"], opset=17, periodic=periodic), {})
    check_model(one_node_model(op, {"size": size}, {}, ["size"], opset=17, periodic=periodic),
                {"size": size})


def test_window_expression_and_reference_agree() -> None:
    op = get_op("BlackmanWindow")
    attrs = {"periodic": 0, "output_datatype": 1}
    text, params = op.semantics.expression(attrs, [()], [np.array(9)])
    assert text.startswith("output[n] = 0.42") and params == {"N1": 8.0}
    ref = op.semantics.reference([np.array(9)], attrs)
    np.testing.assert_allclose(ref, np.blackman(9), atol=1e-6)


def test_mel_weight_matrix_matches_onnxruntime() -> None:
    consts = {"bins": np.array(8, np.int64), "length": np.array(64, np.int64),
              "rate": np.array(16000, np.int64), "low": np.array(100.0, np.float32),
              "high": np.array(6000.0, np.float32)}
    check_model(one_node_model("MelWeightMatrix", {}, consts, list(consts), opset=17), {})


@pytest.mark.slow
def test_signal_conformance_cases_all_pass() -> None:
    from metadef.testing.conformance import format_report, run_cases

    report = run_cases(SIGNAL_OPS)
    bad = [r for r in report.results if r.status != "pass"]
    assert not bad, format_report(report)
