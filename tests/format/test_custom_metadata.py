"""Custom metadata classes: registered namespaces round-trip to instances, others to dicts."""

from __future__ import annotations

from dataclasses import field
from pathlib import Path

import pytest

import metadef as md
from metadef.format.custom_metadata import (
    BaseMetadata,
    MetadataError,
    decode_namespace,
    encode_namespaces,
    read_namespace,
    register_metadata_type,
)
from metadef.runtime.model import Model


class TrainingInfo(BaseMetadata):
    dataset: str
    epochs: int = 1
    classes: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


register_metadata_type("tests_app/v1", TrainingInfo, replace=True)


def test_a_registered_namespace_round_trips_to_an_instance(tmp_path: Path) -> None:
    info = TrainingInfo("imagenet-mini", epochs=3, classes=["cat", "dog"], extra={"lr": 0.1, "tags": [None]})
    path = md.save(md.import_onnx(md.zoo.build("mlp")), tmp_path / "m.mdef",
                   metadata={"namespaces": {"tests_app/v1": info, "someone_else/v2": {"k": [1, 2]}},
                             "auxiliary": {"labels": ["a"]}})
    model = md.load(path)
    namespaces = model.metadata["namespaces"]
    assert read_namespace(namespaces, "tests_app/v1") == info
    assert read_namespace(namespaces, "someone_else/v2") == {"k": [1, 2]}
    assert model.metadata["auxiliary"]["labels"] == ["a"]
    with pytest.raises(KeyError, match="no metadata namespace 'nope/v1'; the file has 'someone_else/v2'"):
        read_namespace(namespaces, "nope/v1")
    if hasattr(Model, "namespace"):  # wired by the lead: Model.namespace(name)
        assert model.namespace("tests_app/v1") == info


def test_fields_must_be_json() -> None:
    with pytest.raises(MetadataError, match=r"TrainingInfo.extra = .* is not JSON-able"):
        TrainingInfo("x", extra={"f": object()}).to_dict()
    with pytest.raises(MetadataError, match=r"TrainingInfo\.epochs"):
        TrainingInfo("x", epochs=float("nan")).to_dict()  # type: ignore[arg-type]


def test_from_dict_names_unknown_and_missing_fields() -> None:
    with pytest.raises(MetadataError, match=r"namespace 'tests_app/v1': TrainingInfo has no field\(s\) 'lr'"):
        decode_namespace("tests_app/v1", {"dataset": "d", "lr": 1})
    with pytest.raises(MetadataError, match=r"needs field\(s\) 'dataset'"):
        TrainingInfo.from_dict({"epochs": 2})


def test_registration_rules() -> None:
    class Other(BaseMetadata):
        x: int = 0

    with pytest.raises(MetadataError, match="already registered to TrainingInfo"):
        register_metadata_type("tests_app/v1", Other)
    with pytest.raises(MetadataError, match=r"must derive from metadef\.BaseMetadata"):
        register_metadata_type("tests_app/v9", dict)  # type: ignore[arg-type]
    with pytest.raises(MetadataError, match=r"registered to TrainingInfo, but a .*Other was given"):
        encode_namespaces({"tests_app/v1": Other()})
    assert encode_namespaces({"free/v1": Other(2)}) == {"free/v1": {"x": 2}}


def test_an_explicit_dataclass_decorator_is_harmless() -> None:
    from dataclasses import dataclass

    @dataclass
    class Decorated(BaseMetadata):
        name: str
        items: list = field(default_factory=list)

    assert Decorated.from_dict({"name": "n"}) == Decorated("n", [])
    assert Decorated("n", [1]).to_dict() == {"name": "n", "items": [1]}
