"""``Model``: an opened .mdef file — metadata read, graph decoded, weights mapped lazily.

Example:
    >>> import tempfile, pathlib
    >>> import metadef as md
    >>> path = md.save(md.import_onnx(md.zoo.build("mlp")), pathlib.Path(tempfile.mkdtemp()) / "mlp.mdef")
    >>> model = md.load(path)
    >>> [str(s) for s in model.compile(target="reference").inputs]
    ['x: f32[batch,784]']
"""

from __future__ import annotations

from typing import Any

from metadef.format import MdefFile
from metadef.format.custom_metadata import read_namespace
from metadef.ir import Graph


class Model:
    """A loaded model: its ``graph`` (constants are views into the mapped file), its metadata
    ``layers`` (hardware, graph summary, parameters, auxiliary), and ``compile``."""

    def __init__(self, file: MdefFile, compile_fn: Any) -> None:
        self.file = file
        self._graph: Graph | None = None
        self._compile = compile_fn

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

    def compile(self, target: str = "reference", **options: Any) -> Any:
        """Compile the model's graph for a target; returns a Session."""
        return self._compile(self.graph, target=target, **options)

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Model({self.file.path}, version {'.'.join(map(str, self.file.version))})"


__all__ = ["Model"]
