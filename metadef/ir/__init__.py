"""The graph IR (L3): Graph, Node, Value, the builder, the verifier and the text form.

Example:
    >>> from metadef.ir import parse_graph
    >>> g = parse_graph("graph g(%x: f32[2]) -> (%y) { %y: f32[2] = Relu(%x) return %y }")
    >>> g.nodes[0].op
    'Relu'
"""

from metadef.ir.builder import GraphBuilder
from metadef.ir.graph import Graph, Node, Value
from metadef.ir.printer import format_node, nearby, print_graph
from metadef.ir.text import parse_graph
from metadef.ir.verify import problems, verify

__all__ = ["Graph", "GraphBuilder", "Node", "Value", "format_node", "nearby", "parse_graph",
           "print_graph", "problems", "verify"]
