"""``ai.metadef::Lookup`` (an 8-bit tensor's entries in a 256-entry table) as ``md_lookup``.

The optimizer's ``tabulate`` pass makes these of costly elementwise chains (a QOperator
model's GELU: seven requantized steps an element); here each is one ``md_lookup`` call, in
programs and step by step, split over the threads by blocks of 64 elements. A table of bytes
on an AVX512-VBMI host takes 64 elements in a few instructions.

Example:
    >>> import numpy as np
    >>> from metadef.ir import GraphBuilder
    >>> from metadef.shape import parse_type
    >>> b = GraphBuilder("g")
    >>> y, = b.node("Lookup", [b.input("x", parse_type("u8[n]")), b.const("t", np.arange(256, dtype=np.float32))],
    ...             domain="ai.metadef")
    >>> b.output(y)
    >>> lookup_node(b.build().nodes[0]).reason
    'Lookup: md_lookup (our kernel)'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from metadef.backends.x86.choice import Choice
from metadef.backends.x86.native import PARALLEL_ELEMENTS, Arg, Call, NativeStep, Shape, needing, timed_call
from metadef.codegen.native import native_function
from metadef.codegen.native_lookup import BLOCK, lookup_dims
from metadef.ir import Node
from metadef.shape import TensorType


def lookup_node(node: Node) -> Choice | str:
    """A Lookup with a constant table of 1, 2, 4 or 8-byte elements as ``md_lookup``, or why not."""
    x, table = node.inputs[0], node.inputs[1]
    if table is None or table.const is None:
        return "its table is computed at run time"
    entries = np.ascontiguousarray(table.const)
    if entries.shape != (256,) or entries.itemsize not in (1, 2, 4, 8) or entries.dtype.kind not in "biuf":
        return f"a table of {entries.dtype} {list(entries.shape)}: md_lookup takes 256 numbers of 1-8 bytes"
    signed = x.type is not None and x.type.dtype.numpy == np.int8

    def run(args: Sequence[np.ndarray | None], out_types: Sequence[TensorType]) -> list[np.ndarray]:
        data = np.ascontiguousarray(args[0])
        y = np.empty(data.shape, entries.dtype)
        if y.size:
            timed_call(native_function("md_lookup"), [data.ctypes.data, entries.ctypes.data, y.ctypes.data],
                       lookup_dims(y.size, entries.itemsize, signed=signed))()
        return [y]

    def lower(inputs: Sequence[Shape | None], outputs: Sequence[Shape], symbols: Mapping[str, int]
              ) -> NativeStep | str:
        if inputs[0] is None:
            return "the input is absent"
        count = math.prod(inputs[0])
        if count == 0:
            return NativeStep(())

        def tasks(n: int) -> list[tuple[int, ...]] | None:
            if n < 2 or count < PARALLEL_ELEMENTS or count < n * BLOCK:
                return None
            return [lookup_dims(count, entries.itemsize, signed=signed, task=t, tasks=n) for t in range(n)]

        call = Call(native_function("md_lookup"), (Arg("in", 0), Arg("addr", entries.ctypes.data), Arg("out", 0)),
                    lookup_dims(count, entries.itemsize, signed=signed), "lookup", tasks)
        return NativeStep((call,), keep=(entries,))

    return Choice(run, "native", "Lookup: md_lookup (our kernel)", native=needing(lower, "md_lookup"))


__all__ = ["lookup_node"]
