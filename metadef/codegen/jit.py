"""The LLVM JIT: the O3 pipeline and object code for the host, linked by :mod:`.link`.

This module (with the rest of :mod:`metadef.codegen`) is the only home of llvmlite in metadef,
and the only one that loads LLVM itself (``llvmlite.binding``): it is imported where code is
generated, so a process whose kernels all come from the compile cache never loads it. The host
target comes from LLVM's *feature* query, never from the CPU name (which LLVM may report
wrongly, losing AVX-512 or AMX; :mod:`.host` records the answer per host). Modules are
optimized with the new pass manager at O3 (loop and SLP vectorization on) and emitted as object
code; the object code of every module is kept (:func:`object_code`) for the on-disk compile
cache, and linked into the process by :func:`metadef.codegen.link.load_object`, as a cache hit's
is.

Libm: the float32 transcendental functions the kernels use most (exp, expm1, log, tanh, erf,
sigmoid, softplus, sin, cos) are emitted inline (:mod:`metadef.codegen.mathlib`) so they
vectorize; the rest (tan, the inverse and hyperbolic functions, pow, float64 functions, ...)
are LLVM intrinsics or libm calls, which the linker resolves in the process's libraries.

Example:
    >>> ir = 'define i64 @add1(i64 %x) { %y = add i64 %x, 1 ret i64 %y }'.replace(' ret', '\\n ret')
    >>> import ctypes
    >>> addr = compile_ir(ir, ["add1"], "doc_add1")["add1"]
    >>> ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(addr)(41)
    42
"""

from __future__ import annotations

import threading
from functools import cache

import llvmlite.binding as llvm

from metadef.codegen.host import PIPELINE, HostTarget, host_target, source_digest, toolchain, widest_vector
from metadef.codegen.link import compile_count, load_object
from metadef.core.errors import BackendError

_LOCK = threading.RLock()
_STATE: dict[str, object] = {}
_OBJECTS: dict[str, bytes] = {}
_GENERATED = [0]


@cache
def _initialize() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


def query_host() -> HostTarget:
    """The host target from LLVM's feature query (512-bit vectors with avx512f); use
    :func:`metadef.codegen.host.host_target`, which remembers the answer per host."""
    _initialize()
    features = llvm.get_host_cpu_features().flatten()
    return HostTarget(llvm.get_host_cpu_name(), features, widest_vector(features), llvm.get_process_triple(),
                      ".".join(map(str, llvm.llvm_version_info)))


def _target_machine() -> llvm.TargetMachine:
    machine = _STATE.get("tm")
    if machine is None:
        _initialize()
        host = host_target()
        target = llvm.Target.from_triple(host.triple)
        # The CPU name only picks scheduling models; the features decide the instructions.
        machine = target.create_target_machine(cpu=host.cpu, features=host.features, opt=3,
                                               reloc="default", codemodel="jitdefault")
        _STATE["tm"] = machine
    return machine  # type: ignore[return-value]


def _optimize(module: llvm.ModuleRef, unroll: bool = True, vectorize: bool = True, light: bool = False) -> None:
    machine = _target_machine()
    options = llvm.create_pipeline_tuning_options(speed_level=1 if light else 3 if vectorize else 2)
    options.loop_vectorization = vectorize
    options.slp_vectorization = vectorize
    options.loop_unrolling = unroll
    options.loop_interleaving = vectorize
    builder = llvm.create_pass_builder(machine, options)
    manager = builder.getModulePassManager()
    manager.run(module, builder)


def compile_ir(ir: str, symbols: list[str], name: str, unroll: bool = True,
               vectorize: bool = True, light: bool = False) -> dict[str, int]:
    """Parse, verify, optimize (O3) and JIT one module; return ``{symbol: address}``.

    ``name`` identifies the module (and its object code in :func:`object_code`). A module that
    LLVM rejects raises :class:`BackendError` with LLVM's message. ``unroll=False``: no loop
    unrolling (the vectorizer still interleaves): a loop nest over small static extents
    (28 x 28 pixels) is otherwise unrolled whole, for no gain and up to a second of LLVM.
    ``vectorize=False``: O2 without the loop and SLP vectorizers, for code whose vectors are
    written out already (or that only dispatches): the same speed for half of LLVM's time.
    ``light=True``: the O1 pipeline (no vectorizers either), for code whose tiles, vectors and
    prefetches are all written out: the code generator (``opt=3``) still schedules it.
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
        _optimize(module, unroll, vectorize, light)
        obj = _target_machine().emit_object(module)
        _GENERATED[0] += 1
        _OBJECTS[name] = obj
        return load_object(obj, symbols, name)


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


def generated_count() -> int:
    """How many modules this process has optimized and code-generated with LLVM (a compile
    cache hit links stored object code: :func:`compile_count` grows, this does not).

    Example:
        >>> generated_count() <= compile_count()
        True
    """
    return _GENERATED[0]


__all__ = ["PIPELINE", "HostTarget", "compile_count", "compile_ir", "host_target", "load_object",
           "generated_count", "object_code", "optimized_ir", "query_host", "source_digest", "toolchain"]
