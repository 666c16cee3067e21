"""``SpecializingSession``: one compiled Session per structure of the feeds, made on demand.

A graph with sequence or optional inputs is specialized on their structure (a list's length,
whether an optional is present, and the values of the inputs that decide them; see
:mod:`metadef.ir.structure`). Like torch.compile with Python lists, a ``SpecializingSession``
specializes on the structure of the first run's feeds, guards on it, and specializes again
(through ``specialize``, which the frontend provides: it imports the model for those feeds
and compiles it) when a run's feeds have another; the last :data:`SPECIALIZATIONS` sessions are
kept, most recently used first.

Example:
    >>> import numpy as np, metadef as md
    >>> from onnx import helper, TensorProto as T
    >>> g = helper.make_graph(
    ...     [helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)], "g",
    ...     [helper.make_tensor_sequence_value_info("seq", T.FLOAT, ["n"])],
    ...     [helper.make_tensor_value_info("y", T.FLOAT, None)])
    >>> sess = md.compile_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]))
    >>> sess.run({"seq": [np.ones(2, np.float32)]})["y"]
    array([1., 1.], dtype=float32)
    >>> sess.run({"seq": [np.ones(1, np.float32), np.zeros(1, np.float32)]})["y"]
    array([1., 0.], dtype=float32)
    >>> len(sess.sessions)
    2
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from metadef.core.run_profile import RunProfile
from metadef.runtime.session import Session

log = logging.getLogger("metadef.runtime")

SPECIALIZATIONS = 16
"""How many specializations (compiled sessions) a SpecializingSession keeps."""


class SpecializingSession:
    """Runs a model whose inputs may be sequences or optionals: ``run`` finds (or makes, with
    ``specialize(feeds)``) the session specialized for the feeds' structure.

    Example:
        >>> import numpy as np, metadef as md
        >>> from metadef.ir import parse_graph
        >>> g = parse_graph("graph g(%x: f32[n]) -> (%y) { %y: f32[n] = Neg(%x) return %y }")
        >>> sess = SpecializingSession(lambda feeds: md.compile(g), "reference")
        >>> sess.run({"x": np.ones(2, np.float32)})["y"], len(sess.sessions)
        (array([-1., -1.], dtype=float32), 1)
    """

    def __init__(self, specialize: Callable[[Mapping[str, Any]], Session], target: str, *,
                 limit: int = SPECIALIZATIONS) -> None:
        self.specialize = specialize
        self.target = target
        self.limit = limit
        self.sessions: list[Session] = []
        """The specializations made so far, most recently used first."""
        self._lock = threading.Lock()

    def session_for(self, feeds: Mapping[str, Any]) -> Session:
        """The session whose structure accepts ``feeds``, specialized now if none does."""
        with self._lock:
            for i, sess in enumerate(self.sessions):
                if sess.structure is None or sess.structure.accepts(feeds):
                    self.sessions.insert(0, self.sessions.pop(i))
                    return sess
            sess = self.specialize(feeds)
            log.debug("specialized for %s (%d kept)", _describe(feeds), len(self.sessions) + 1)
            self.sessions.insert(0, sess)
            del self.sessions[self.limit:]
            return sess

    def run(self, feeds: Mapping[str, Any],
            outputs: Sequence[str] | Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
        """``Session.run`` on the session specialized for these feeds (see the module doc)."""
        return self.session_for(feeds).run(feeds, outputs)

    def profile(self, feeds: Mapping[str, Any], runs: int = 10, warmup: int = 2) -> RunProfile:
        """``Session.profile`` on the session specialized for these feeds."""
        return self.session_for(feeds).profile(feeds, runs, warmup)

    def __repr__(self) -> str:
        return f"SpecializingSession[{self.target}]({len(self.sessions)} specializations)"


def _describe(feeds: Mapping[str, Any]) -> str:
    def one(v: Any) -> str:
        return "None" if v is None else f"a list of {len(v)}" if isinstance(v, (list, tuple)) else "a tensor"
    return ", ".join(f"{k}: {one(v)}" for k, v in feeds.items())


__all__ = ["SPECIALIZATIONS", "SpecializingSession"]
