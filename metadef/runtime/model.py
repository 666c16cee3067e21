"""``Model``: an opened .mdef file — metadata read, graph decoded, weights mapped lazily — and
``Model.optimize_for(profile)``, which picks the target, threads, precision and kernels for a
machine.

Example:
    >>> import tempfile, pathlib
    >>> import metadef as md
    >>> path = md.save(md.import_onnx(md.zoo.build("mlp")), pathlib.Path(tempfile.mkdtemp()) / "mlp.mdef")
    >>> model = md.load(path)
    >>> [str(s) for s in model.compile(target="reference").inputs]
    ['x: f32[batch,784]']
    >>> fast = model.optimize_for(md.DeviceProfile(features=frozenset({"avx2", "fma", "f16c"}), physical_cores=4))
    >>> fast.choices["target"], fast.choices["threads"], fast.choices["weights"], model.choices
    ('x86', 4, 'float32', {})
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from metadef.codegen.host import host_target
from metadef.codegen.native_qgemm import int8_isa
from metadef.core.dtypes import from_numpy
from metadef.core.errors import InputError
from metadef.core.flags import DEBUG
from metadef.format import MdefFile
from metadef.format.custom_metadata import read_namespace
from metadef.ir import Graph, Node, Value, verify
from metadef.ops import Role
from metadef.passes import LEVELS, optimize
from metadef.runtime.profile import DeviceProfile

log = logging.getLogger("metadef.runtime")

FLOAT16_MIN_ELEMENTS = 1024
"""Weights smaller than this (biases, norms) stay float32 under ``reduced_precision``."""
FLOAT16_MAX = 65504.0


class Model:
    """A loaded model: its ``graph`` (constants are views into the mapped file), its metadata
    ``layers`` (hardware, graph summary, parameters, auxiliary), and ``compile``.

    ``choices`` and ``reasons`` say what :meth:`optimize_for` picked and why (empty for a
    model as loaded)."""

    def __init__(self, file: MdefFile, compile_fn: Any, *, graph: Graph | None = None,
                 choices: dict[str, Any] | None = None, reasons: dict[str, str] | None = None) -> None:
        self.file = file
        self._graph: Graph | None = graph
        self._compile = compile_fn
        self.choices: dict[str, Any] = dict(choices or {})
        self.reasons: dict[str, str] = dict(reasons or {})

    @property
    def graph(self) -> Graph:
        """The model's graph (decoded once)."""
        if self._graph is None:
            self._graph = self.file.graph()
        return self._graph

    @property
    def layers(self) -> dict[str, Any]:
        return self.file.layers

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata the model was saved with (``metadata=`` of ``save``)."""
        return self.file.user_metadata()

    def namespace(self, name: str) -> Any:
        """Custom metadata ``name``: an instance of its registered class, else the stored dict."""
        return read_namespace(self.metadata["namespaces"], name)

    def compile(self, target: str | None = None, **options: Any) -> Any:
        """Compile the model's graph for a target; returns a Session. ``target`` defaults to
        the one :meth:`optimize_for` chose (and its thread count), else ``"reference"``."""
        chosen = self.choices.get("target")
        target = target or chosen or "reference"
        if target == chosen == "x86" and "threads" in self.choices:
            options.setdefault("threads", self.choices["threads"])
        return self._compile(self.graph, target=target, **options)

    def optimize_for(self, profile: DeviceProfile | None = None, *, reduced_precision: bool = False,
                     level: str = "aggressive", threads: int | None = None) -> Model:
        """A new Model tuned for ``profile`` (default: this machine); this one is unchanged
        (as ``torch.compile`` returns a new module and leaves the original as it was).

        What it picks, in ``choices`` (why, in ``reasons``; both logged under METADEF_DEBUG=1):

        - ``target``: ``"x86"`` when the profile has AVX2 (and FMA), else ``"reference"``;
          :meth:`compile` then defaults to it.
        - ``threads``: ``threads`` if given, else one per physical core.
        - ``vector_bits``: 512 with AVX-512, 256 with AVX2, else 128. Code is generated for the
          CPU it is compiled on: a profile of another machine is met by compiling there.
        - ``weights``: ``"float16"`` only when ``reduced_precision`` is allowed and the profile
          has F16C: contraction weights (MatMul, Gemm, Conv, fused groups anchored by one) of
          at least :data:`FLOAT16_MIN_ELEMENTS` elements are held as float16 (half the
          memory) and converted to float32 as each run reads them, which costs time (F16C
          makes it cheap, not free); else ``"float32"``.
        - ``int8_kernels``: whether the x86 backend's int8 kernels run on the profile:
          quantized models (QDQ, QOperator) then compute their products in int8. True with
          AVX512-VNNI (one ``vpdpbusd`` per four products a lane) and with AVX2 alone (exact
          products through 16-bit multiplies, more instructions a product; ``reasons`` says which:
          :func:`metadef.codegen.native_qgemm.int8_isa`); False
          without AVX2, where they run on the reference backend. An int8 weight-only
          ``.mdef`` file is dequantized at load either way (its contractions compute in
          float32).
        - ``level``: the optimization level the graph was optimized at.

        Example:
            >>> import tempfile, pathlib, metadef as md
            >>> path = md.save(md.import_onnx(md.zoo.build("mlp")), pathlib.Path(tempfile.mkdtemp()) / "m.mdef")
            >>> old = md.DeviceProfile(features=frozenset({"sse4_2"}), physical_cores=2)
            >>> m = md.load(path).optimize_for(old)
            >>> m.choices["target"], m.compile().target, m.reasons["target"][:23]
            ('reference', 'reference', 'the profile lacks AVX2:')
        """
        if level not in LEVELS:
            raise InputError(f"optimize_for: level {level!r} is not one of {', '.join(LEVELS)}")
        if threads is not None and threads < 1:
            raise InputError(f"optimize_for: threads={threads}; give a positive number, or None for one per core")
        profile = profile or DeviceProfile.detect()
        choices: dict[str, Any] = {}
        reasons: dict[str, str] = {}
        for name, rule in tuning_rules:
            choices[name], reasons[name] = rule(profile, {"reduced_precision": reduced_precision, "threads": threads})
        choices["level"], reasons["level"] = level, f"optimized at {level} (fusion, folding, layout)"
        graph = optimize(self.graph, level=level)
        if choices["weights"] == "float16":
            graph, held = store_weights_float16(graph)
            if not held:
                choices["weights"] = "float32"
            reasons["weights"] += f"; {len(held)} weights held as float16" if held else "; no weight qualified"
        if DEBUG.get():
            for name, value in choices.items():
                log.info("optimize_for %s (%s): %s = %s: %s", self.graph.name, profile.cpu_name, name, value,
                         reasons[name])
        return Model(self.file, self._compile, graph=graph, choices=choices, reasons=reasons)

    def close(self) -> None:
        """Close the file (a model from :meth:`optimize_for` shares its original's file)."""
        self.file.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        tuned = f", tuned: {self.choices}" if self.choices else ""
        return f"Model({self.file.path}, version {'.'.join(map(str, self.file.version))}{tuned})"


# ---------------------------------------------------------------------------- the choices

TuningRule = Callable[[DeviceProfile, dict[str, Any]], tuple[Any, str]]
"""(profile, the user's requests) -> (the choice, why)."""


def _target(profile: DeviceProfile, asked: dict[str, Any]) -> tuple[Any, str]:
    if profile.has("avx2") and profile.has("fma"):
        return "x86", "the profile has AVX2 and FMA: the x86 backend (generated kernels, BLAS)"
    return "reference", "the profile lacks AVX2: the reference backend (numpy), which runs on any CPU"


def _threads(profile: DeviceProfile, asked: dict[str, Any]) -> tuple[Any, str]:
    if asked["threads"] is not None:
        return asked["threads"], "as asked"
    return profile.physical_cores, (f"one per physical core ({profile.physical_cores} of "
                                    f"{profile.logical_cores} logical: hyper-threads share a core's vector units)")


def _vector_bits(profile: DeviceProfile, asked: dict[str, Any]) -> tuple[Any, str]:
    bits = 512 if profile.has("avx512f") else 256 if profile.has("avx2") else 128
    here = host_target().vector_bits
    note = "" if bits == here else (f"; this machine's CPU has {here}-bit vectors and code is generated for the "
                                    "CPU it is compiled on: compile on the profiled machine")
    isa = {512: "AVX-512", 256: "AVX2"}.get(bits, "SSE")
    return bits, f"{isa} vectors{note}"


def _weights(profile: DeviceProfile, asked: dict[str, Any]) -> tuple[Any, str]:
    if not asked["reduced_precision"]:
        return "float32", "reduced precision not allowed (reduced_precision=True allows float16 weights)"
    if not profile.has("f16c"):
        return "float32", "the profile lacks F16C: converting float16 weights at each run would be slow"
    return "float16", ("reduced precision allowed and the profile has F16C: contraction weights held as "
                       "float16 (half the memory), converted to float32 as each run reads them (costs time)")


def _int8(profile: DeviceProfile, asked: dict[str, Any]) -> tuple[Any, str]:
    weight_only = "; an int8 weight-only .mdef file is still dequantized at load (float32 products)"
    isa = int8_isa(profile.has)
    if isa == "AVX512-VNNI":
        return True, ("the profile has AVX512-VNNI: quantized models' products run in our int8 kernels "
                      "(vpdpbusd)" + weight_only)
    if isa == "AVX2":
        return True, ("the profile has AVX2 but lacks AVX512-VNNI: quantized models' products run in our int8 "
                      "kernels, exact through 16-bit multiplies (vpmaddwd), more instructions a product than "
                      "VNNI's" + weight_only)
    return False, ("the profile lacks AVX2: the x86 backend's int8 kernels do not run; quantized models run on "
                   "the reference backend")


tuning_rules: list[tuple[str, TuningRule]] = [
    ("target", _target), ("threads", _threads), ("vector_bits", _vector_bits), ("weights", _weights),
    ("int8_kernels", _int8),
]
"""What :meth:`Model.optimize_for` decides, in order: (choice name, rule)."""


# ------------------------------------------------------------------------ float16 weights


def _contraction_operand(node: Node, position: int) -> bool:
    """Whether ``node`` reads its input ``position`` only as an operand of a contraction
    (the node is one, or a fused group whose body reads that input only in contractions)."""
    if node.metaop.role is Role.CONTRACTION:
        return True
    body = node.attrs.get("body")
    if not isinstance(body, Graph) or position >= len(body.inputs):
        return False
    inner = body.inputs[position]
    readers = [n for n in body.nodes if any(v is inner for v in n.inputs)]
    return bool(readers) and all(n.metaop.role is Role.CONTRACTION for n in readers)


def store_weights_float16(graph: Graph) -> tuple[Graph, list[str]]:
    """A new graph whose contraction weights (float32, at least :data:`FLOAT16_MIN_ELEMENTS`
    elements, within float16's range, read only by contractions) are float16 constants, each
    converted by a ``Cast`` to float32 placed just before its first reader (so the float32
    copy lives only while it is read); and the names of the weights so held.

    Example:
        >>> import metadef as md
        >>> g, held = store_weights_float16(md.optimize(md.import_onnx(md.zoo.build("mlp")), level="aggressive"))
        >>> len(held), sorted({str(v.const.dtype) for v in g.constants})
        (3, ['float16', 'float32'])
    """
    out = graph.clone()
    readers = out.consumers()
    stored: dict[int, Value] = {}  # id of a chosen weight -> its float16 constant
    for v in out.constants:
        data = v.const
        if (data is None or v.type is None or data.dtype != np.float32 or data.size < FLOAT16_MIN_ELEMENTS
                or not np.isfinite(data).all() or float(np.abs(data).max()) > FLOAT16_MAX):
            continue
        uses = [(n, i) for n in readers.get(id(v), []) for i, x in enumerate(n.inputs) if x is v]
        if uses and all(_contraction_operand(n, i) for n, i in uses):
            half = v.type.with_dtype(from_numpy(np.dtype(np.float16)))
            stored[id(v)] = Value(f"{v.name}.float16", half, data.astype(np.float16))
    held = [v.name for v in out.constants if id(v) in stored]
    nodes: list[Node] = []
    for n in out.nodes:
        for v in n.inputs:
            if v is not None and id(v) in stored and v.producer is None:
                cast = Node("Cast", (stored[id(v)],), (v,), {"to": 1}, name=f"{v.name}/to_float32")
                v.const, v.producer = None, cast  # the clone's own value: now the Cast's output
                nodes.append(cast)
        nodes.append(n)
    out.nodes = nodes
    out.constants = [c for c in out.constants if id(c) not in stored] + list(stored.values())
    verify(out, types=True, stage="store_weights_float16")
    return out, held


__all__ = ["FLOAT16_MIN_ELEMENTS", "Model", "store_weights_float16", "tuning_rules"]
