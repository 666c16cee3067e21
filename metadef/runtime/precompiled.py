"""Precompiled code in a model file, and when to trust it.

``metadef.save(graph, path, precompile=["x86"])`` compiles the saved model in a fresh
process with an empty compile cache (so the cache ends up holding exactly what a compile of
this model needs, whatever this process compiled before), and stores those cache entries in
the file's ``code:x86`` section (:mod:`metadef.cache.bundle`), tagged with the cache-key
environment that makes them valid (metadef, LLVM and llvmlite versions, triple, CPU
features, codegen pipeline and source digest) and MACed with this machine's secret key.

``metadef.load`` looks at each such section (:func:`seed_compile_cache`) and copies its
entries into the compile cache, so that ``model.compile(target="x86")`` runs no LLVM, only
when all of these hold:

- the section's checksum matches (else it is refused, with a warning: the file is damaged);
- its environment is this process's (else it is ignored: another CPU or compiler);
- it is trusted: built on this machine (its MAC verifies under this machine's key), or its
  hash (:meth:`metadef.format.MdefFile.code_hash`) is listed in ``safety.trusted_code_hashes``
  or ``load(trust=[...])``.

Otherwise the section is ignored and the model compiles as usual; ``METADEF_DEBUG=1`` logs why.
The machine key is 32 random bytes in ``$XDG_CONFIG_HOME/metadef/machine.key`` (default
``~/.config``), made on first use, readable by its owner only.

Example:
    >>> import os, tempfile
    >>> os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp()
    >>> len(machine_key()), machine_key() == machine_key(), len(machine_id())
    (32, True, 16)
    >>> del os.environ["XDG_CONFIG_HOME"]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from metadef.cache import Store, environment, explain_difference
from metadef.cache.bundle import BundleError, install, missing, pack_bundle, unpack_bundle
from metadef.cache.store import CorruptEntry
from metadef.core import flags
from metadef.core.errors import BackendError, FormatError
from metadef.format import MdefFile
from metadef.format.reader import code_hash_of

log = logging.getLogger("metadef.runtime")

CACHED_TARGETS = ("x86",)
"""The targets whose compile goes through the compile cache, so that their code can be shipped."""

_COMPILE = """
import json, sys
import metadef as md
from metadef.cache import environment
model = md.load(sys.argv[1], config={"memory": {"prefetch_buffer": 0}})
for target in sys.argv[2:]:
    model.compile(target=target)
print(json.dumps(environment()))
"""


def _key_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "metadef" / "machine.key"


def machine_key() -> bytes:
    """This machine's secret key (made on first use; see the module docstring)."""
    path = _key_path()
    try:
        data = path.read_bytes()
        if len(data) == 32:
            return data
        log.warning("%s is %d bytes, not 32: making a new machine key (code built before is no longer "
                    "recognized as built here)", path, len(data))
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    tmp = path.with_name(f".machine.key.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    try:
        os.link(tmp, path)  # fails when another process made one meanwhile: use that one
    except FileExistsError:
        return path.read_bytes()
    finally:
        tmp.unlink(missing_ok=True)
    return key


def machine_id(key: bytes | None = None) -> str:
    """The public id of this machine (16 hex digits derived from its key)."""
    return hashlib.blake2b(b"metadef machine id", key=key or machine_key(), digest_size=8).hexdigest()


def precompile(path: str | os.PathLike[str], targets: Sequence[str], timeout: float | None = None) -> dict[str, bytes]:
    """Compile the .mdef file at ``path`` for ``targets`` in a fresh process with an empty
    compile cache; returns each target's code section (a MACed bundle of the cache entries).

    Example:
        >>> precompile("m.mdef", ["reference"])
        Traceback (most recent call last):
        ...
        metadef.core.errors.BackendError: precompile: target 'reference' has no compile cache to ship; \
precompile takes x86
    """
    for target in targets:
        if target not in CACHED_TARGETS:
            raise BackendError(f"precompile: target {target!r} has no compile cache to ship; precompile takes "
                               + ", ".join(CACHED_TARGETS))
    root = str(Path(__file__).resolve().parents[2])  # (the directory holding the metadef package)
    with tempfile.TemporaryDirectory(prefix="metadef-precompile-") as cache:
        env = {**os.environ, "METADEF_CACHE_DIR": cache,
               "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _COMPILE, str(path), *targets], env=env,
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise BackendError(f"precompile: compiling {path} for {', '.join(targets)} in a fresh process failed "
                               f"(exit {done.returncode}):\n{done.stderr[-2000:]}")
        built_env = json.loads(done.stdout.strip().splitlines()[-1])
        entries = list(Store(cache).entries())
    key = machine_key()
    log.info("precompiled %s for %s in %.1f s: %d cache entries, %d bytes", path, ", ".join(targets),
             time.perf_counter() - start, len(entries), sum(len(d) for *_, d in entries))
    info = {"environment": built_env, "machine": machine_id(key), "metadef": built_env.get("metadef"),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return {t: pack_bundle(entries, {**info, "target": t}, key) for t in targets}


def _why(message: str, *args: object) -> None:
    """A reason the code is not used: logged at INFO under METADEF_DEBUG, else at DEBUG."""
    log.log(logging.INFO if flags.DEBUG.get() else logging.DEBUG, message, *args)


def seed_compile_cache(file: MdefFile, trusted: Iterable[str] = (), store: Store | None = None) -> dict[str, str]:
    """Copy the entries of ``file``'s trusted code sections into the compile cache (see the
    module docstring); returns, per code target, what was done and why."""
    outcome: dict[str, str] = {}
    pins = set(trusted)
    for target in file.code_targets():
        outcome[target] = _seed_one(file, target, pins, store)
    return outcome


def _seed_one(file: MdefFile, target: str, pins: set[str], store: Store | None) -> str:
    where = f"{file.path}: code section 'code:{target}'"
    if target not in CACHED_TARGETS:
        _why("%s: ignored: metadef does not ship code for target %s", where, target)
        return "ignored: not a cached target"
    try:
        blob = file.code(target)
        assert blob is not None
        bundle = unpack_bundle(blob)
    except (FormatError, BundleError) as e:
        log.warning("%s refused (%s); the model compiles as usual", where, e)
        return f"refused: {e}"
    built = bundle.manifest.get("environment")
    here = environment()
    if not isinstance(built, dict) or any(built.get(k) != v for k, v in here.items()):
        why = explain_difference(here, built if isinstance(built, dict) else {})
        _why("%s ignored: it was built for another machine or compiler (%s); compiling", where, why)
        return f"ignored: built elsewhere ({why})"
    store = store or Store()
    if not missing(bundle, store):
        _why("%s: its %d entries are in the compile cache already", where, len(bundle.manifest["entries"]))
        return "cached already"
    digest = code_hash_of(blob)
    key = machine_key()
    if bundle.signed_by(key):
        why = "built on this machine"
    elif digest in pins:
        why = "its hash is pinned"
    else:
        _why("%s ignored: not trusted (built on machine %s, this is machine %s); to use it, pin its hash %s "
             "in safety.trusted_code_hashes or load(trust=[...])", where, bundle.manifest.get("machine"),
             machine_id(key), digest)
        return "ignored: not trusted"
    try:
        written = install(bundle, store)
    except (CorruptEntry, OSError) as e:
        log.warning("%s refused: %s; the model compiles as usual", where, e)
        return f"refused: {e}"
    with contextlib.suppress(OSError):
        store.flush_stats()
    _why("%s trusted (%s): %d cache entries installed", where, why, written)
    return f"installed: {why}"


__all__ = ["CACHED_TARGETS", "machine_id", "machine_key", "precompile", "seed_compile_cache"]
