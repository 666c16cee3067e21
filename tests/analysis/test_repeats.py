"""Repeated subgraphs: tiny hand-written graphs, a shuffled order, and the zoo models."""

from __future__ import annotations

import dataclasses
import functools
import random

import numpy as np
import pytest

import metadef as md
from metadef.analysis import find_repeats, format_repeats, is_topological
from metadef.analysis.repeats import RepeatInstance, node_key, periodic_regions, signature
from metadef.ir import GraphBuilder, parse_graph
from metadef.shape import parse_type


@functools.cache
def zoo_graph(name: str) -> md.Graph:
    return md.import_onnx(md.zoo.build(name))


def chain(blocks: int, preamble: str = "  %e0: f32[n,4] = Exp(%x) @pre\n", name: str = "/blk") -> md.Graph:
    """``blocks`` residual blocks e_{i+1} = e_i + relu(e_i) * sigmoid(relu(e_i)), each also reading %g."""
    body = "".join(
        f"  %r{i}: f32[n,4] = Relu(%e{i}) @{name}/{i}/relu\n"
        f"  %s{i}: f32[n,4] = Sigmoid(%r{i}) @{name}/{i}/sig\n"
        f"  %m{i}: f32[n,4] = Mul(%r{i}, %s{i}) @{name}/{i}/mul\n"
        f"  %t{i}: f32[n,4] = Mul(%m{i}, %g) @{name}/{i}/gate\n"
        f"  %e{i + 1}: f32[n,4] = Add(%t{i}, %e{i}) @{name}/{i}/add\n"
        for i in range(blocks))
    return parse_graph(f"graph g(%x: f32[n,4], %g: f32[n,4]) -> (%e{blocks}) {{\n{preamble}{body}"
                       f"  return %e{blocks}\n}}")


def test_a_chain_of_blocks_is_one_group():
    g = chain(3, "  %e0: f32[n,4] = Exp(%x) @pre\n")
    groups = find_repeats(g)
    assert [(grp.count, grp.size) for grp in groups] == [(3, 5)]
    first, second, _ = groups[0].instances
    assert [n.name for n in first.nodes] == ["/blk/0/relu", "/blk/0/sig", "/blk/0/mul", "/blk/0/gate", "/blk/0/add"]
    assert [v.name for v in first.inputs] == ["e0", "g"]        # the first block reads the preamble
    assert [v.name for v in second.inputs] == ["e1", "g"]       # the others read the previous block
    assert [v.name for v in second.outputs] == ["e2"]
    assert [i.scope for i in groups[0].instances] == ["/blk/0", "/blk/1", "/blk/2"]


def test_the_instance_boundary_follows_the_blocks_not_a_shifted_phase():
    # The preamble ends with an Add like the blocks do: a phase shifted by one covers as many nodes.
    g = chain(4, "  %e0: f32[n,4] = Add(%x, %g) @pre/add\n")
    groups = find_repeats(g)
    assert [(grp.count, grp.size) for grp in groups] == [(4, 5)]
    assert [i.nodes[0].name for i in groups[0].instances] == [f"/blk/{i}/relu" for i in range(4)]


def test_weights_may_differ_shapes_may_not():
    b = GraphBuilder("mlp")
    h = b.input("x", parse_type("f32[n,8]"))
    widths = [8, 8, 8, 16]
    for k, w in enumerate(widths):
        weight = b.const(f"w{k}", np.full((h.type.shape[1], w), k, np.float32))
        bias = b.const(f"b{k}", np.full((w,), k, np.float32))
        mm, = b.node("MatMul", [h, weight], name=f"/fc{k}/MatMul")
        add, = b.node("Add", [mm, bias], name=f"/fc{k}/Add")
        act, = b.node("Relu", [add], name=f"/fc{k}/Relu")
        h, = b.node("Tanh", [act], name=f"/fc{k}/Tanh")
    b.output(h)
    groups = find_repeats(b.build())
    assert [(grp.count, grp.size) for grp in groups] == [(3, 4)]   # the 8 -> 16 layer differs
    assert [len(i.params) for i in groups[0].instances] == [2, 2, 2]


def pairs(count: int) -> md.Graph:
    body = "".join(f"  %a{i}: f32[n] = Relu(%x{i})\n  %x{i + 1}: f32[n] = Exp(%a{i})\n" for i in range(count))
    return parse_graph(f"graph g(%x0: f32[n]) -> (%x{count}) {{\n{body}  return %x{count}\n}}")


def test_min_nodes():
    assert find_repeats(pairs(3)) == []                              # 6 nodes: no two 4-node instances
    assert [(grp.count, grp.size) for grp in find_repeats(pairs(3), min_nodes=2)] == [(3, 2)]
    assert [(grp.count, grp.size) for grp in find_repeats(pairs(4))] == [(2, 4)]


def test_blocks_interleaved_with_unrelated_nodes_are_found():
    """The graph's order interleaves the blocks with a side chain of distinct ops."""
    b = GraphBuilder("interleaved")
    e = b.input("x", parse_type("f32[n,4]"))
    side = e
    side_ops = iter(["Exp", "Neg", "Abs", "Sqrt", "Tanh", "Sin", "Cos", "Floor", "Ceil", "Sign", "Erf", "Round"])
    for i in range(3):
        r, = b.node("Relu", [e], name=f"/b/{i}/relu")
        side, = b.node(next(side_ops), [side])
        s, = b.node("Sigmoid", [r], name=f"/b/{i}/sig")
        side, = b.node(next(side_ops), [side])
        m, = b.node("Mul", [r, s], name=f"/b/{i}/mul")
        side, = b.node(next(side_ops), [side])
        e, = b.node("Add", [m, e], name=f"/b/{i}/add")
        side, = b.node(next(side_ops), [side])
    out, = b.node("Add", [e, side], name="/join")
    b.output(out)
    groups = find_repeats(b.build())
    assert [(grp.count, grp.size) for grp in groups] == [(3, 4)]
    assert [i.scope for i in groups[0].instances] == ["/b/0", "/b/1", "/b/2"]


def test_signatures_and_keys():
    g = chain(3)
    groups = find_repeats(g)
    first, second, _ = groups[0].instances
    assert signature(first) == signature(second) == groups[0].signature
    other = RepeatInstance(first.nodes[::-1], (), (), ())
    assert signature(other) != signature(first)
    assert node_key(first.nodes[0]) == "Relu() f32[n,4] -> f32[n,4]"
    assert periodic_regions(np.array([5, 1, 2, 3, 1, 2, 3, 1, 2, 3, 4]), 3) == [(3, 1, 10)]


def test_format_repeats():
    text = format_repeats(find_repeats(chain(3)))
    assert text.splitlines()[0].startswith("3 x 5 nodes: /blk/0, /blk/1, /blk/2")
    assert "1 group(s) cover 15 nodes; 5 to compile" in text
    assert format_repeats([]) == "no repeated subgraphs"


def random_topological(g: md.Graph, seed: int) -> md.Graph:
    """The same graph with its nodes listed in a random topological order."""
    rng = random.Random(seed)
    users = g.consumers()
    waiting = {id(n): len({id(v.producer) for v in n.inputs if v is not None and v.producer is not None})
               for n in g.nodes}
    ready = [n for n in g.nodes if waiting[id(n)] == 0]
    order = []
    while ready:
        node = ready.pop(rng.randrange(len(ready)))
        order.append(node)
        for o in node.outputs:
            for user in {id(u): u for u in users.get(id(o), [])}.values():
                waiting[id(user)] -= 1
                if waiting[id(user)] == 0:
                    ready.append(user)
    shuffled = dataclasses.replace(g, nodes=order)
    assert is_topological(shuffled, order)
    return shuffled


# -- the zoo -------------------------------------------------------------------------------

def scopes(group) -> list[str]:
    return [i.scope for i in group.instances]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [None, 0])
def test_bert_has_one_group_of_twelve_layers(seed: int | None):
    g = zoo_graph("bert")
    if seed is not None:
        g = random_topological(g, seed)
    groups = find_repeats(g)
    assert len(groups) == 1
    layers = groups[0]
    assert (layers.count, layers.size) == (12, 78)
    assert scopes(layers) == [f"/encoder/layer/{k}" for k in range(12)]
    for k, inst in enumerate(layers.instances):
        assert all(n.name.startswith(f"/encoder/layer/{k}/") for n in inst.nodes)
        assert (len(inst.inputs), len(inst.outputs), len(inst.params)) == (2, 1, 51)   # 16 weights, 35 small constants
    assert format_repeats(groups).startswith("12 x 78 nodes: /encoder/layer/0 ... /encoder/layer/11")


@pytest.mark.parametrize("seed", [None, 1])
def test_resnet50_identity_blocks_per_stage(seed: int | None):
    g = zoo_graph("resnet50")
    if seed is not None:
        g = random_topological(g, seed)
    found = {tuple(scopes(grp)) for grp in find_repeats(g)}
    assert found == {
        ("/layer1/1", "/layer1/2"),
        ("/layer2/1", "/layer2/2", "/layer2/3"),
        ("/layer3/1", "/layer3/2", "/layer3/3", "/layer3/4", "/layer3/5"),
        ("/layer4/1", "/layer4/2"),
    }


def test_mobilenetv2_inverted_residual_blocks():
    groups = find_repeats(zoo_graph("mobilenetv2"))
    assert [(grp.count, grp.size) for grp in groups] == [(3, 9), (2, 9), (2, 9), (2, 9)]
    assert scopes(groups[0]) == ["/features/8", "/features/9", "/features/10"]
    assert {tuple(scopes(grp)) for grp in groups[1:]} == {
        ("/features/5", "/features/6"), ("/features/12", "/features/13"), ("/features/15", "/features/16")}


def test_mlp_has_no_repeats():
    assert find_repeats(zoo_graph("mlp")) == []
