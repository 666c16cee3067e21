"""Opening a model file: .mdef vs safetensors, GGUF and ONNX, side by side (prints BENCHMARKS.md rows).

    .venv/bin/python bench/mdef_open.py                        # synthetic 10 M and 100 M params, BERT-base
    .venv/bin/python bench/mdef_open.py synthetic10m --profile # one model, and where .mdef's open spends time
    .venv/bin/python bench/mdef_open.py bert --precompile      # plus precompiled x86 code in fresh processes

For each model the same tensors are written in the four formats (nothing is downloaded:
the synthetic model is 200 float32 tensors, MatMul weights and biases of a 100-layer MLP;
BERT-base comes from the zoo), then, with the page cache warm (every file is read once
first), in one process:

- open: ``open_mdef`` (header, section table, metadata layers, tensor index; the graph is
  decoded on first use) and ``open_mdef(...).graph()`` (the graph decoded too);
  ``metadef.load`` (the same, plus the loader config and the DynamicLoader); safetensors'
  ``safe_open`` (its JSON header); ``gguf.GGUFReader`` (header, key-values, tensor infos);
  ``onnx.load`` (parses everything, weights included). Medians of ``ROUNDS``.
- RSS growth after open, before any weight is used (a fresh process per format).
- touching every weight after a fresh ``metadef.load`` (reading each tensor in place, and
  copying each into one preallocated buffer), against one plain ``readinto`` of the same
  bytes into that buffer, with and without checksums and the DynamicLoader (with a 256 MB
  ``prefetch_buffer``; the default is none); for the 100 M model also with the file dropped
  from the page cache first (``posix_fadvise(DONTNEED)``: cold).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import math
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROUNDS = 21
MODELS = ("synthetic10m", "synthetic100m", "bert")


def median_ms(fn: Callable[[], Any], rounds: int = ROUNDS, after: Callable[[Any], None] | None = None) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t)
        if after is not None:
            after(got)
    return statistics.median(times) * 1e3


def synthetic_graph(params: int, tensors: int = 200) -> Any:
    """A 100-layer MLP (x @ W_k + b_k) with ``params`` float32 parameters in ``tensors`` tensors."""
    from metadef.ir import GraphBuilder
    from metadef.shape import parse_type

    layers = tensors // 2
    d = round(math.sqrt(params / layers))
    rng = np.random.default_rng(0)
    b = GraphBuilder(f"mlp{layers}x{d}")
    h = b.input("x", parse_type(f"f32[batch,{d}]"))
    for k in range(layers):
        w = b.const(f"layer{k}.weight", rng.standard_normal((d, d), np.float32) / np.float32(math.sqrt(d)))
        bias = b.const(f"layer{k}.bias", np.zeros(d, np.float32))
        h, = b.node("MatMul", [h, w], name=f"matmul{k}")
        h, = b.node("Add", [h, bias], name=f"add{k}")
    b.output(h)
    return b.build()


def model_graph(name: str, workdir: Path) -> tuple[Any, Path]:
    import metadef as md

    if name.startswith("synthetic"):
        params = int(name[len("synthetic"):-1]) * 10**6
        graph = synthetic_graph(params)
        return graph, md.export_onnx(graph, workdir / f"{name}.onnx")
    onnx_path = md.zoo.export(name, workdir / f"{name}.onnx")
    return md.import_onnx(onnx_path), Path(onnx_path)


def gguf_name(name: str) -> str:
    return name if len(name) < 64 else name[:48] + f"~{abs(hash(name)) % 10**12:012d}"  # GGUF names: < 64 bytes


def write_peers(graph: Any, workdir: Path, name: str) -> dict[str, Path]:
    """The graph's weights as safetensors and GGUF files (the graph itself only in .mdef and ONNX)."""
    import gguf
    from safetensors.numpy import save_file

    arrays = {v.name: np.ascontiguousarray(v.const) for v in graph.constants}
    st_path = workdir / f"{name}.safetensors"
    save_file(arrays, str(st_path))
    gg_path = workdir / f"{name}.gguf"
    writer = gguf.GGUFWriter(str(gg_path), arch="metadef")
    for key, array in arrays.items():
        array = array.reshape(1) if array.ndim == 0 else array
        writer.add_tensor(gguf_name(key), array.view(np.uint8) if array.dtype == np.bool_ else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"safetensors": st_path, "gguf": gg_path}


RSS_SNIPPET = """
import os, sys, json
kind, path = sys.argv[1], sys.argv[2]
import numpy, onnx, gguf, safetensors, metadef as md
from safetensors import safe_open
from metadef.format import open_mdef
page = os.sysconf("SC_PAGE_SIZE")
def rss(): return int(open("/proc/self/statm").read().split()[1]) * page
open_fn = {"mdef": lambda: open_mdef(path), "load": lambda: md.load(path),
           "safetensors": lambda: safe_open(path, "np"), "gguf": lambda: gguf.GGUFReader(path),
           "onnx": lambda: onnx.load(path)}[kind]
before = rss(); handle = open_fn(); after = rss()
print(json.dumps(after - before))
"""


def rss_growth(kind: str, path: Path) -> int:
    done = subprocess.run([sys.executable, "-c", RSS_SNIPPET, kind, str(path)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr)
    return int(json.loads(done.stdout.strip().splitlines()[-1]))


def open_times(mdef: Path, peers: dict[str, Path], onnx_path: Path) -> dict[str, float]:
    import gguf
    import onnx
    from safetensors import safe_open

    import metadef as md
    from metadef.format import open_mdef

    def closing(f: Any) -> None:
        f.close()

    return {
        "mdef open": median_ms(lambda: open_mdef(mdef), after=closing),
        "mdef open+graph": median_ms(lambda: open_mdef(mdef).graph(), rounds=7),
        "metadef.load": median_ms(lambda: md.load(mdef), after=closing),
        "safetensors safe_open": median_ms(lambda: safe_open(str(peers["safetensors"]), "np")),
        "gguf GGUFReader": median_ms(lambda: gguf.GGUFReader(str(peers["gguf"])), rounds=7),
        "onnx.load": median_ms(lambda: onnx.load(str(onnx_path)), rounds=3),
    }


def touch_times(path: Path, cold: bool = False, rounds: int = 9) -> dict[str, float]:
    """Touch every weight after a fresh ``metadef.load``, vs one plain read of the same bytes.

    Two ways to touch: *read in place* (each tensor's 64-bit words OR-reduced in 16 MB
    pieces, one pass over the mapped bytes, as a kernel consuming its weights reads them: the
    zero-copy use) and *copy* (each tensor copied into one preallocated buffer, the work a
    plain ``readinto`` of the bytes into that buffer does). ``cold``: the file is dropped from
    the page cache (``posix_fadvise(DONTNEED)``) before every round."""
    import metadef as md
    from metadef.format import need_order, open_mdef

    probe = open_mdef(path, checksum_verify="never")
    order = need_order(probe.graph())
    infos = [probe.tensor_info(n) for n in order]
    data = next(e for e in probe.sections if e.name == "data")
    probe.close()
    sink = np.empty(data.length, np.uint8)
    sink[::4096] = 0  # fault the buffer in once: both sides copy into resident memory
    piece = 1 << 21  # 64-bit words: 16 MB

    def plain_read() -> None:
        with open(path, "rb") as fh:
            fh.seek(data.offset)
            fh.readinto(memoryview(sink))

    def touch(config: dict[str, Any], copy: bool) -> None:
        model = md.load(path, config=config)
        pos = 0
        for i in infos:
            view = model.file.tensor(i.name).reshape(-1).view(np.uint8)
            if copy:
                sink[pos:pos + view.size] = view
                pos += view.size
                continue
            words = view[:view.size // 8 * 8].view(np.uint64)
            for start in range(0, words.size, piece):
                np.bitwise_or.reduce(words[start:start + piece])
        model.close()

    def evict() -> None:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    never = {"safety": {"checksum_verify": "never"}}
    no_loader = {"memory": {"prefetch_buffer": 0}}  # (the default)
    loader = {"memory": {"prefetch_buffer": "256MB"}}
    cases = {"plain read": plain_read}
    for way, copy in (("read in place", False), ("copy", True)):
        cases |= {
            f"{way}: never, no loader": lambda copy=copy: touch({**never, **no_loader}, copy),
            f"{way}: never, loader": lambda copy=copy: touch({**never, **loader}, copy),
            f"{way}: on_demand, no loader": lambda copy=copy: touch(no_loader, copy),
            f"{way}: on_demand, loader": lambda copy=copy: touch(loader, copy),
        }
    if not cold:
        private = {"memory": {**loader["memory"], "mmap_enabled": False}}
        cases["copy: on_demand, loader, no mmap"] = lambda: touch(private, True)
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):  # interleaved, so that the machine's load drifts over every case alike
        for key, fn in cases.items():
            if cold:
                evict()
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def checksum_threads() -> tuple[float, float, float]:
    """xxh3 of ~400 MB in 8 chunks on 1 and on 2 threads, and whether a hashing thread lets
    this one run Python meanwhile (does python-xxhash release the GIL?)."""
    import threading

    from metadef.format.layout import checksum

    buf = np.random.default_rng(0).integers(0, 255, 400_000_000, dtype=np.uint8)
    chunks = np.array_split(buf, 8)

    def run(threads: int) -> None:
        parts = [chunks[k::threads] for k in range(threads)]
        workers = [threading.Thread(target=lambda p=p: [checksum(c) for c in p]) for p in parts]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    def longest_pause() -> float:
        """The longest pause of a Python loop on this thread during one xxh3 call on another,
        as a fraction of that call (about 1: the call holds the GIL all along)."""
        took: list[float] = []

        def hash_once() -> None:
            t = time.perf_counter()
            checksum(buf)
            took.append(time.perf_counter() - t)

        hasher = threading.Thread(target=hash_once)
        last, longest = time.perf_counter(), 0.0
        hasher.start()
        while not took:
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
        hasher.join()
        return longest / took[0]

    return median_ms(lambda: run(1), 7), median_ms(lambda: run(2), 7), longest_pause()


PRECOMPILED_CHILD = """
import json, sys, time
t = time.perf_counter()
import metadef as md
from metadef.codegen.jit import generated_count
model = md.load(sys.argv[1])
loaded = time.perf_counter()
model.compile(target="x86")
print(json.dumps({"load": loaded - t, "compile": time.perf_counter() - loaded, "llvm": generated_count()}))
"""


def precompiled_compile(graph: Any, workdir: Path, name: str) -> None:
    """``save(precompile=["x86"])``, then in fresh processes with empty compile caches: import +
    load, and compile for x86, on this machine (the code is trusted) and as another machine
    (another machine key: the code is ignored and the model compiles)."""
    import metadef as md

    config = {"XDG_CONFIG_HOME": str(workdir / "this-machine")}
    os.environ.update(config)
    start = time.perf_counter()
    path = md.save(graph, workdir / f"{name}-x86.mdef", precompile=["x86"])
    with md.load(path) as model:
        size = next(e.length for e in model.file.sections if e.name == "code:x86")
    print(f"  save(precompile=['x86']): {time.perf_counter() - start:.1f} s, code section {size / 1e6:.2f} MB")
    for machine in ("this-machine", "another-machine", "this-machine"):
        cache = tempfile.mkdtemp(dir=workdir)
        env = {**os.environ, "METADEF_CACHE_DIR": cache, "XDG_CONFIG_HOME": str(workdir / machine)}
        done = subprocess.run([sys.executable, "-c", PRECOMPILED_CHILD, str(path)], env=env,
                              capture_output=True, text=True, check=True)
        got = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  fresh process, empty cache, {machine:15}: import+load {got['load'] * 1e3:6.0f} ms, x86 compile "
              f"{got['compile'] * 1e3:6.0f} ms, {got['llvm']} modules through LLVM")


def profile_open(path: Path) -> None:
    from metadef.format import open_mdef

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(50):
        open_mdef(path).close()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


def measure(name: str, workdir: Path, profile: bool, precompile: bool = False) -> None:
    import metadef as md

    graph, onnx_path = model_graph(name, workdir)
    mdef = md.save(graph, workdir / f"{name}.mdef")
    peers = write_peers(graph, workdir, name)
    weights = sum(v.const.nbytes for v in graph.constants)
    if precompile and name == "bert":
        precompiled_compile(graph, workdir, name)
    del graph
    with md.load(mdef) as model:
        params = sum(int(np.prod(model.file.tensor_info(n).shape)) for n in model.file.tensor_names())
        count = model.file.tensor_count
    for p in [mdef, onnx_path, *peers.values()]:
        p.read_bytes()  # warm the page cache
    print(f"\n== {name}: {count} tensors, {params / 1e6:.1f} M parameters, {weights / 1e6:.1f} MB of weights")
    print("file sizes: " + ", ".join(f"{k} {p.stat().st_size / 1e6:.1f} MB" for k, p in
                                     [("mdef", mdef), ("onnx", onnx_path), *peers.items()]))
    for key, ms in open_times(mdef, peers, onnx_path).items():
        print(f"  open  {key:28} {ms:9.2f} ms")
    for kind, path in [("mdef", mdef), ("load", mdef), ("safetensors", peers["safetensors"]),
                       ("gguf", peers["gguf"]), ("onnx", onnx_path)]:
        growth = rss_growth(kind, path)
        print(f"  RSS after open ({kind:11})      {growth / 1e6:9.2f} MB = {100 * growth / weights:6.2f} % of weights")
    for cold in (False, True) if name == "synthetic100m" else (False,):
        touch = touch_times(mdef, cold, rounds=5 if cold else 9)
        for key, ms in touch.items():
            print(f"  touch every weight ({'cold' if cold else 'warm'}): {key:40} {ms:8.1f} ms = "
                  f"{ms / touch['plain read']:.2f}x the plain read")
    if profile:
        profile_open(mdef)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=f"some of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--profile", action="store_true", help="profile 50 opens of the .mdef file")
    parser.add_argument("--no-threads-check", action="store_true", help="skip the xxh3 1-vs-2 threads check")
    parser.add_argument("--precompile", action="store_true",
                        help="BERT only: save(precompile=['x86']) and compile in fresh processes with empty caches")
    args = parser.parse_args()
    logging.getLogger("metadef.format").setLevel(logging.ERROR)  # (MMAP_FAILED, for the no-mmap rows)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"page cache warm unless marked cold; medians of {ROUNDS} (open), 9 (touch) and 5 (cold) rounds")
    if not args.no_threads_check:
        one, two, pause = checksum_threads()
        print(f"xxh3 of 400 MB: 1 thread {one:.1f} ms, 2 threads {two:.1f} ms ({one / two:.2f}x); while another "
              f"thread hashes 400 MB, a Python loop here pauses at most {100 * pause:.0f} % of that call "
              f"({'xxh3 releases the GIL' if pause < 0.5 else 'xxh3 holds the GIL'})")
    with tempfile.TemporaryDirectory() as d:
        for model in args.models or MODELS:
            if model not in MODELS and not model.startswith("synthetic"):
                parser.error(f"unknown model {model!r}; choose from {', '.join(MODELS)} or syntheticNm")
            measure(model, Path(d), args.profile, args.precompile)


if __name__ == "__main__":
    main()
