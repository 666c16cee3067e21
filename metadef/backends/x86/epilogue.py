"""A contraction-anchored fused group split in two: the anchor, which runs through a library
or our own product kernel, and the rest of the body (the epilogue) as a graph of its own.

Example:
    >>> import numpy as np
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> from metadef.passes import optimize
    >>> b = GraphBuilder("g")
    >>> y, = b.node("MatMul", [b.input("x", parse_type("f32[n,4]")), b.const("w", np.ones((4, 3), np.float32))])
    >>> z, = b.node("Relu", [y])
    >>> b.output(z)
    >>> fused = optimize(b.build(), level="aggressive").nodes[0]
    >>> split = split_epilogue(fused)
    >>> split.anchor.op, [n.op for n in split.body.nodes]
    ('MatMul', ['Relu'])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.ir import Graph, Node
from metadef.ops import Role


@dataclass(frozen=True)
class Epilogue:
    """A contraction-anchored group split in two: the anchor (run through BLAS) and the rest
    of the body as its own graph, whose first input is the anchor's output.

    Positions refer to the Fused node's inputs and outputs: the anchor reads
    ``anchor_sources`` (an input position, or a constant kept in the body), the epilogue
    reads ``input_positions`` after the anchor's output and makes the outputs at
    ``epilogue_positions``; the outputs at ``anchor_positions`` are the anchor's own.
    """

    anchor: Node
    anchor_sources: tuple[tuple[int | None, np.ndarray | None], ...]
    body: Graph | None
    input_positions: tuple[int, ...]
    epilogue_positions: tuple[int, ...]
    anchor_positions: tuple[int, ...]

    def anchor_args(self, args: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
        return [const if i is None else args[i] for i, const in self.anchor_sources]

    def epilogue_args(self, args: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
        return [args[i] for i in self.input_positions]

    def assemble(self, y: np.ndarray, outs: Sequence[np.ndarray]) -> list[np.ndarray]:
        result: list[Any] = [None] * (len(self.anchor_positions) + len(self.epilogue_positions))
        for p in self.anchor_positions:
            result[p] = y
        for p, o in zip(self.epilogue_positions, outs):
            result[p] = o
        return result


def _anchor_of(node: Node) -> Node | str:
    body = node.attrs["body"]
    named = [n for n in body.nodes if n.name == node.meta.get("anchor")]
    anchors = named or [n for n in body.nodes if n.metaop.role is Role.CONTRACTION]
    if not anchors:
        return "no contraction anchor in the group's body"
    if anchors[0] is not body.nodes[0]:
        return f"the group has nodes before its anchor {anchors[0].name} (a prologue)"
    if len(anchors[0].outputs) != 1:
        return f"the anchor {anchors[0].name} has {len(anchors[0].outputs)} outputs, not one"
    return anchors[0]


def split_epilogue(node: Node) -> Epilogue | str:
    """Split a contraction-anchored ``Fused`` node (or say why it cannot be split).

    The original body is not touched: the epilogue graph is built from a clone.
    """
    found = _anchor_of(node)
    if isinstance(found, str):
        return found
    body: Graph = node.attrs["body"]
    position = {id(v): i for i, v in enumerate(body.inputs)}
    sources: list[tuple[int | None, np.ndarray | None]] = []
    for v in found.inputs:
        if v is not None and id(v) not in position and v.const is None:
            return f"the anchor reads %{v.name}, neither an input nor a constant of the body"
        sources.append((None if v is None else position.get(id(v)), None if v is None else v.const))
    work = body.clone()
    head, rest = work.nodes[0], work.nodes[1:]
    y = head.outputs[0]
    anchor_positions = tuple(i for i, o in enumerate(work.outputs) if o is y)
    epilogue_positions = tuple(i for i, o in enumerate(work.outputs) if o is not y)
    if not rest:
        return Epilogue(found, tuple(sources), None, (), epilogue_positions, anchor_positions)
    y.producer = None
    used = {id(v) for n in rest for v in n.inputs if v is not None}
    inputs = [(i, v) for i, v in enumerate(work.inputs) if id(v) in used]
    epilogue = Graph(f"{body.name}/epilogue", [y, *(v for _, v in inputs)],
                     [work.outputs[i] for i in epilogue_positions], rest,
                     [c for c in work.constants if id(c) in used], dict(work.opset), work.env)
    return Epilogue(found, tuple(sources), epilogue, tuple(i for i, _ in inputs),
                    epilogue_positions, anchor_positions)


__all__ = ["Epilogue", "split_epilogue"]
