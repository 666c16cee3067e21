"""Compute/communication overlap on a hand-built two-partition graph and on BERT."""

from __future__ import annotations

import pytest

import metadef as md
from metadef.analysis import format_overlap, overlap_report
from metadef.analysis.overlap import OUTPUT
from metadef.core.errors import GraphError
from metadef.ir import parse_graph
from metadef.shape import sym

# cpu: relu, neg, tail | gpu: exp, add.  a (cpu) -> exp (gpu); c (cpu) -> add (gpu);
# z (gpu) -> tail (cpu); w (cpu) is a graph output made on the host: no transfer back.
TWO = """graph two(%x: f32[n,4]) -> (%w) {
  %a: f32[n,4] = Relu(%x) @relu
  %b: f32[n,4] = Exp(%a) @exp
  %c: f32[n,4] = Neg(%x) @neg
  %z: f32[n,4] = Add(%b, %c) @add
  %w: f32[n,4] = Abs(%z) @tail
  return %w
}"""
GPU = {"exp": "gpu", "add": "gpu"}


def summary(report) -> list[tuple]:
    return [(t.value.name, t.src, t.dst, t.consumers, t.overlappable) for t in report.transfers]


def test_two_partitions():
    report = overlap_report(parse_graph(TWO), GPU)
    assert summary(report) == [
        ("a", "cpu", "gpu", ("exp",), ("neg",)),          # neg needs neither a nor anything a needs
        ("c", "cpu", "gpu", ("add",), ("relu", "exp")),   # relu and exp run while c travels
        ("z", "gpu", "cpu", ("tail",), ()),               # everything else feeds z or reads it
    ]
    assert report.partitions == {"cpu": 3, "gpu": 2}
    assert report.transfers[0].size == sym("n") * 16
    assert report.total_bytes == sym("n") * 48
    assert [t.overlap_count for t in report.transfers] == [1, 2, 0]


def test_inputs_live_on_the_host_and_outputs_return_to_it():
    g = parse_graph(TWO)
    report = overlap_report(g, default="gpu")                # every node on gpu, x on the cpu
    assert summary(report) == [
        ("x", "cpu", "gpu", ("relu", "neg"), ()),
        ("w", "gpu", "cpu", (OUTPUT,), ()),
    ]
    accel_host = overlap_report(g, GPU, host="gpu", default="cpu")
    assert accel_host.transfers[0].value.name == "x" and accel_host.transfers[0].src == "gpu"


def test_only_the_partitions_involved_overlap():
    g = parse_graph(TWO)
    report = overlap_report(g, {"exp": "gpu", "add": "gpu", "neg": "npu"})
    by_value = {(t.value.name, t.dst): t for t in report.transfers}
    assert by_value[("a", "gpu")].overlappable == ()                 # neg is on the npu now
    assert by_value[("x", "npu")].overlappable == ()                  # every node depends on x
    assert by_value[("c", "gpu")].src == "npu"


def test_one_partition_has_no_transfers():
    g = parse_graph(TWO)
    report = overlap_report(g)
    assert report.transfers == ()
    assert format_overlap(report) == "graph two: no transfers: all 5 node(s) run on one partition (cpu)"
    assert overlap_report(g, default="gpu", host="gpu").transfers == ()


def test_format_overlap():
    text = format_overlap(overlap_report(parse_graph(TWO), GPU), {"n": 2})
    lines = text.splitlines()
    assert lines[0] == "graph two: 3 transfer(s) (cpu: 3 nodes, gpu: 2 nodes; host cpu)"
    assert lines[1] == "  %a: cpu -> gpu, 32 bytes, read by exp; 1 node(s) can overlap it: neg"
    assert "n*16 bytes" in format_overlap(overlap_report(parse_graph(TWO), GPU))


def test_unknown_node_names_are_refused():
    with pytest.raises(GraphError, match="does not have"):
        overlap_report(parse_graph(TWO), {"nope": "gpu"})


@pytest.mark.slow
def test_bert_embeddings_on_the_host_encoder_on_the_accelerator():
    g = md.import_onnx(md.zoo.build("bert"))
    host_side = ("/embeddings/", "/Unsqueeze", "/Cast", "/Sub", "/Mul")
    assignment = {n.name: "cpu" if n.name.startswith(host_side) else "accel" for n in g.nodes}
    report = overlap_report(g, assignment)
    names = [(t.value.name, t.src, t.dst) for t in report.transfers]
    assert names == [
        ("/embeddings/LayerNorm/Add_1_output_0", "cpu", "accel"),
        ("/Mul_output_0", "cpu", "accel"),
        ("last_hidden_state", "accel", "cpu"),
        ("pooler_output", "accel", "cpu"),
    ]
    hidden, mask, *_ = report.transfers
    assert str(hidden.size) == "batch*seq*3072" and len(hidden.consumers) == 4
    # The mask's five nodes can run while the hidden state travels ...
    assert hidden.overlappable == ("/Unsqueeze", "/Unsqueeze_1", "/Cast", "/Sub", "/Mul")
    # ... and layer 0's projections and scores (not its mask Add) while the mask does.
    assert "/encoder/layer/0/attention/self/MatMul" in mask.overlappable
    assert "/encoder/layer/0/attention/self/Add" not in mask.overlappable
    assert len(mask.overlappable) == 16 + 3 * 11 + 2      # embeddings; q/k/v projections, scores, Div
    assert "4 transfer(s)" in format_overlap(report, {"batch": 1, "seq": 128})
