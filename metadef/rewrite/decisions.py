"""The decision log: every rewrite or fusion candidate, taken or refused, and why.

Under ``METADEF_DEBUG=1`` each decision is also logged (logger ``metadef.fusion``) as one line,
e.g. ``refused conv_bn_relu at /layer1/conv2: %41 has 2 consumers``; ``write_jsonl`` writes the
same decisions as JSON lines (the CLI's ``--debug-log FILE``).

Example:
    >>> log = DecisionLog()
    >>> log.record("fuse", "contraction_epilogue", "/conv1", ["/conv1", "/relu1"], True)
    >>> log.record("fuse", "contraction_epilogue", "/conv2", ["/conv2"], False, "%41 has 2 consumers")
    >>> print(log.lines()[1])
    refused contraction_epilogue at /conv2: %41 has 2 consumers
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from metadef.core import flags

log = logging.getLogger("metadef.fusion")


@dataclass(frozen=True)
class Decision:
    """One candidate: the pass and rule, where (the root node), which nodes, taken or not, why."""

    pass_name: str
    rule: str
    at: str
    nodes: tuple[str, ...]
    taken: bool
    reason: str = ""

    def line(self) -> str:
        if self.taken:
            covered = f" ({', '.join(self.nodes)})" if len(self.nodes) > 1 else ""
            why = f": {self.reason}" if self.reason else ""
            return f"taken {self.rule} at {self.at}{covered}{why}"
        return f"refused {self.rule} at {self.at}: {self.reason}"


@dataclass
class DecisionLog:
    """Decisions in the order they were made; refusals are recorded once per (rule, node, reason)."""

    decisions: list[Decision] = field(default_factory=list)
    _seen: set[tuple[str, str, str]] = field(default_factory=set, repr=False)

    def record(self, pass_name: str, rule: str, at: str, nodes: list[str] | tuple[str, ...],
               taken: bool, reason: str = "") -> None:
        if not taken:
            key = (rule, at, reason)
            if key in self._seen:
                return
            self._seen.add(key)
        d = Decision(pass_name, rule, at, tuple(nodes), taken, reason)
        self.decisions.append(d)
        if flags.DEBUG.get():
            log.info("[%s] %s", pass_name, d.line())

    def lines(self) -> list[str]:
        return [d.line() for d in self.decisions]

    def taken(self, rule: str | None = None) -> list[Decision]:
        return [d for d in self.decisions if d.taken and (rule is None or d.rule == rule)]

    def refused(self, rule: str | None = None) -> list[Decision]:
        return [d for d in self.decisions if not d.taken and (rule is None or d.rule == rule)]

    def write_jsonl(self, path: str | os.PathLike) -> Path:
        """Write every decision as one JSON object a line (atomically)."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
        with open(tmp, "w") as f:
            for d in self.decisions:
                f.write(json.dumps(asdict(d)) + "\n")
        os.replace(tmp, target)
        return target


__all__ = ["Decision", "DecisionLog"]
