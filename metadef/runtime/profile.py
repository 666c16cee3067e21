"""Device profiles: what this machine offers (CPU, ISA features, cores, memory, NVIDIA GPUs),
and choosing among precision variants of one model by their hardware-requirements layer.

The ISA features are the union of two readings: the ``flags`` line of ``/proc/cpuinfo`` and
LLVM's host *feature* query (:func:`metadef.codegen.jit.host_target`). The CPU *name* LLVM
reports can be wrong (an unknown model reads as an older one, hiding AVX-512 or AMX), so it is
informative only; features are spelled as ``/proc/cpuinfo`` spells them (``avx512f``,
``avx512_vnni``, ``avx_vnni``, ``amx_tile``, ``f16c``), and LLVM's spellings (``avx512vnni``,
``amx-tile``) are accepted wherever a feature is named.

Example:
    >>> p = DeviceProfile(cpu_name="Example CPU", vendor="GenuineIntel",
    ...                   features=frozenset({"avx2", "fma", "f16c", "avx512f", "avx512_vnni"}))
    >>> p.supports("avx512-vnni"), p.supports("amx"), p.best_precision()
    (True, False, 'int8')
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metadef.codegen.host import beyond_isa, host_target
from metadef.core import flags
from metadef.core.errors import InputError
from metadef.format import open_mdef

FEATURE_ALIASES = {
    "avx512": "avx512f", "amx": "amx_tile", "sse4.1": "sse4_1", "sse4.2": "sse4_2",
    "avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni", "avx512fp16": "avx512_fp16",
    "avx512bf16": "avx512_bf16", "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512vbmi2": "avx512_vbmi2", "avx512vp2intersect": "avx512_vp2intersect",
    "avxvnniint8": "avx_vnni_int8", "amxfp16": "amx_fp16", "amxtile": "amx_tile", "amxint8": "amx_int8",
    "amxbf16": "amx_bf16", "sha": "sha_ni", "pclmul": "pclmulqdq", "rdrnd": "rdrand",
}
"""LLVM's (and a few people's) spellings of a feature -> the ``/proc/cpuinfo`` spelling."""

ANY_OF = {"vnni": ("avx512_vnni", "avx_vnni")}
"""Requirements that any one of several features satisfies."""

DEVICE_ALIASES = {"gpu": "cuda", "nvidia": "cuda", "x86": "cpu"}
"""Other names of the devices a profile lists (``cpu``, ``cuda``)."""

PRECISIONS = ("int8", "float16", "bfloat16", "float32")
"""Precision classes of a model variant, in the order they are preferred where they run fast."""

FAST_PRECISION = {
    "int8": ("avx512_vnni", "avx_vnni", "amx_int8"),
    "bfloat16": ("avx512_bf16", "amx_bf16"),
}
"""The CPU features that make a precision fast (any one of them); float16 has its own rule."""

WEIGHT_PRECISION = {"int8": "int8", "int4": "int4", "float16": "float16", "bfloat16": "bfloat16",
                    "float32": "float32", "float64": "float32", "plain": "float32"}
"""A stored weight format (``hardware.weight_formats`` / a tensor's quantization scheme) -> the
precision class of a variant."""


def normalize_feature(name: str) -> str:
    """A feature name as ``/proc/cpuinfo`` spells it.

    Example:
        >>> normalize_feature("+AVX512VNNI"), normalize_feature("amx-tile"), normalize_feature("avx2")
        ('avx512_vnni', 'amx_tile', 'avx2')
    """
    key = name.strip().lstrip("+").lower()
    key = FEATURE_ALIASES.get(key, key)
    return FEATURE_ALIASES.get(key.replace("-", "").replace("_", ""), key.replace("-", "_"))


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as the driver reports it."""

    name: str
    memory_bytes: int


@dataclass(frozen=True)
class DeviceProfile:
    """What one machine offers; :meth:`detect` reads it, tests build one by hand.

    Example:
        >>> p = DeviceProfile.detect()
        >>> p.logical_cores >= p.physical_cores >= 1, p.best_precision() in PRECISIONS
        (True, True)
    """

    cpu_name: str = "unknown"
    vendor: str = "unknown"
    features: frozenset[str] = frozenset()
    logical_cores: int = 1
    physical_cores: int = 1
    memory_bytes: int = 0
    gpus: tuple[GpuInfo, ...] = ()
    llvm_cpu: str = ""
    """The CPU name LLVM reports (informative only: it may be wrong)."""
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    """Which reading found which features (``cpuinfo``, ``llvm``), for diagnosis."""

    @classmethod
    def detect(cls) -> DeviceProfile:
        """Read this machine: ``/proc/cpuinfo``, LLVM's host features, ``/proc/meminfo``, and
        ``nvidia-smi`` when it is installed; the CPU features capped at ``METADEF_MAX_ISA``
        where it is set (what generated code may use)."""
        info = _cpuinfo()
        level = flags.MAX_ISA.get()  # (what generated code may use: METADEF_MAX_ISA caps the CPU's own)
        from_cpuinfo = frozenset(normalize_feature(f) for f in info.get("flags", "").split()
                                 if level is None or not beyond_isa(f, level))
        host = host_target()
        from_llvm = frozenset(normalize_feature(f) for f in host.features.split(",") if f.startswith("+"))
        return cls(cpu_name=info.get("model name", "unknown"), vendor=info.get("vendor_id", "unknown"),
                   features=from_cpuinfo | from_llvm, logical_cores=os.cpu_count() or 1,
                   physical_cores=_physical_cores(), memory_bytes=_memory_bytes(), gpus=_nvidia_gpus(),
                   llvm_cpu=host.cpu, sources={"cpuinfo": tuple(sorted(from_cpuinfo)),
                                               "llvm": tuple(sorted(from_llvm))})

    @property
    def devices(self) -> tuple[str, ...]:
        """``("cpu",)``, plus ``"cuda"`` with an NVIDIA GPU."""
        return ("cpu", "cuda") if self.gpus else ("cpu",)

    def has(self, feature: str) -> bool:
        """Whether the CPU has ``feature`` (any spelling; ``vnni``: either VNNI)."""
        key = feature.strip().lower()
        if key in ANY_OF:
            return any(self.has(f) for f in ANY_OF[key])
        return normalize_feature(key) in self.features

    def has_device(self, device: str) -> bool:
        """Whether the machine has ``device`` (``cpu``; ``cuda`` or ``gpu``: an NVIDIA GPU)."""
        key = device.strip().lower()
        return DEVICE_ALIASES.get(key, key) in self.devices

    def supports(self, requirement: str | Iterable[str] | Mapping[str, Any]) -> bool:
        """Whether this machine meets ``requirement``: a feature or device name, several of
        them (all needed), or a file's hardware layer (``cpu_features``, ``devices``,
        ``min_memory_bytes``).

        Example:
            >>> p = DeviceProfile(features=frozenset({"avx2", "fma"}), memory_bytes=2**30)
            >>> p.supports(["avx2", "fma"]), p.supports({"cpu_features": ["avx512f"], "devices": ["cpu"]})
            (True, False)
        """
        return not self.missing(requirement)

    def missing(self, requirement: str | Iterable[str] | Mapping[str, Any]) -> list[str]:
        """What of ``requirement`` this machine lacks, in words (empty: it supports it all)."""
        if isinstance(requirement, Mapping):
            lacks = self.missing(requirement.get("cpu_features") or ())
            devices = [str(d).lower() for d in requirement.get("devices") or ()]
            if devices and not any(self.has_device(d) for d in devices):
                lacks.append(f"a device of {devices} (this machine: {list(self.devices)})")
            need = requirement.get("min_memory_bytes") or 0
            if self.memory_bytes and need > self.memory_bytes:
                lacks.append(f"{need} bytes of memory (this machine: {self.memory_bytes})")
            return lacks
        names = [requirement] if isinstance(requirement, str) else list(requirement)
        return [n for n in names if not (self.has(n) or self.has_device(n))]

    def runs_fast(self, precision: str) -> bool:
        """Whether the hardware computes ``precision`` natively (see :meth:`best_precision`)."""
        if precision == "float32":
            return True
        if precision == "float16":
            return bool(self.gpus) or self.has("amx_fp16") or (self.has("f16c") and self.has("avx512_fp16"))
        return any(self.has(f) for f in FAST_PRECISION.get(precision, ()))

    def preferred_precisions(self) -> list[str]:
        """The precisions this machine runs fast, best first; ``float32`` always last."""
        return [p for p in PRECISIONS if self.runs_fast(p)]

    def best_precision(self) -> str:
        """The precision to deploy here: ``int8`` with VNNI (AVX-512 or AVX) or AMX-INT8;
        else ``float16`` with an NVIDIA GPU, AMX-FP16, or F16C together with AVX-512-FP16;
        else ``bfloat16`` with AVX-512-BF16 or AMX-BF16; else ``float32``.

        Example:
            >>> DeviceProfile(features=frozenset({"avx2", "f16c"})).best_precision()
            'float32'
            >>> DeviceProfile(features=frozenset({"f16c", "avx512f", "avx512_fp16"})).best_precision()
            'float16'
        """
        return self.preferred_precisions()[0]

    def to_dict(self) -> dict[str, Any]:
        """The profile as JSON-able data.

        Example:
            >>> DeviceProfile(features=frozenset({"fma", "avx2"})).to_dict()["features"]
            ['avx2', 'fma']
        """
        return {"cpu_name": self.cpu_name, "vendor": self.vendor, "features": sorted(self.features),
                "logical_cores": self.logical_cores, "physical_cores": self.physical_cores,
                "memory_bytes": self.memory_bytes, "llvm_cpu": self.llvm_cpu,
                "gpus": [{"name": g.name, "memory_bytes": g.memory_bytes} for g in self.gpus],
                "devices": list(self.devices), "best_precision": self.best_precision()}


def _cpuinfo() -> dict[str, str]:
    """The first processor's ``key: value`` lines of ``/proc/cpuinfo`` (empty off Linux)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                out[key.strip()] = value.strip()
    except OSError:
        pass
    return out


def _physical_cores() -> int:
    """Distinct (physical id, core id) pairs of ``/proc/cpuinfo``; the logical count without them."""
    cores: set[tuple[str, str]] = set()
    package = core = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "physical id":
                    package = value.strip()
                elif key.strip() == "core id":
                    core = value.strip()
                    cores.add((package, core))
    except OSError:
        pass
    return len(cores) or os.cpu_count() or 1


def _memory_bytes() -> int:
    """``MemTotal`` of ``/proc/meminfo`` in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _nvidia_gpus() -> tuple[GpuInfo, ...]:
    """The GPUs ``nvidia-smi`` lists (none when it is missing or fails)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        done = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(gpu for line in done.stdout.splitlines() if (gpu := parse_gpu_line(line)) is not None)


def parse_gpu_line(line: str) -> GpuInfo | None:
    """One line of ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader[,nounits]``.

    Example:
        >>> parse_gpu_line("NVIDIA H200, 143771 MiB")
        GpuInfo(name='NVIDIA H200', memory_bytes=150754820096)
    """
    name, _, memory = line.rpartition(",")
    number = memory.strip().split(" ")[0]
    if not name.strip() or not number.isdigit():
        return None
    return GpuInfo(name.strip(), int(number) * 2**20)


# ----------------------------------------------------------------------- choosing a variant


@dataclass(frozen=True)
class Variant:
    """One .mdef file of a model as :func:`choose_variant` sees it: its precision class, its
    hardware layer, and what a profile lacks to run it (empty: it runs)."""

    path: Path
    precision: str
    hardware: Mapping[str, Any]
    missing: tuple[str, ...] = ()


def variant_precision(layers: Mapping[str, Any]) -> str:
    """A file's precision class from its layers: the lowest precision among its stored weight
    formats (``hardware.weight_formats``; for files written before the writer recorded them,
    the parameter layer's quantization schemes), else ``float32``.

    Example:
        >>> variant_precision({"hardware": {"weight_formats": ["float16", "int8"]}})
        'int8'
        >>> variant_precision({"hardware": {},
        ...                    "parameters": {"tensors": {"w": {"quantization": {"scheme": "bfloat16"}}}}})
        'bfloat16'
    """
    formats = layers["hardware"].get("weight_formats")
    if formats is None:
        tensors = layers.get("parameters", {}).get("tensors", {})
        formats = [(t.get("quantization") or {}).get("scheme") for t in tensors.values() if isinstance(t, Mapping)]
    order = ("int4", *PRECISIONS)
    classes = {WEIGHT_PRECISION[f] for f in formats if f in WEIGHT_PRECISION}
    return min(classes, key=order.index) if classes else "float32"


def read_variant(path: str | os.PathLike[str], profile: DeviceProfile) -> Variant:
    """Read one file's hardware layer (the file is opened, its layers read, and closed)."""
    with open_mdef(path) as f:
        layers = f.layers
        return Variant(Path(path), variant_precision(layers), dict(layers["hardware"]),
                       tuple(profile.missing(layers["hardware"])))


def choose_variant(paths: Sequence[str | os.PathLike[str]], profile: DeviceProfile | None = None) -> Variant:
    """The variant of one model (its .mdef files in several precisions) to run on ``profile``
    (default: this machine): among the files whose hardware layer the profile supports, the
    one whose precision comes first in ``profile.preferred_precisions()``; precisions the
    machine does not run fast come after float32; ties go to the earlier path. Raises
    InputError when the profile supports none.

    Example:
        >>> import tempfile, pathlib, metadef as md
        >>> d, g = pathlib.Path(tempfile.mkdtemp()), md.import_onnx(md.zoo.build("mlp"))
        >>> fp32 = md.save(g, d / "fp32.mdef")
        >>> int8 = md.save(g, d / "int8.mdef", quantize="int8",
        ...                metadata={"hardware": {"cpu_features": ["avx512_vnni"]}})
        >>> choose_variant([int8, fp32], DeviceProfile(features=frozenset({"avx2"}))).path.name
        'fp32.mdef'
        >>> choose_variant([int8, fp32], DeviceProfile(features=frozenset({"avx512_vnni"}))).precision
        'int8'
    """
    if not paths:
        raise InputError("choose among no files: give the .mdef paths of the model's variants")
    profile = profile or DeviceProfile.detect()
    variants = [read_variant(p, profile) for p in paths]
    runnable = [v for v in variants if not v.missing]
    if not runnable:
        lines = [f"  {v.path} ({v.precision}) needs {', '.join(v.missing)}" for v in variants]
        raise InputError(f"no variant runs on this machine ({profile.cpu_name}, features "
                         f"{', '.join(sorted(profile.features)) or 'none'}):\n" + "\n".join(lines))
    preferred = profile.preferred_precisions()

    def rank(v: Variant) -> int:
        return preferred.index(v.precision) if v.precision in preferred else len(preferred)

    return min(runnable, key=rank)


__all__ = ["ANY_OF", "DEVICE_ALIASES", "FEATURE_ALIASES", "PRECISIONS", "DeviceProfile", "GpuInfo", "Variant",
           "choose_variant", "normalize_feature", "parse_gpu_line", "read_variant", "variant_precision"]
