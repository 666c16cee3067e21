"""The LLVM JIT: host target, the O3 pipeline, and one MCJIT engine for the process.

This module (with the rest of :mod:`metadef.codegen`) is the only home of llvmlite in metadef.
The host target comes from LLVM's *feature* query, never from the CPU name (which LLVM may
report wrongly, losing AVX-512 or AMX). Modules are optimized with the new pass manager at O3
(loop and SLP vectorization on) and added to one MCJIT engine; the object code of every module
is kept (:func:`object_code`) for the on-disk compile cache.

Libm: the float32 transcendental functions the kernels use most (exp, log, tanh, erf, sigmoid)
are emitted inline (:mod:`metadef.codegen.mathlib`) so they vectorize; the rest (sin, pow,
float64 functions, ...) are LLVM intrinsics or libm calls, resolved from the process after
``libm`` is loaded permanently.

Example:
    >>> ir = 'define i64 @add1(i64 %x) { %y = add i64 %x, 1 ret i64 %y }'.replace(' ret', '\\n ret')
    >>> import ctypes
    >>> addr = compile_ir(ir, ["add1"], "doc_add1")["add1"]
    >>> ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(addr)(41)
    42
"""

from __future__ import annotations

import ctypes.util
import hashlib
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from metadef.core.errors import BackendError

_LOCK = threading.RLock()
_STATE: dict[str, object] = {}
_OBJECTS: dict[str, bytes] = {}
_COUNT = [0]
_GENERATED = [0]

PIPELINE = ("new-pm O3: loop+slp vectorize, unroll (kernels with reductions), interleave; O2 without vectorizers "
            "for hand-vectorized routines; mcjit jitdefault")
"""What turns IR into object code here; part of every compile-cache key (change it with
:func:`_optimize` or :func:`_target_machine`)."""


@dataclass(frozen=True)
class HostTarget:
    """What LLVM knows of the host: CPU name (informative only), features, vector width.

    Example:
        >>> t = host_target()
        >>> t.vector_bits in (128, 256, 512), t.features.startswith(("+", "-"))
        (True, True)
    """

    cpu: str
    features: str
    vector_bits: int
    triple: str

    def has(self, feature: str) -> bool:
        """Whether the feature string enables ``feature`` (``"avx2"``, ``"avx512f"``)."""
        return f"+{feature}" in self.features.split(",")


@cache
def _initialize() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    libm = ctypes.util.find_library("m")
    if libm:
        llvm.load_library_permanently(libm)


@cache
def host_target() -> HostTarget:
    """The host target, from ``llvm.get_host_cpu_features()`` (512-bit vectors with avx512f)."""
    _initialize()
    features = llvm.get_host_cpu_features().flatten()
    enabled = set(features.split(","))
    bits = 512 if "+avx512f" in enabled else 256 if "+avx2" in enabled or "+avx" in enabled else 128
    return HostTarget(llvm.get_host_cpu_name(), features, bits, llvm.get_process_triple())


def _target_machine() -> llvm.TargetMachine:
    machine = _STATE.get("tm")
    if machine is None:
        host = host_target()
        target = llvm.Target.from_triple(host.triple)
        # The CPU name only picks scheduling models; the features decide the instructions.
        machine = target.create_target_machine(cpu=host.cpu, features=host.features, opt=3,
                                               reloc="default", codemodel="jitdefault")
        _STATE["tm"] = machine
    return machine  # type: ignore[return-value]


def _engine() -> llvm.ExecutionEngine:
    engine = _STATE.get("engine")
    if engine is None:
        backing = llvm.parse_assembly("")
        backing.triple = host_target().triple
        engine = llvm.create_mcjit_compiler(backing, _target_machine())
        _STATE["engine"] = engine
    return engine  # type: ignore[return-value]


def _optimize(module: llvm.ModuleRef, unroll: bool = True, vectorize: bool = True) -> None:
    machine = _target_machine()
    options = llvm.create_pipeline_tuning_options(speed_level=3 if vectorize else 2)
    options.loop_vectorization = vectorize
    options.slp_vectorization = vectorize
    options.loop_unrolling = unroll
    options.loop_interleaving = vectorize
    builder = llvm.create_pass_builder(machine, options)
    manager = builder.getModulePassManager()
    manager.run(module, builder)


def compile_ir(ir: str, symbols: list[str], name: str, unroll: bool = True,
               vectorize: bool = True) -> dict[str, int]:
    """Parse, verify, optimize (O3) and JIT one module; return ``{symbol: address}``.

    ``name`` identifies the module (and its object code in :func:`object_code`). A module that
    LLVM rejects raises :class:`BackendError` with LLVM's message. ``unroll=False``: no loop
    unrolling (the vectorizer still interleaves): a loop nest over small static extents
    (28 x 28 pixels) is otherwise unrolled whole, for no gain and up to a second of LLVM.
    ``vectorize=False``: O2 without the loop and SLP vectorizers, for code whose vectors are
    written out already (or that only dispatches): the same speed for half of LLVM's time.
    """
    _initialize()
    with _LOCK:
        try:
            module = llvm.parse_assembly(ir)
            module.name = name
            module.triple = host_target().triple
            module.data_layout = str(_target_machine().target_data)
            module.verify()
        except RuntimeError as e:
            raise BackendError(f"LLVM rejected the IR of kernel {name}: {e}") from e
        _optimize(module, unroll, vectorize)
        obj = _target_machine().emit_object(module)
        _GENERATED[0] += 1
        _OBJECTS[name] = obj
        return load_object(obj, symbols)


def load_object(obj: bytes, symbols: list[str]) -> dict[str, int]:
    """Link object code (from :func:`compile_ir` or a cache) into the engine: ``{symbol: address}``.

    Code generation runs once per module: the JIT links the very object code that the cache
    stores.
    """
    _initialize()
    with _LOCK:
        engine = _engine()
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        _COUNT[0] += 1
        addresses = {s: engine.get_function_address(s) for s in symbols}
        if not all(addresses.values()):
            raise BackendError(f"the JIT could not find {symbols} in the object code")
        return addresses


def optimized_ir(ir: str) -> str:
    """The module after the O3 pipeline, as text (for tests and for reading the vector code)."""
    _initialize()
    module = llvm.parse_assembly(ir)
    module.triple = host_target().triple
    module.data_layout = str(_target_machine().target_data)
    _optimize(module)
    return str(module)


def object_code(name: str) -> bytes | None:
    """The object code emitted for the module ``name`` (None if no such module was compiled)."""
    return _OBJECTS.get(name)


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
    return {"llvmlite": str(llvmlite.__version__), "llvm": ".".join(map(str, llvm.llvm_version_info)),
            "triple": host.triple, "cpu_features": host.features, "pipeline": PIPELINE,
            "codegen": source_digest()}


def generated_count() -> int:
    """How many modules this process has optimized and code-generated with LLVM (a compile
    cache hit links stored object code: :func:`compile_count` grows, this does not).

    Example:
        >>> generated_count() <= compile_count()
        True
    """
    return _GENERATED[0]


def compile_count() -> int:
    """How many LLVM modules this process has compiled so far.

    Example:
        >>> isinstance(compile_count(), int)
        True
    """
    return _COUNT[0]


__all__ = ["PIPELINE", "HostTarget", "compile_count", "compile_ir", "host_target", "load_object",
           "generated_count", "object_code", "optimized_ir", "source_digest", "toolchain"]
