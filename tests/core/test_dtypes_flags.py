"""dtypes: every ONNX type numpy can hold, strict lookups, custom registration; typed flags."""

import numpy as np
import onnx
import pytest

from metadef.core import dtypes as dt
from metadef.core import flags
from metadef.core.errors import DTypeError


def test_every_numeric_onnx_type_maps_both_ways():
    for name, code in onnx.TensorProto.DataType.items():
        if name in ("UNDEFINED", "COMPLEX64", "COMPLEX128"):
            with pytest.raises(DTypeError):
                dt.from_onnx(code)
            continue
        d = dt.from_onnx(code)
        assert d.onnx == code
        assert dt.from_numpy(d.numpy) is d or d.numpy == dt.from_numpy(d.numpy).numpy


def test_names_and_short_names():
    assert dt.dtype("f32") is dt.FLOAT32 is dt.dtype("float32") is dt.dtype("float")
    assert dt.dtype("bf16").numpy.itemsize == 2
    assert dt.INT4.bits == 4 and dt.UINT4.kind == "uint"


def test_strings_are_object_arrays_of_str():
    assert dt.dtype("string") is dt.dtype("str") is dt.from_onnx(onnx.TensorProto.STRING) is dt.STRING
    assert dt.STRING.is_string and not (dt.STRING.is_float or dt.STRING.is_integer)
    assert dt.from_numpy(np.dtype(object)) is dt.from_numpy(np.dtype("<U3")) is dt.STRING
    assert dt.as_strings(np.array([b"\xc3\xa9", "a"], object)).tolist() == ["\u00e9", "a"]
    with pytest.raises(DTypeError, match=r"keys must hold strings, but element 1 is int 3"):
        dt.as_strings(np.array(["a", 3], object), "keys")
    with pytest.raises(DTypeError, match="element 0 is not valid UTF-8"):
        dt.as_strings([b"\xff"])
    with pytest.raises(DTypeError, match=r"unknown dtype 'f33'.*register_dtype"):
        dt.dtype("f33")


def test_custom_dtype_registration():
    q = dt.register_dtype("test_q8", np.int8, short="tq8")
    assert dt.dtype("tq8") is q and q.custom and q.onnx == 0
    assert dt.register_dtype("test_q8", np.int8) is q
    with pytest.raises(DTypeError, match="already registered"):
        dt.register_dtype("float32", np.float32)


def test_flags_are_typed(monkeypatch, tmp_path):
    monkeypatch.setenv("METADEF_DEBUG", "yes")
    assert flags.DEBUG.get() is True
    monkeypatch.setenv("METADEF_DEBUG", "maybe")
    with pytest.raises(ValueError, match="METADEF_DEBUG='maybe'"):
        flags.DEBUG.get()
    monkeypatch.setenv("METADEF_CACHE_DIR", str(tmp_path))
    assert flags.CACHE_DIR.get() == tmp_path
    monkeypatch.delenv("METADEF_VERIFY", raising=False)
    assert flags.VERIFY.get() is False
