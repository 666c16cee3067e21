"""Loader configuration in YAML: validation that names the key, and what load does with it."""

from __future__ import annotations

from pathlib import Path

import pytest

import metadef as md
from metadef.format import ChecksumError
from metadef.runtime.loader_config import LoaderConfig, LoaderConfigError, as_loader_config, parse_size

FULL = """
execution:
  parallel_parse: false
  max_threads: 4
memory:
  mmap_enabled: false
  prefetch_buffer: 64MiB
safety:
  checksum_verify: always
  version_strict: false
"""


def test_every_key_parses() -> None:
    cfg = LoaderConfig.from_yaml(FULL)
    assert cfg == LoaderConfig(parallel_parse=False, max_threads=4, mmap_enabled=False, prefetch_buffer=64 * 2**20,
                               checksum_verify="always", version_strict=False)
    assert LoaderConfig.from_dict(cfg.to_dict()) == cfg
    assert LoaderConfig.from_yaml("") == LoaderConfig() and LoaderConfig().threads >= 1


@pytest.mark.parametrize("doc,match", [
    ({"memory": {"mmap_enable": True}}, r"unknown key 'memory.mmap_enable' \(did you mean 'memory.mmap_enabled'\?\); "
                                        r"the keys of 'memory' are mmap_enabled, prefetch_buffer"),
    ({"safty": {}}, r"unknown key 'safty' \(did you mean 'safety'\?\); the sections are execution, memory, safety"),
    ({"safety": {"checksum_verify": "sometimes"}},
     r"safety.checksum_verify must be one of always, on_demand, never, got 'sometimes'"),
    ({"safety": {"version_strict": "yes please"}}, r"safety.version_strict must be true or false"),
    ({"execution": {"max_threads": 0}}, r"execution.max_threads must be an integer from 1 to 1024 or \"auto\""),
    ({"execution": {"max_threads": True}}, r"execution.max_threads"),
    ({"memory": {"prefetch_buffer": "lots"}}, r"memory.prefetch_buffer must be a size such as 256MB"),
    ({"memory": 5}, r"memory must be a mapping of mmap_enabled, prefetch_buffer"),
    ([1, 2], r"must be a mapping with sections"),
])
def test_errors_name_the_key_and_what_it_allows(doc: object, match: str) -> None:
    with pytest.raises(LoaderConfigError, match=match):
        LoaderConfig.from_dict(doc)


def test_sizes() -> None:
    assert [parse_size(s) for s in ("256MB", "1GiB", "1.5kb", "100", 0)] == [256 * 10**6, 2**30, 1500, 100, 0]
    with pytest.raises(LoaderConfigError):
        parse_size(-1)


def test_load_takes_a_config_object_dict_or_yaml_path(tmp_path: Path) -> None:
    path = md.save(md.import_onnx(md.zoo.build("mlp")), tmp_path / "m.mdef")
    yaml_path = tmp_path / "loader.yaml"
    yaml_path.write_text(FULL)
    for config in (yaml_path, str(yaml_path), LoaderConfig.from_yaml(FULL), {"memory": {"mmap_enabled": False}}):
        assert not md.load(path, config=config).file.mmapped
    assert md.load(path, config={"memory": {"mmap_enabled": False}}, mmap_enabled=True).file.mmapped
    with pytest.raises(LoaderConfigError, match="cannot read loader config"):
        as_loader_config(tmp_path / "missing.yaml")


def test_checksum_verify_always_from_the_config_catches_a_bit_flip(tmp_path: Path) -> None:
    path = md.save(md.import_onnx(md.zoo.build("mlp")), tmp_path / "m.mdef")
    with md.load(path) as model:
        offset = model.file.tensor_info("fc2.weight").offset + 100
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    md.load(path)  # on_demand: opens; the tensor is checked when first used
    with pytest.raises(ChecksumError, match=r"fc2\.weight"):
        md.load(path, config={"safety": {"checksum_verify": "always"}})
