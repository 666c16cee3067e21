"""Where each box of the graph figure goes: levels by topological depth, set in columns.

The graph is a DAG given as ``parents`` (item ``i`` reads the items ``parents[i]``; items are
in topological order). An item's *level* is its depth: 0 without parents, else one more than
its deepest parent. Levels run top to bottom; the items of one level sit side by side in
*lanes*, ordered by where their parents are (fewer crossings). A long model (BERT: ~140
levels) does not fit one column, so the levels are cut into columns, as a newspaper sets a
long text, the number of columns chosen to make the figure about :data:`TARGET_ASPECT` wide
for each unit of height.

Each edge gets a route: ``line`` (to the next level, same column), ``arc`` (a few levels down
the same column, bowed sideways past the boxes in between by ``bow`` inches) or ``stub``
(farther, or into another column: drawn as a short "continues" mark at each end, not as a
line across the figure). All lengths are in inches; ``y`` grows downwards.

Example:
    >>> lay = layout_dag([[], [0], [1], [0, 2]])
    >>> [p.level for p in lay.places], [link.route for link in lay.links]
    ([0, 1, 2, 3], ['line', 'line', 'arc', 'line'])
    >>> lay.columns, round(lay.width, 2) > 0
    (1, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

BOX_WIDTH = 1.5
BOX_HEIGHT = 0.4
PITCH_X = 1.7
"""Distance between the centres of two lanes."""
PITCH_Y = 0.62
"""Distance between the centres of two levels."""
COLUMN_GAP = 0.6
MARGIN = 0.3
ARC_SPAN = 8
"""The most levels an edge may skip and still be drawn as a line (an arc)."""
TARGET_ASPECT = 1.35
"""Width / height the column count aims at (a landscape page)."""
MAX_WIDTH = 30.0
"""The widest figure (in) the column count may make, unless one column is already wider."""
ONE_COLUMN_HEIGHT = 9.0
"""A graph whose levels fit in this height (in) stays in one column, whatever its aspect."""


@dataclass(frozen=True)
class Place:
    """Where item ``index`` goes: its box's centre (``x``, ``y`` downwards), level, column.

    Example:
        >>> layout_dag([[]]).places[0].level
        0
    """

    index: int
    x: float
    y: float
    level: int
    column: int


@dataclass(frozen=True)
class Link:
    """An edge from ``source`` to ``target`` (item indices) and how to draw it.

    Example:
        >>> layout_dag([[], [0]]).links
        [Link(source=0, target=1, route='line', bow=0.0)]
    """

    source: int
    target: int
    route: str
    """``line``, ``arc`` or ``stub`` (see the module doc)."""
    bow: float = 0.0
    """For an arc, drawn from the right side of one box to the right side of the other: how
    far (in) its middle passes to the right of the straight line between them, enough to
    clear the boxes of the widest level in between."""


@dataclass(frozen=True)
class GraphLayout:
    """Every item's place, every edge's route, and the size of the drawing (in).

    Example:
        >>> lay = layout_dag([[], [0], [1]])
        >>> lay.columns, len(lay.places), lay.height > 3 * BOX_HEIGHT
        (1, 3, True)
    """

    places: list[Place]
    links: list[Link]
    width: float
    height: float
    columns: int


def levels_of(parents: Sequence[Sequence[int]]) -> list[int]:
    """The depth of each item (items in topological order).

    Example:
        >>> levels_of([[], [], [0, 1], [2], [0]])
        [0, 0, 1, 2, 1]
    """
    levels: list[int] = []
    for i, ps in enumerate(parents):
        if any(p >= i for p in ps):
            raise ValueError(f"item {i} reads a later item {max(ps)}: the items are not in topological order")
        levels.append(1 + max((levels[p] for p in ps), default=-1))
    return levels


def lanes_of(parents: Sequence[Sequence[int]], levels: Sequence[int]) -> list[list[int]]:
    """The items of each level, left to right: by the mean lane offset of their parents.

    Example:
        >>> lanes_of([[], [], [1], [0]], [0, 0, 1, 1])
        [[0, 1], [3, 2]]
    """
    rows: list[list[int]] = [[] for _ in range(max(levels, default=-1) + 1)]
    for i, level in enumerate(levels):
        rows[level].append(i)
    offset: dict[int, float] = {}
    for row in rows:
        def barycentre(i: int) -> float:
            ps = [offset[p] for p in parents[i]]
            return sum(ps) / len(ps) if ps else 0.0
        row.sort(key=lambda i: (barycentre(i), i))
        for lane, i in enumerate(row):
            offset[i] = lane - (len(row) - 1) / 2
    return rows


def _columns(widths: Sequence[int], count: int) -> list[range]:
    per = math.ceil(len(widths) / count)
    return [range(start, min(start + per, len(widths))) for start in range(0, len(widths), per)]


def _size(widths: Sequence[int], columns: Sequence[range]) -> tuple[float, float]:
    lanes = [max(widths[level] for level in col) for col in columns]
    width = 2 * MARGIN + PITCH_X * sum(lanes) + COLUMN_GAP * (len(columns) - 1)
    return width, 2 * MARGIN + PITCH_Y * max(len(col) for col in columns)


def choose_columns(widths: Sequence[int]) -> list[range]:
    """Cut the levels (``widths[level]``: how many items it holds) into the columns whose
    drawing comes nearest :data:`TARGET_ASPECT` without passing :data:`MAX_WIDTH`.

    Example:
        >>> [len(c) for c in choose_columns([1] * 40)]
        [10, 10, 10, 10]
    """
    if not widths:
        return [range(0)]
    if _size(widths, [range(len(widths))])[1] <= ONE_COLUMN_HEIGHT:
        return [range(len(widths))]
    best: tuple[float, list[range]] | None = None
    for count in range(1, len(widths) + 1):
        columns = _columns(widths, count)
        if len(columns) != count:  # the cut left a column empty: the same as a smaller count
            continue
        width, height = _size(widths, columns)
        if width > MAX_WIDTH and best is not None:
            break
        score = abs(math.log(width / height / TARGET_ASPECT))
        if best is None or score < best[0]:
            best = (score, columns)
    assert best is not None
    return best[1]


def layout_dag(parents: Sequence[Sequence[int]]) -> GraphLayout:
    """Places and routes for the DAG ``parents`` (see the module doc).

    Example:
        >>> lay = layout_dag([[], [0], [0], [1, 2]])
        >>> [(p.level, p.x < lay.width) for p in lay.places][1:3]
        [(1, True), (1, True)]
        >>> lay.places[1].x < lay.places[2].x
        True
    """
    levels = levels_of(parents)
    rows = lanes_of(parents, levels)
    columns = choose_columns([len(r) for r in rows])
    width, height = _size([len(r) for r in rows], columns) if rows else (2 * MARGIN, 2 * MARGIN)
    places: dict[int, Place] = {}
    column_of: dict[int, int] = {}
    left = MARGIN
    for c, col in enumerate(columns):
        lanes = max(len(rows[level]) for level in col)
        centre = left + lanes * PITCH_X / 2
        for k, level in enumerate(col):
            column_of[level] = c
            row = rows[level]
            for lane, i in enumerate(row):
                x = centre + (lane - (len(row) - 1) / 2) * PITCH_X
                places[i] = Place(i, x, MARGIN + (k + 0.5) * PITCH_Y, level, c)
        left += lanes * PITCH_X + COLUMN_GAP
    links = [_route(p, i, places, rows, column_of) for i, ps in enumerate(parents) for p in dict.fromkeys(ps)]
    return GraphLayout([places[i] for i in range(len(parents))], links, width, height, len(columns))


def _route(source: int, target: int, places: dict[int, Place], rows: Sequence[Sequence[int]],
           column_of: dict[int, int]) -> Link:
    a, b = places[source], places[target]
    span = b.level - a.level
    if a.column != b.column or span > ARC_SPAN:
        return Link(source, target, "stub")
    if span == 1:
        return Link(source, target, "line")
    between = max(len(rows[level]) for level in range(a.level + 1, b.level))
    return Link(source, target, "arc", bow=(between * PITCH_X - BOX_WIDTH) / 2 + 0.15)


__all__ = ["ARC_SPAN", "BOX_HEIGHT", "BOX_WIDTH", "ONE_COLUMN_HEIGHT", "PITCH_X", "PITCH_Y", "GraphLayout", "Link",
           "Place", "choose_columns", "lanes_of", "layout_dag", "levels_of"]
