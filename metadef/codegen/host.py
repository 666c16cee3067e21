"""The host target (CPU features, vector width, triple) and the toolchain that cache keys name,
known without loading LLVM once LLVM has described this host.

LLVM's host *feature* query (never the CPU name, which LLVM may report wrongly and so lose
AVX-512 or AMX) decides what code is generated. Its answer depends only on the CPU and on the
LLVM build, so it is recorded once per host, under the compile cache's directory
(``METADEF_CACHE_DIR/hosts/<fingerprint>.json``), keyed by a fingerprint of what the kernel
reports of the CPU (``/proc/cpuinfo``: vendor, family, model, stepping, flags) and the
llvmlite version. A later process on the same host reads the record and never loads
``libllvmlite`` unless it generates code: a compile-cache hit only links stored object code
(:mod:`.link`). A missing or damaged record, or a host with no ``/proc/cpuinfo``, means asking
LLVM (and writing the record again).

``METADEF_MAX_ISA`` (``sse4.2``, ``avx``, ``avx2`` or ``avx512``) caps what generated code may use,
as oneDNN's ``ONEDNN_MAX_CPU_ISA`` and MKL's ``MKL_ENABLE_INSTRUCTIONS`` do: the features past
the level are turned off in the target's feature string (:func:`cap_features`), so the code,
the tiles and the packed layouts are the ones a CPU of that level gets, and the compile cache
keeps them apart. For code meant for an older CPU, and for running the AVX2 paths on an
AVX-512 machine (tests). It is read once a process, at the first compile. OpenBLAS picks its
own kernels (``OPENBLAS_CORETYPE=Haswell`` caps those, set before numpy is imported).

Example:
    >>> t = host_target()
    >>> t.vector_bits in (128, 256, 512), t.features.startswith(("+", "-"))
    (True, True)
    >>> sorted(toolchain())
    ['codegen', 'cpu_features', 'llvm', 'llvmlite', 'pipeline', 'triple']
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from dataclasses import asdict, dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from metadef.core import flags

PIPELINE = ("new-pm O3: loop+slp vectorize, unroll (kernels with reductions), interleave; O2 without vectorizers "
            "for hand-vectorized routines; code model jitdefault (large); linked by metadef.codegen.link")
"""What turns IR into object code here, and how it is linked; part of every compile-cache key
(change it with :mod:`.jit`'s pipeline or target machine, or :mod:`.link`)."""


@dataclass(frozen=True)
class HostTarget:
    """What LLVM knows of the host: CPU name (informative only), features, vector width,
    triple, and the LLVM version that answered.

    Example:
        >>> t = host_target()
        >>> t.has("sse2"), t.vector_bits >= 128
        (True, True)
    """

    cpu: str
    features: str
    vector_bits: int
    triple: str
    llvm: str = ""

    def has(self, feature: str) -> bool:
        """Whether the feature string enables ``feature`` (``"avx2"``, ``"avx512f"``)."""
        return f"+{feature}" in self.features.split(",")

    def capped(self, level: str) -> HostTarget:
        """This target with the features past ISA ``level`` turned off (:func:`cap_features`)
        and its vector width to match.

        Example:
            >>> t = HostTarget("znver4", "+avx2,+fma,+avx512f,+avx512vl", 512, "x86_64-unknown-linux-gnu")
            >>> t.capped("avx2").features, t.capped("avx2").vector_bits
            ('+avx2,+fma,-avx512f,-avx512vl', 256)
        """
        features = cap_features(self.features, level)
        return HostTarget(self.cpu, features, widest_vector(features), self.triple, self.llvm)


_BEYOND = {"avx512": ("amx",),
           "avx2": ("avx512", "evex512", "avx10", "avxvnni", "avxifma", "avxneconvert"),
           "avx": ("avx2", "fma"),
           "sse4.2": ("avx", "f16c", "xop", "vaes", "vpclmulqdq")}
"""Name prefixes (lower case, no ``-`` or ``_``) of the features each ISA level lacks, beyond
those the levels above it lack; every AVX-512 subset goes with ``avx512f`` (LLVM would turn
``avx512f`` back on for any one left on)."""


def beyond_isa(feature: str, level: str) -> bool:
    """Whether a CPU of ISA ``level`` (one of ``ISA_LEVELS``) lacks ``feature`` (LLVM's or
    ``/proc/cpuinfo``'s spelling).

    Example:
        >>> beyond_isa("avx512_vnni", "avx2"), beyond_isa("+avx2", "avx2"), beyond_isa("amx-tile", "avx512")
        (True, False, True)
    """
    if level not in flags.ISA_LEVELS:
        raise ValueError(f"unknown ISA level {level!r}: expected one of {', '.join(flags.ISA_LEVELS)}")
    key = feature.strip().lstrip("+-").lower().replace("-", "").replace("_", "")
    above = flags.ISA_LEVELS[flags.ISA_LEVELS.index(level):]
    return any(key.startswith(prefix) for lv in above for prefix in _BEYOND[lv])


def cap_features(features: str, level: str) -> str:
    """An LLVM feature string (``+avx2,-sse4a,...``) with every feature past ISA ``level``
    turned off, the rest as they were.

    Example:
        >>> cap_features("+sse4.2,+avx,+avx2,+fma,+avx512f,+amx-tile", "avx")
        '+sse4.2,+avx,-avx2,-fma,-avx512f,-amx-tile'
    """
    return ",".join(f"-{f[1:]}" if f.startswith("+") and beyond_isa(f, level) else f
                    for f in features.split(",") if f)


def widest_vector(features: str) -> int:
    """The widest float vector, in bits, that an LLVM feature string enables.

    Example:
        >>> widest_vector("+avx2,-avx512f"), widest_vector("+avx512f"), widest_vector("-avx")
        (256, 512, 128)
    """
    enabled = set(features.split(","))
    return 512 if "+avx512f" in enabled else 256 if "+avx2" in enabled or "+avx" in enabled else 128


def _llvmlite_version() -> str:
    try:
        return version("llvmlite")
    except PackageNotFoundError:  # pragma: no cover - llvmlite is a dependency
        return "unknown"


def host_fingerprint() -> str | None:
    """A digest of the CPU as the kernel describes it, the machine and the llvmlite version;
    None where there is no ``/proc/cpuinfo`` to read.

    Example:
        >>> fp = host_fingerprint()
        >>> fp is None or len(fp) == 16
        True
    """
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    first = text.split("\n\n", 1)[0]
    wanted = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags")
    lines = sorted(line.strip() for line in first.splitlines() if line.split(":")[0].strip() in wanted)
    if not any(line.startswith("flags") for line in lines):
        return None
    parts = [platform.machine(), _llvmlite_version(), *lines]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]


def record_folder(cache_dir: Path | None = None) -> Path:
    """Where the host records of a cache directory (default: ``METADEF_CACHE_DIR``) lie.

    Example:
        >>> record_folder(Path("/tmp/c")).as_posix()
        '/tmp/c/hosts'
    """
    return (flags.CACHE_DIR.get() if cache_dir is None else cache_dir) / "hosts"


def _record_path(fingerprint: str) -> Path:
    return record_folder() / f"{fingerprint}.json"


def _read_record(path: Path) -> HostTarget | None:
    try:
        found = json.loads(path.read_text())
        target = HostTarget(**found)
    except (OSError, ValueError, TypeError):
        return None
    ok = all(isinstance(getattr(target, f), str) for f in ("cpu", "features", "triple", "llvm"))
    return target if ok and target.vector_bits in (128, 256, 512) and target.llvm else None


def _write_record(path: Path, target: HostTarget) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".host-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(target), f)
        os.replace(tmp, path)
    except OSError:  # a read-only cache directory: ask LLVM again next time
        pass


def ask_llvm() -> HostTarget:
    """The host target as LLVM's feature query gives it (loads LLVM)."""
    from metadef.codegen import jit  # LLVM is loaded only here and where code is generated

    return jit.query_host()


def generate(ir: str, symbols: list[str], name: str, unroll: bool = True,
             vectorize: bool = True, light: bool = False) -> tuple[dict[str, int], bytes]:
    """Compile LLVM IR for the host and link it: ``({symbol: address}, object code)``; see
    :func:`metadef.codegen.jit.compile_ir` (this is the one door to LLVM for code generation:
    it loads LLVM on first use, so a process that only links cached code never does).

    Example:
        >>> import ctypes
        >>> ir = 'define i64 @inc(i64 %x) {\\n %y = add i64 %x, 1\\n ret i64 %y\\n}'
        >>> addresses, code = generate(ir, ["inc"], "doc_inc")
        >>> ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(addresses["inc"])(41), code[:4]
        (42, b'\\x7fELF')
    """
    from metadef.codegen import jit

    addresses = jit.compile_ir(ir, symbols, name, unroll=unroll, vectorize=vectorize, light=light)
    return addresses, jit.object_code(name) or b""


@cache
def host_target() -> HostTarget:
    """The host target: from this host's record if there is one, else from LLVM (512-bit
    vectors with avx512f); capped at ``METADEF_MAX_ISA`` where it is set (read once).

    Example:
        >>> host_target().triple.startswith(("x86_64", "aarch64", "arm64"))
        True
    """
    fingerprint = host_fingerprint()
    path = _record_path(fingerprint) if fingerprint else None
    found = _read_record(path) if path else None
    if found is None:
        found = ask_llvm()
        if path:
            _write_record(path, found)
    level = flags.MAX_ISA.get()
    return found if level is None else found.capped(level)


@cache
def source_digest(folder: Path | None = None) -> str:
    """A digest of the source files of ``folder`` (default: this package): any change to code
    generation (a new lowering, a fixed cast) changes every cache key, even when metadef's
    version number does not.

    Example:
        >>> len(source_digest())
        16
    """
    digest = hashlib.sha1()
    for path in sorted((folder or Path(__file__).parent).glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def toolchain() -> dict[str, str]:
    """Everything about the compiler and the host that can change object code (for cache keys).

    Example:
        >>> sorted(toolchain())
        ['codegen', 'cpu_features', 'llvm', 'llvmlite', 'pipeline', 'triple']
    """
    host = host_target()
    return {"llvmlite": _llvmlite_version(), "llvm": host.llvm, "triple": host.triple,
            "cpu_features": host.features, "pipeline": PIPELINE, "codegen": source_digest()}


__all__ = ["PIPELINE", "HostTarget", "ask_llvm", "beyond_isa", "cap_features", "generate", "host_fingerprint",
           "host_target", "record_folder", "source_digest", "toolchain", "widest_vector"]
