"""x86: a pointwise conv's pixel-rows form where its product on pixel rows outruns its NCHW winner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from metadef.backends.x86 import conv1x1, native, pointwise
from metadef.backends.x86.conv1x1 import BLAS, OWN_T, WeightProduct
from metadef.backends.x86.native import NULL, Arg, NativeStep

pytestmark = pytest.mark.jit


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No remembered choices (in this process or on disk)."""
    monkeypatch.setenv("METADEF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_CONV_CHOICES", {})


def _product(cin: int = 64, cout: int = 96, residual: bool = False) -> WeightProduct:
    w = np.random.default_rng(0).standard_normal((cout, cin, 1, 1), dtype=np.float32)
    return WeightProduct(w, np.zeros(cout, np.float32), NULL, residual, (0.0, 6.0))


def test_the_race_is_run_once_a_shape_and_remembered(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    product = _product(residual=True)
    first = pointwise.rows_pay(product, BLAS, 49)
    assert isinstance(first, bool)
    monkeypatch.setattr(pointwise, "measured_choice", lambda *a, **k: pytest.fail("raced again"))
    assert pointwise.rows_pay(product, BLAS, 49) == first
    monkeypatch.setattr(native, "_CONV_CHOICES", {})  # (a new process: the compile cache's shape level)
    assert pointwise.rows_pay(product, BLAS, 49) == first


def test_the_margin_decides_the_race(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pointwise, "PIXEL_ROWS_MARGIN", 1e-3)  # (any product on pixel rows wins)
    assert pointwise.rows_pay(_product(), BLAS, 49)
    monkeypatch.setattr(pointwise, "PIXEL_ROWS_MARGIN", 1e3)
    assert not pointwise.rows_pay(_product(cin=32), BLAS, 49)


@pytest.mark.parametrize("pays", [True, False])
def test_a_conv_whose_blas_won_offers_the_form_where_pixel_rows_pay(pays: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conv1x1, "PREFER", BLAS)
    monkeypatch.setattr(pointwise, "rows_pay", lambda product, kind, p: pays)
    base = NativeStep(())
    x, out = Arg("in", 0), Arg("out", 0)
    step = pointwise.conv1x1_step(_product(), x, None, out, (1, 64, 7, 7), lambda: base)
    if not pays:
        assert step is None  # (the caller lowers it as before)
        return
    assert step is not None and step.rows is not None and step.calls == ()
    assert step.rows.lower(frozenset()) is base
    rows = step.rows.lower(frozenset({("in", 0), ("out", 0)}))
    assert [c.what for c in rows.calls] == ["conv2d 1x1 own kernel, pixel rows stored + epilogue"]
    cost = step.rows.cost
    assert cost is not None and cost(frozenset()) == 1 and cost(frozenset({("in", 0), ("out", 0)})) == 0
    monkeypatch.setattr(pointwise, "ENABLED", False)
    assert pointwise.conv1x1_step(_product(), x, None, out, (1, 64, 7, 7), lambda: base) is None


def test_a_conv_that_transposes_keeps_its_form_and_its_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conv1x1, "PREFER", OWN_T)
    step = pointwise.conv1x1_step(_product(), Arg("in", 0), Arg("in", 1), Arg("out", 0), (1, 64, 7, 7))
    assert step is not None and step.rows is not None and step.rows.cost is None  # (a transpose a read)
    assert step.rows.residual == 1
    assert [c.what for c in step.calls] == ["conv2d 1x1 transpose", "conv2d 1x1 own kernel, pixel rows + epilogue"]
