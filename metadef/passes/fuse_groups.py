"""``fuse_groups``: decide the fused groups, from each op's strategy-layer role (TVM's FuseOps).

The pass never looks at an op's name: it reads ``node.metaop.role``.

- A CONTRACTION (Conv, MatMul, Gemm...) or REDUCTION node anchors a group. The anchor absorbs
  the chain of ELEMENTWISE / BROADCAST nodes that follows it (bias Add, activation, a residual
  Add whose other operand comes from outside) while each value inside the chain has exactly
  one consumer (rules ``contraction_epilogue``, ``reduction_epilogue``). A reduction first
  absorbs its elementwise prologue: producers whose outputs are read only inside the group
  (``reduction_prologue``), unless computing one again on each of the anchor's passes over it
  costs more than reading it back (:data:`RECOMPUTE_LIMIT`). An epilogue then absorbs the
  one-input elementwise producers of its other operands that only it reads
  (``epilogue_operands``: a residual Add's dequantization, so the group reads the 8-bit tensor
  instead of a float copy of it written just for it).
- ELEMENTWISE / BROADCAST nodes left over form chains of their own (``elementwise_chain``).
- INJECTIVE nodes (reshape, transpose) end a group; OPAQUE nodes are never grouped; a node
  marked ``no_fuse`` is never absorbed; a group of one node stays as it is.
- Absorbing a node whose other inputs depend on the group would create a cycle: refused (a
  guard: while every value inside a group has one consumer, a group's only exit is its tail,
  so no such path exists; the guard keeps the pass safe if the rules are relaxed).
  A group's inputs keep their own dtypes (a quantized layer reads 8-bit activations and float
  scales; the ``Fused`` node's interface is mixed). A node that reads or writes string
  tensors or whose semantics are opaque is refused (an elementwise op with no index expression, such as
  the Bitwise ops: a group is a unit of code generation, which takes numbers and expressions).

Every candidate goes to ``ctx.log``, taken (with its nodes) or refused (with the reason);
each rule can be disabled by name (``ctx.options.disabled``). Each group becomes one
``ai.metadef::Fused`` node whose ``body`` graph holds the group's original nodes: the values
entering the group are its inputs (weights too; only one-element constants and constants that
shape inference reads, such as reduction axes, stay inside the body), the values leaving it its
outputs, so numerics are exactly those of the unfused graph.

Example:
    >>> from metadef.ir import parse_graph
    >>> from metadef.passes.base import PassContext
    >>> g = parse_graph('''graph g(%x: f32[n,8], %w: f32[8,4], %b: f32[4]) -> (%y) {
    ...   %m: f32[n,4] = MatMul(%x, %w) @mm
    ...   %a: f32[n,4] = Add(%m, %b) @bias
    ...   %y: f32[n,4] = Relu(%a) @relu
    ...   return %y
    ... }''')
    >>> ctx = PassContext()
    >>> new = fuse_groups(g, ctx)
    >>> group_summary(new)
    [('mm/fused', 'contraction+epilogue', ['mm', 'bias', 'relu'])]
    >>> ctx.log.lines()
    ['taken contraction_epilogue at mm (mm, bias, relu)']
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metadef.ir import Graph, Node, Value
from metadef.ops import Role
from metadef.ops.defs.fused import Fused
from metadef.passes.base import PassContext
from metadef.passes.recompute import expression_cost, passes_over
from metadef.rewrite import GraphEditor

PASS_NAME = "fuse_groups"
CHAIN_ROLES = frozenset({Role.ELEMENTWISE, Role.BROADCAST})
# The rules an anchor grows by, by the anchor's role: (prologue rule or None, epilogue rule).
anchor_rules: dict[Role, tuple[str | None, str]] = {
    Role.CONTRACTION: (None, "contraction_epilogue"),
    Role.REDUCTION: ("reduction_prologue", "reduction_epilogue"),
}
CHAIN_RULE = "elementwise_chain"
OPERANDS_RULE = "epilogue_operands"
RULES = ("contraction_epilogue", "reduction_prologue", "reduction_epilogue", OPERANDS_RULE, CHAIN_RULE)


@dataclass(eq=False)
class _Group:
    """A group being grown: its anchor, its members, and what the Fused node will need."""

    anchor: Node
    members: dict[int, Node] = field(default_factory=dict)
    first: int = 0            # the smallest position of a member (prunes the cycle search)
    tail: Node | None = None  # the member whose output the epilogue continues from
    operands: list[Node] = field(default_factory=list)  # (epilogue_operands: listed after the anchor)
    parts: list[str] = field(default_factory=list)

    def names(self, *more: Node) -> list[str]:
        return [n.name for n in self.members.values()] + [n.name for n in more]

    @property
    def kind(self) -> str:
        return "+".join(self.parts)


def _opaque(node: Node) -> str | None:
    """Why ``node`` cannot join a group for having no index expression, or None."""
    if node.metaop.semantics.opaque:
        return f"{node.name} ({node.qualop}) has no index expression to generate code from"
    return None


RECOMPUTE_LIMIT = 8
"""The most extra operations an element a reduction's prologue node may cost by being computed
on each of the anchor's passes (its :func:`~metadef.passes.recompute.expression_cost` times the
passes less one); past it the node stays outside, computed once and read back. A float mask's
``Add`` (1) or a ``DequantizeLinear`` (3) inside a softmax (3 passes) costs 2 or 6 and joins;
a ``QLinearAdd`` (27: two dequantizations and a requantization) does not: inside the softmax of
QOperator BERT's attention it made the group 0.18 -> 0.44 ms a layer."""


def _recomputed(node: Node, passes: int, anchor: Node) -> str | None:
    """Why ``node`` should not be inlined into ``passes`` passes of ``anchor``, or None."""
    if passes < 2:
        return None
    cost = expression_cost(node)
    if cost is None or cost * (passes - 1) <= RECOMPUTE_LIMIT:
        return None
    return (f"{node.name} costs about {cost} operations an element and {anchor.name} reads it on {passes} passes: "
            "computed once outside instead")


def _strings_of(node: Node) -> str | None:
    """Why ``node`` cannot be in a group because of string tensors (None: it has none)."""
    names = [f"%{v.name}" for v in (*node.inputs, *node.outputs)
             if v is not None and v.type is not None and v.type.dtype.is_string]
    if not names:
        return None
    return f"{node.name} reads or writes string tensors ({', '.join(names[:3])}); code generation takes numbers"


def _stays_inside(node: Node, index: int, v: Value) -> bool:
    """Whether a constant read by a member is kept in the body rather than made an input:
    scalars (eps, clip bounds, exponents) and values shape inference reads (axes, shapes), but
    not the scalars the op's code reads at run time (:func:`_passed`)."""
    return v.const is not None and (v.const.size <= 1 or index in node.metaop.reads) and not _passed(node, index, v)


def _passed(node: Node, index: int, v: Value) -> bool:
    """Whether ``v`` is a one-element constant that ``node`` reads at run time (a quantized
    layer's scale: :attr:`~metadef.ops.strategy.Strategy.passed`): an input of the body that
    keeps its value (shape inference and the semantics may read it)."""
    return v.const is not None and v.const.size <= 1 and index in node.metaop.strategy.passed


class _Planner:
    """Decides the groups of one graph (nothing is edited here)."""

    def __init__(self, graph: Graph, ctx: PassContext) -> None:
        self.ctx = ctx
        self.position = {id(n): i for i, n in enumerate(graph.nodes)}
        self.readers: dict[int, list[Node]] = {}
        for n in graph.nodes:
            for v in {id(v): v for v in n.inputs if v is not None}.values():
                self.readers.setdefault(id(v), []).append(n)
        self.graph_outputs = {id(v) for v in graph.outputs}
        self.group_of: dict[int, _Group] = {}
        self.nodes = graph.nodes

    # --- questions -----------------------------------------------------------------------
    def uses(self, v: Value) -> int:
        """Consumers of ``v``: the nodes that read it, plus one when it is a graph output."""
        return len(self.readers.get(id(v), ())) + (id(v) in self.graph_outputs)

    def exits(self, node: Node) -> list[Value]:
        return [o for o in node.outputs if self.uses(o)]

    def blocked(self, group: _Group, rule: str, node: Node) -> str | None:
        """Why ``node`` may not join ``group`` under ``rule`` (None: it may)."""
        if rule in self.ctx.options.disabled:
            return f"rule {rule} is disabled"
        if node.meta.get("no_fuse"):
            return f"{node.name} is marked no_fuse"
        other = self.group_of.get(id(node))
        if other is not None:
            return f"{node.name} is already in the group of {other.anchor.name}"
        text = _strings_of(node) or _opaque(node)
        if text is not None:
            return text
        return None

    def reaches_group(self, start: Node | None, group: _Group) -> bool:
        """Whether ``start`` depends on a member of ``group`` (absorbing it: a cycle)."""
        stack, seen = [start], set()
        while stack:
            n = stack.pop()
            if n is None or id(n) in seen or self.position[id(n)] < group.first:
                continue
            if id(n) in group.members:
                return True
            seen.add(id(n))
            stack.extend(v.producer for v in n.inputs if v is not None)
        return False

    # --- growing -------------------------------------------------------------------------
    def absorb(self, group: _Group, node: Node) -> None:
        group.members[id(node)] = node
        group.first = min(group.first, self.position[id(node)])
        self.group_of[id(node)] = group

    def refuse(self, group: _Group, rule: str, node: Node, reason: str) -> None:
        self.ctx.log.record(PASS_NAME, rule, group.anchor.name, group.names(node), False, reason)

    def grow_epilogue(self, group: _Group, rule: str) -> list[Node]:
        """Absorb the chain of elementwise consumers after ``group.tail``; returns it."""
        chain: list[Node] = []
        while True:
            used = self.exits(group.tail)
            if len(used) != 1:
                return chain
            v = used[0]
            readers = self.readers.get(id(v), [])
            candidates = [r for r in readers if r.metaop.role in CHAIN_ROLES]
            if not candidates:
                return chain
            if self.uses(v) > 1:
                out = " (one is a graph output)" if id(v) in self.graph_outputs else ""
                self.refuse(group, rule, candidates[0], f"%{v.name} has {self.uses(v)} consumers{out}")
                return chain
            node = readers[0]
            reason = self.blocked(group, rule, node)
            if reason is None and any(self.reaches_group(u.producer, group) for u in node.inputs
                                      if u is not None and u is not v):
                reason = f"absorbing {node.name} would create a cycle"
            if reason is not None:
                self.refuse(group, rule, node, reason)
                return chain
            self.absorb(group, node)
            group.tail = node
            chain.append(node)

    def read_outside(self, group: _Group, node: Node) -> Value | None:
        """An output of ``node`` read outside ``group`` (or a graph output), if any."""
        for o in node.outputs:
            if id(o) in self.graph_outputs or any(id(r) not in group.members
                                                  for r in self.readers.get(id(o), ())):
                return o
        return None

    def grow_prologue(self, group: _Group, rule: str) -> list[Node]:
        """Absorb elementwise producers whose outputs are read only inside the group. A
        producer read by another candidate is looked at again when that one joins (a diamond);
        it is refused only if it is still read outside at the end."""
        absorbed: list[Node] = []
        anchor = group.anchor
        frontier = [(anchor, [passes_over(anchor, i) if v is not None and v.const is None else 1
                              for i, v in enumerate(anchor.inputs)])]
        waiting: dict[int, Node] = {}
        while frontier:
            member, passes = frontier.pop()
            for v, times in zip(member.inputs, passes):
                node = None if v is None else v.producer
                if node is None or node.metaop.role not in CHAIN_ROLES or id(node) in group.members:
                    continue
                reason = self.blocked(group, rule, node) or _recomputed(node, times, anchor)
                if reason is not None:
                    self.refuse(group, rule, node, reason)
                elif self.read_outside(group, node) is not None:
                    waiting[id(node)] = node
                else:
                    waiting.pop(id(node), None)
                    self.absorb(group, node)
                    absorbed.append(node)
                    frontier.append((node, [times] * len(node.inputs)))
        for node in waiting.values():
            out = self.read_outside(group, node)
            self.refuse(group, rule, node, f"%{out.name} has {self.uses(out)} consumers")
        return absorbed

    def grow_operands(self, group: _Group, epilogue: list[Node]) -> list[Node]:
        """Absorb the producers of the epilogue's other operands that are elementwise, read one
        computed value (the rest constants) and are read only by the epilogue."""
        absorbed: list[Node] = []
        tail = {id(n) for n in epilogue}
        for member in epilogue:
            for v in member.inputs:
                node = None if v is None else v.producer
                if node is None or id(node) in group.members or node.metaop.role not in CHAIN_ROLES \
                        or sum(u is not None and u.const is None for u in node.inputs) != 1 \
                        or id(node) in self.group_of or not all(
                            id(r) in tail for o in node.outputs for r in self.readers.get(id(o), ())) \
                        or any(id(o) in self.graph_outputs for o in node.outputs):
                    continue
                reason = self.blocked(group, OPERANDS_RULE, node)
                if reason is None and any(self.reaches_group(u.producer, group) for u in node.inputs if u is not None):
                    reason = f"absorbing {node.name} would create a cycle"
                if reason is not None:
                    self.refuse(group, OPERANDS_RULE, node, reason)
                    continue
                self.absorb(group, node)
                absorbed.append(node)
        group.operands = absorbed
        return absorbed

    def start(self, anchor: Node) -> _Group:
        group = _Group(anchor, first=self.position[id(anchor)], tail=anchor)
        self.absorb(group, anchor)
        return group

    def take(self, group: _Group, rule: str, nodes: list[Node]) -> None:
        self.ctx.log.record(PASS_NAME, rule, group.anchor.name, [n.name for n in nodes], True)

    def anchored(self, anchor: Node) -> _Group | None:
        prologue_rule, epilogue_rule = anchor_rules[anchor.metaop.role]
        if anchor.meta.get("no_fuse"):
            if any(r.metaop.role in CHAIN_ROLES for o in anchor.outputs for r in self.readers.get(id(o), ())):
                self.ctx.log.record(PASS_NAME, epilogue_rule, anchor.name, [anchor.name], False,
                                    f"{anchor.name} is marked no_fuse")
            return None
        group = self.start(anchor)
        if prologue_rule is not None:
            prologue = self.grow_prologue(group, prologue_rule)
            if prologue:
                group.parts.append("prologue")
                self.take(group, prologue_rule, sorted(prologue, key=self.sort_key) + [anchor])
        group.parts.append(anchor.metaop.role.value)
        epilogue = self.grow_epilogue(group, epilogue_rule)
        if epilogue:
            group.parts.append("epilogue")
            self.take(group, epilogue_rule, [anchor] + epilogue)
            operands = self.grow_operands(group, epilogue)
            if operands:
                self.take(group, OPERANDS_RULE, sorted(operands, key=self.sort_key) + epilogue)
        return group

    def chained(self, head: Node) -> _Group | None:
        if head.meta.get("no_fuse"):
            return None
        text = _strings_of(head) or _opaque(head)
        if text is not None:
            self.ctx.log.record(PASS_NAME, CHAIN_RULE, head.name, [head.name], False, text)
            return None
        group = self.start(head)
        group.parts.append("elementwise")
        chain = self.grow_epilogue(group, CHAIN_RULE)
        if chain:
            self.take(group, CHAIN_RULE, [head] + chain)
        return group

    def sort_key(self, node: Node) -> int:
        return self.position[id(node)]

    def plan(self) -> list[_Group]:
        """Anchored groups first (in graph order), then chains of what is left."""
        groups = []
        for node in self.nodes:
            if node.metaop.role in anchor_rules and id(node) not in self.group_of:
                groups.append(self.anchored(node))
        for node in self.nodes:
            if node.metaop.role in CHAIN_ROLES and id(node) not in self.group_of:
                groups.append(self.chained(node))
        return [g for g in groups if g is not None and len(g.members) > 1]


# --- building the Fused nodes ----------------------------------------------------------------


def _body_value(node: Node, index: int, v: Value | None, inner: dict[int, Value], inputs: list[Value],
                outer: list[Value], constants: list[Value]) -> Value | None:
    """The body's value for an outer value read by a member (made on first read)."""
    if v is None:
        return None
    got = inner.get(id(v))
    if got is None:
        if _stays_inside(node, index, v):
            got = Value(v.name, v.type, v.const)
            constants.append(got)
        else:
            got = Value(v.name, v.type, v.const if _passed(node, index, v) else None)
            inputs.append(got)
            outer.append(v)
        inner[id(v)] = got
    return got


def _fuse(graph: Graph, group: _Group, planner: _Planner, name: str) -> Node:
    """Move the group's nodes into a body graph; returns the Fused node that replaces them."""
    members = sorted(group.members.values(), key=planner.sort_key)
    if group.operands:  # (read by the epilogue only: the body keeps its anchor first)
        members = [m for m in members if m not in group.operands]
        at = members.index(group.anchor) + 1
        members[at:at] = sorted(group.operands, key=planner.sort_key)
    inner: dict[int, Value] = {}
    inputs: list[Value] = []
    outer: list[Value] = []
    constants: list[Value] = []
    leaving: list[Value] = []
    for m in members:
        m.inputs = tuple(_body_value(m, i, v, inner, inputs, outer, constants) for i, v in enumerate(m.inputs))
        outs = []
        for o in m.outputs:
            inner[id(o)] = Value(o.name, o.type, producer=m)
            outs.append(inner[id(o)])
            if id(o) in planner.graph_outputs or any(
                    id(r) not in group.members for r in planner.readers.get(id(o), ())):
                leaving.append(o)
        m.outputs = tuple(outs)
    body = Graph(name, inputs, [inner[id(o)] for o in leaving], members, constants,
                 dict(graph.opset), graph.env)
    attrs = {"body": body, "kind": group.kind}
    node = Node(Fused.name, tuple(outer), tuple(leaving), attrs, name, Fused.domain,
                meta={"anchor": group.anchor.name})
    for o in leaving:
        o.producer = node
    return node


def fuse_groups(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph in which each fused group is one ``Fused`` node (see the module doc)."""
    work = graph.clone()
    planner = _Planner(work, ctx)
    groups = planner.plan()
    ed = GraphEditor(work)
    last = {id(max(g.members.values(), key=planner.sort_key)): g for g in groups}
    nodes = []
    for n in work.nodes:
        group = planner.group_of.get(id(n))
        if group is None or len(group.members) < 2:
            nodes.append(n)
        elif id(n) in last:
            nodes.append(_fuse(work, group, planner, ed.unique(f"{group.anchor.name or 'group'}/fused")))
    work.nodes = nodes
    return ed.finish()


def group_summary(graph: Graph) -> list[tuple[str, str, list[str]]]:
    """Each Fused node of ``graph``: (its name, its kind, the names of the nodes in its body)."""
    return [(n.name, n.attrs.get("kind", ""), [m.name for m in n.attrs["body"].nodes])
            for n in graph.nodes if n.metaop is Fused]


__all__ = ["CHAIN_ROLES", "PASS_NAME", "RULES", "anchor_rules", "fuse_groups", "group_summary"]
