"""ResNet-50 conv by conv against ONNX Runtime: where our time goes relative to ORT's.

Our side is :meth:`metadef.Session.profile` (each node's units timed one at a time); ORT's is
its own profiler (``enable_profiling``), whose fused convs are named after their outputs
(``/layer3/2/relu/Relu_1_output_0_nchwc`` is the block's second conv and its Relu). The two are
matched by name, rounds of each alternate, and the medians are summed by stage and by the
conv's place in its block (``conv1``, ``conv2``, ``conv3``, ``downsample``; a stage's first
block apart, ``layer2/0``: its strided convs). Both profilers add their own overhead, so only
the ratios mean anything, and only within one run.

    .venv/bin/python bench/x86_convs_vs_ort.py --threads 2
    .venv/bin/python bench/x86_convs_vs_ort.py --threads 1 --rounds 5 --nodes
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import tempfile

import metadef as md

_ORT_NAMES = (
    (re.compile(r"(/layer\d/\d+)/relu/Relu_output_0"), "{}/conv1/Conv_bn/fused"),
    (re.compile(r"(/layer\d/\d+)/relu/Relu_1_output_0"), "{}/conv2/Conv_bn/fused"),
    (re.compile(r"(/layer\d/\d+)/bn3/BatchNormalization_output_0"), "{}/conv3/Conv_bn/fused"),
    (re.compile(r"(/layer\d/\d+)/downsample/1/BatchNormalization_output_0"), "{}/downsample/0/Conv_bn"),
)


def ours_name(ort_name: str) -> str | None:
    """Our node for one of ORT's profiled nodes in torchvision's ResNet-50, or None.

    Example:
        >>> ours_name("/layer3/2/relu/Relu_1_output_0_nchwc"), ours_name("/relu/Relu_output_0_nchwc")
        ('/layer3/2/conv2/Conv_bn/fused', '/conv1/Conv_bn/fused')
    """
    for pattern, ours in _ORT_NAMES:
        m = pattern.match(ort_name)
        if m:
            return ours.format(m.group(1))
    if ort_name.startswith("/relu/Relu_output_0"):
        return "/conv1/Conv_bn/fused"
    if ort_name.startswith("/maxpool"):
        return "/maxpool/MaxPool"
    if "fc" in ort_name or "Gemm" in ort_name:
        return "/fc/Gemm"
    return None


def group(node: str) -> str:
    """The row a node's time is summed into: its stage (a stage's first block apart) and its
    place in the block; the stem, the pool and the classifier by themselves.

    Example:
        >>> group("/layer2/0/conv2/Conv_bn/fused"), group("/layer3/4/conv1/Conv_bn/fused")
        ('layer2/0 conv2', 'layer3 conv1')
    """
    parts = node.split("/")
    if len(parts) > 3 and parts[1].startswith("layer"):
        place = parts[3] if parts[3].startswith("conv") else "downsample"
        return f"{parts[1]}{'/0' if parts[2] == '0' else ''} {place}"
    return node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each profiler")
    parser.add_argument("--runs", type=int, default=10, help="runs a round")
    parser.add_argument("--nodes", action="store_true", help="print every matched node too")
    args = parser.parse_args()

    import onnxruntime as ort  # the peer: only this benchmark needs it

    proto = md.zoo.build("resnet50")
    graph = md.optimize(md.import_onnx(proto), level="aggressive")
    feeds = md.zoo.describe("resnet50").example_inputs(batch=1)
    session = md.compile(graph, target="x86", threads=args.threads, cache=False)
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.intra_op_num_threads = args.threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    peer = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    peer.run(None, feeds)
    ours: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(args.rounds):
        per_node: dict[str, float] = collections.defaultdict(float)
        for row in session.profile(feeds, runs=args.runs).rows:
            per_node[row.node] += row.seconds
        for node, seconds in per_node.items():
            ours[node].append(seconds)
        for _ in range(args.runs):
            peer.run(None, feeds)
    path = peer.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    theirs: dict[str, list[float]] = collections.defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            theirs[event["name"][:-len("_kernel_time")]].append(event["dur"] / 1e6)
    rows = []
    for name, times in theirs.items():
        node = ours_name(name)
        if node is not None and node in ours:
            rows.append((node, statistics.median(ours[node]), statistics.median(times[1:] or times)))
    a, b = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"resnet50, batch 1, {args.threads} thread(s): {len(rows)} nodes matched, ours {a * 1e3:.2f} ms, "
          f"ORT {b * 1e3:.2f} ms (each under its profiler), ratio {a / b:.2f}\n")
    sums: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for node, mine, peer_s in rows:
        sums[group(node)][0] += mine
        sums[group(node)][1] += peer_s
    print("| convs | metadef ms | ORT ms | ratio |\n|---|---|---|---|")
    for key, (mine, peer_s) in sorted(sums.items()):
        print(f"| {key} | {mine * 1e3:.3f} | {peer_s * 1e3:.3f} | {mine / peer_s:.2f} |")
    if args.nodes:
        print("\n| node | metadef ms | ORT ms | ratio |\n|---|---|---|---|")
        for node, mine, peer_s in rows:
            print(f"| {node} | {mine * 1e3:.3f} | {peer_s * 1e3:.3f} | {mine / peer_s:.2f} |")


if __name__ == "__main__":
    main()
