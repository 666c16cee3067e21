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
    vectors with avx512f).

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
    return found


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


__all__ = ["PIPELINE", "HostTarget", "ask_llvm", "generate", "host_fingerprint", "host_target", "record_folder",
           "source_digest", "toolchain"]
