"""``decompose``: ops the backends have no fast form of, as ops they do (``decompose_rules``).

- ``groupnorm_as_layernorm``: GroupNormalization is a LayerNormalization over each group's
  elements: ``X`` reshaped to ``[N, G, -1]``, normalized over its last axis (the same mean,
  the same population variance, ``epsilon`` and stash type), reshaped back, then scaled and
  shifted per channel. Its index expression reads channel ``g * C/G + c`` (no generated code),
  so the node ran on its reference (2.5x ONNX Runtime's time on ``[8, 64, 56, 56]``, 32
  groups); LayerNormalization and the per-channel affine map generate code. Opset 18's scale
  and bias per group are repeated per channel when they are constants.
- ``tile_as_expand``: ``Tile(x, repeats)`` with constant repeats tiling one axis a few times is
  a Concat of that many copies of ``x`` (native block copies); otherwise ``x`` with a new axis
  of length 1 before each tiled one, expanded to the repeats there, and reshaped to the tiled
  shape (the input's times the repeats). It ran on its reference: 4-8x ONNX Runtime's time.

- ``conv1d_as_conv2d``: a 1-D Conv with constant weights is a 2-D one over planes of one row
  (an Unsqueeze, the weights as ``[O, C/g, 1, k]``, a Squeeze: views), so it takes the 2-D
  convs' kernels (1.10-1.14x ONNX Runtime's time as a 1-D im2col + sgemm; 0.96-1.01 as 2-D);
  ``sink_squeeze`` moves an elementwise op of the Squeeze (and one-element constants) before
  it, where it fuses into the conv, and ``fold_squeeze_pair`` cancels the Squeeze and
  Unsqueeze between two such convs.
- ``conv3d_as_conv2d``: a 3-D Conv with constant weights over known channels and volume is a
  sum of 2-D Convs, one a depth tap: the input transposed depth-first (``[N, D, C, H, W]``),
  padded in depth, each tap's planes taken by a strided Slice as ``N * D_out`` images of the
  tap's 2-D conv, the sum (each Add a residual in the next conv's stores) transposed back. It
  ran as a numpy im2col from Python, 3.3x ONNX Runtime's time on ``[2, 16, 16, 32, 32]`` (3x3x3);
  as 2-D convs 0.6x.
- ``dilated_as_dense``: a stride-1 2-D Conv dilated by ``d`` is a dense conv over the input's
  ``d * d`` phases (rows and columns modulo ``d``) taken as a batch, between two transposes, so
  a dilated 3x3 conv takes Winograd (planes and pads known multiples of ``d``, phases of at
  least :data:`PHASE_PIXELS`).
- ``qlinear_concat_as_concat``: ONNX Runtime's ``QLinearConcat`` is a ``Concat`` of its inputs,
  each requantized to the output's scale and zero point (``DequantizeLinear`` then
  ``QuantizeLinear``, the reference's steps; an input already at them taken as it is): native
  copies and generated kernels, where it ran on its numpy reference. The bytes are the same.
- ``blocks_as_transpose``: DepthToSpace and SpaceToDepth are, by their definition, a Reshape to
  6-D, a Transpose and a Reshape back: views and one transpose kernel (they ran on their
  reference: 1.4x and 3.1x ONNX Runtime's time).

All run at the ``aggressive`` level (numerics change by rounding only: the group's statistics
are summed in another order). Every decision goes to the log.

Example:
    >>> from metadef.ir import parse_graph
    >>> from metadef.passes.base import PassContext
    >>> g = parse_graph('''graph g(%x: f32[n,4,8]) -> (%y) {
    ...   %r: i64[3] = const [1, 2, 20]
    ...   %y: f32[n,8,160] = Tile(%x, %r) @tile
    ...   return %y
    ... }''')
    >>> ctx = PassContext()
    >>> [n.op for n in decompose(g, ctx).nodes], ctx.log.lines()
    (['Unsqueeze', 'Expand', 'Shape', 'Mul', 'Reshape'], ['taken tile_as_expand at tile'])
"""

from __future__ import annotations

import numpy as np

from metadef.ir import Graph, Value
from metadef.ops import Role
from metadef.passes.base import PassContext
from metadef.passes.simplify import take_name
from metadef.rewrite import GraphEditor, Match, Refusal, Rule, const, op, rewrite
from metadef.rewrite.engine import Built


def _groupnorm(m: Match, ed: GraphEditor) -> Built:
    node = m.node("root")
    x, scale, bias = node.inputs[:3]
    if x is None or x.type is None or x.type.shape is None or len(x.type.shape) < 3 or scale is None or bias is None:
        return Refusal("the input's rank (3 or more) or the scale and bias are unknown")
    channels, groups = x.type.shape[1], int(node.attrs["num_groups"])
    if not isinstance(channels, int) or groups <= 0 or channels % groups:
        return Refusal(f"the channels ({channels}) are not known to split into {groups} groups")
    rank, dtype = len(x.type.shape), x.type.dtype.numpy
    per_group = []
    for v in (scale, bias):  # (every refusal before the first node is added)
        if v.type is None or v.type.shape is None or len(v.type.shape) != 1:
            return Refusal(f"%{v.name} is not a vector")
        per_group.append(v.type.shape[0] == groups and groups != channels)  # opset 18: one value a group
        if per_group[-1] and v.const is None:
            return Refusal(f"%{v.name} holds a value per group and is not a constant")
    column = (channels,) + (1,) * (rank - 2)
    shape = None if all(per_group) else ed.const(f"{node.name}_affine_shape", np.array(column, np.int64))
    affine = [ed.const(f"{v.name}_per_channel", np.repeat(np.asarray(v.const), channels // groups)
                       .reshape(column).astype(dtype)) if grouped_values
              else ed.add("Reshape", [v, shape], name=f"{node.name}/{v.name}_per_channel")[0]
              for v, grouped_values in zip((scale, bias), per_group)]
    stash = int(node.attrs.get("stash_type", 1))
    grouped = ed.const(f"{node.name}_groups", np.array([0, groups, -1], np.int64))
    r, = ed.add("Reshape", [x, grouped], name=f"{node.name}/groups")
    one, zero = ed.const(f"{node.name}_one", np.ones(1, dtype)), ed.const(f"{node.name}_zero", np.zeros(1, dtype))
    normalized, = ed.add("LayerNormalization", [r, one, zero],
                         {"axis": -1, "epsilon": float(node.attrs.get("epsilon", 1e-5)), "stash_type": stash},
                         name=f"{node.name}/normalize", n_outputs=1)
    shape, = ed.add("Shape", [x], name=f"{node.name}/shape")
    back, = ed.add("Reshape", [normalized, shape], name=f"{node.name}/ungroup", types=[x.type])
    scaled, = ed.add("Mul", [back, affine[0]], name=f"{node.name}/scale")
    out, = ed.add("Add", [scaled, affine[1]], name=node.name, meta=dict(node.meta))
    take_name(out, node)
    return out


CONCAT_COPIES = 16
"""A Tile of one axis by at most this many is a Concat of that many copies (whole blocks of
rows, copied natively); more, or several axes, an Expand of a new axis."""


def _tile(m: Match, ed: GraphEditor) -> Built:
    node = m.node("root")
    x, repeats = node.inputs[0], node.inputs[1]
    if x is None or x.type is None or x.type.shape is None or repeats is None or repeats.const is None:
        return Refusal("the repeats are not a constant, or the input's shape is unknown")
    reps = [int(r) for r in np.asarray(repeats.const).reshape(-1)]
    if len(reps) != len(x.type.shape) or any(r < 1 for r in reps):
        return Refusal(f"repeats {reps} for a rank-{len(x.type.shape)} input")
    if all(r == 1 for r in reps):
        return None  # (a copy: simplify's business)
    tiled = [k for k, r in enumerate(reps) if r > 1]
    if len(tiled) == 1 and reps[tiled[0]] <= CONCAT_COPIES:  # one axis: copies side by side
        out, = ed.add("Concat", [x] * reps[tiled[0]], {"axis": tiled[0]}, name=node.name, meta=dict(node.meta))
        take_name(out, node)
        return out
    axes = [k + i for i, k in enumerate(tiled)]  # a new axis before each tiled one
    u, = ed.add("Unsqueeze", [x, ed.const(f"{node.name}_axes", np.array(axes, np.int64))], name=f"{node.name}/axes")
    sizes = []
    for r in reps:
        sizes += [r, 1] if r > 1 else [1]  # (Expand broadcasts the 1s to the input's own dims)
    e, = ed.add("Expand", [u, ed.const(f"{node.name}_sizes", np.array(sizes, np.int64))], name=f"{node.name}/expand")
    shape_of, = ed.add("Shape", [x], name=f"{node.name}/shape")
    target, = ed.add("Mul", [shape_of, ed.const(f"{node.name}_repeats", np.array(reps, np.int64))],
                     name=f"{node.name}/tiled_shape")
    out, = ed.add("Reshape", [e, target], name=node.name, meta=dict(node.meta),
                  types=None if node.outputs[0].type is None else [node.outputs[0].type])
    take_name(out, node)
    return out


def _blocks(m: Match, ed: GraphEditor) -> Built:
    """DepthToSpace (DCR or CRD) and SpaceToDepth as Reshape, Transpose, Reshape (the ONNX
    spec's own definition), for a 4-D input whose channels and planes are known."""
    node = m.node("root")
    x, b = node.inputs[0], int(node.attrs["blocksize"])
    shape = None if x is None or x.type is None else x.type.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]):
        return Refusal("the input is not 4-D with known channels and planes")
    _, c, h, w = shape
    if node.op == "SpaceToDepth":
        if h % b or w % b:
            return Refusal(f"the planes ({h}x{w}) do not split into blocks of {b}")
        split, perm, joined = [-1, c, h // b, b, w // b, b], [0, 3, 5, 1, 2, 4], [-1, c * b * b, h // b, w // b]
    else:
        if c % (b * b):
            return Refusal(f"the channels ({c}) do not split into blocks of {b}x{b}")
        depth = c // (b * b)
        if node.attrs.get("mode", "DCR") == "CRD":
            split, perm = [-1, depth, b, b, h, w], [0, 1, 4, 2, 5, 3]
        else:
            split, perm = [-1, b, b, depth, h, w], [0, 3, 4, 1, 5, 2]
        joined = [-1, depth, h * b, w * b]
    r, = ed.add("Reshape", [x, ed.const(f"{node.name}_split", np.array(split, np.int64))], name=f"{node.name}/split")
    t, = ed.add("Transpose", [r], {"perm": perm}, name=f"{node.name}/move")
    out, = ed.add("Reshape", [t, ed.const(f"{node.name}_joined", np.array(joined, np.int64))], name=node.name,
                  meta=dict(node.meta))
    take_name(out, node)
    return out


def _conv1d(m: Match, ed: GraphEditor) -> Built:
    """A 1-D Conv with constant weights as a 2-D one over planes of one row: ``x`` unsqueezed at
    axis 2, the weights reshaped to ``[O, C/g, 1, k]``, the output squeezed back."""
    node = m.node("root")
    x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if x is None or x.type is None or x.type.shape is None or len(x.type.shape) != 3:
        return None  # (not a 1-D conv)
    if w is None or w.const is None:
        return Refusal("its weights are computed at run time")
    attrs = dict(node.attrs)
    for name, fill in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
        if name in attrs:
            attrs[name] = [fill, *attrs[name]]
    if "pads" in attrs:
        attrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
    axis = ed.const(f"{node.name}_row", np.array([2], np.int64))
    rows, = ed.add("Unsqueeze", [x, axis], name=f"{node.name}/rows")
    weights = ed.const(f"{node.name}_w2d", np.asarray(w.const)[:, :, None, :])
    y, = ed.add("Conv", [rows, weights, *node.inputs[2:]], attrs, name=f"{node.name}/2d", meta=dict(node.meta))
    out, = ed.add("Squeeze", [y, axis], name=node.name)
    take_name(out, node)
    return out


def _conv3d(m: Match, ed: GraphEditor) -> Built:
    """A 3-D Conv with constant weights and explicit pads over known channels and volume (the
    batch may vary) as 2-D Convs: the input with its depth moved next to the batch (a
    Transpose), padded in depth, and for each depth tap ``z`` its planes at ``z + stride * d``
    (a strided Slice) as ``N * D_out`` images of a 2-D Conv with the tap's weights; their sum
    (the bias in the first) moved back."""
    node = m.node("root")
    x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    shape = None if x is None or x.type is None else x.type.shape
    out = node.outputs[0].type.shape if node.outputs[0].type is not None else None
    if shape is None or len(shape) != 5:
        return None  # (not a 3-D conv)
    if w is None or w.const is None or not all(isinstance(d, int) for d in (*shape[1:], *(out or (None,))[1:])) \
            or str(node.attrs.get("auto_pad") or "NOTSET") != "NOTSET":
        return Refusal("its weights are computed at run time, its channels or volume are not known, or it pads "
                       "by auto_pad")
    weights = np.asarray(w.const)
    kd = weights.shape[2]
    strides = list(node.attrs.get("strides") or [1, 1, 1])
    dilations = list(node.attrs.get("dilations") or [1, 1, 1])
    pads = list(node.attrs.get("pads") or [0] * 6)
    _, c, _, h, wd = shape
    _, o, d_out, h_out, w_out = out
    name = node.name
    moved, = ed.add("Transpose", [x], {"perm": [0, 2, 1, 3, 4]}, name=f"{name}/depth_first")
    if pads[0] or pads[3]:
        moved, = ed.add("Pad", [moved, ed.const(f"{name}_depth_pads", np.array(
            [0, pads[0], 0, 0, 0, 0, pads[3], 0, 0, 0], np.int64))], name=f"{name}/depth_pads")
    planes = ed.const(f"{name}_planes", np.array([-1, c, h, wd], np.int64))
    attrs = {"strides": strides[1:], "dilations": dilations[1:], "pads": [pads[1], pads[2], pads[4], pads[5]],
             "group": int(node.attrs.get("group") or 1)}
    total = None
    for z in range(kd):
        start = z * dilations[0]
        taken, = ed.add("Slice", [moved, *(ed.const(f"{name}_tap{z}_{k}", np.array([v], np.int64)) for k, v in (
            ("start", start), ("end", start + (d_out - 1) * strides[0] + 1), ("axis", 1), ("step", strides[0])))],
            name=f"{name}/tap{z}")
        images, = ed.add("Reshape", [taken, planes], name=f"{name}/tap{z}_images")
        bias = list(node.inputs[2:3]) if z == 0 else []
        y, = ed.add("Conv", [images, ed.const(f"{name}_w{z}", np.ascontiguousarray(weights[:, :, z])), *bias],
                    dict(attrs), name=f"{name}/tap{z}_conv")
        total = y if total is None else ed.add("Add", [y, total], name=f"{name}/tap{z}_sum")[0]
    assert total is not None
    volume, = ed.add("Reshape", [total, ed.const(f"{name}_volume", np.array([-1, d_out, o, h_out, w_out], np.int64))],
                     name=f"{name}/volume")
    result, = ed.add("Transpose", [volume], {"perm": [0, 2, 1, 3, 4]}, name=name, meta=dict(node.meta))
    take_name(result, node)
    return result


PHASE_PIXELS = 256
"""A dilated conv whose phases are planes of fewer pixels stays dilated: [2, 128, 32, 32] at
dilation 4 (8x8 phases) measured 1.30 -> 1.40 of ONNX Runtime's time as phases, a 10x12 one
1.42 -> 2.66; [8, 64, 56, 56] at dilation 2 (28x28) 1.26-1.34 -> 0.82-0.90."""


def _dilated(m: Match, ed: GraphEditor) -> Built:
    """A stride-1 2-D Conv dilated by ``d`` in both axes as a dense one over the input's ``d * d``
    phases (space to batch): each phase (rows and columns ``i, j`` modulo ``d``) sees the
    dilated window as a dense one, so the conv takes the dense convs' kernels (Winograd for
    3x3), between a Transpose into phases and one back."""
    node = m.node("root")
    x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    shape = None if x is None or x.type is None else x.type.shape
    dilations = [int(v) for v in node.attrs.get("dilations") or []]
    if shape is None or len(shape) != 4 or len(set(dilations)) != 1 or dilations[0] < 2:
        return None  # (not a dilated 2-D conv)
    d = dilations[0]
    pads = [int(v) for v in node.attrs.get("pads") or [0, 0, 0, 0]]
    if w is None or w.const is None or not all(isinstance(v, int) for v in shape[1:]) \
            or any(int(s) != 1 for s in node.attrs.get("strides") or [1, 1]) \
            or str(node.attrs.get("auto_pad") or "NOTSET") != "NOTSET" or any(p % d for p in pads) \
            or shape[2] % d or shape[3] % d:
        return Refusal(f"its weights are computed at run time, it is strided, or its planes ({shape[2:]}) or pads "
                       f"({pads}) are not known multiples of its dilation {d}")
    _, c, h, wd = shape
    if (h // d) * (wd // d) < PHASE_PIXELS:
        return Refusal(f"its phases would be {h // d}x{wd // d} planes, too small to pay for the two transposes")
    o = int(np.asarray(w.const).shape[0])
    name = node.name

    def const(tag: str, values: list[int]) -> Value:
        return ed.const(f"{name}_{tag}", np.array(values, np.int64))

    split, = ed.add("Reshape", [x, const("split", [-1, c, h // d, d, wd // d, d])], name=f"{name}/split")
    phases, = ed.add("Transpose", [split], {"perm": [0, 3, 5, 1, 2, 4]}, name=f"{name}/phases")
    images, = ed.add("Reshape", [phases, const("images", [-1, c, h // d, wd // d])], name=f"{name}/images")
    attrs = {k: v for k, v in node.attrs.items() if k not in ("dilations", "pads")}
    attrs["pads"] = [p // d for p in pads]
    y, = ed.add("Conv", [images, *node.inputs[1:]], attrs, name=f"{name}/dense", meta=dict(node.meta))
    oh, ow = (h + pads[0] + pads[2]) // d - (int(np.asarray(w.const).shape[2]) - 1), \
        (wd + pads[1] + pads[3]) // d - (int(np.asarray(w.const).shape[3]) - 1)
    grouped, = ed.add("Reshape", [y, const("grouped", [-1, d, d, o, oh, ow])], name=f"{name}/grouped")
    back, = ed.add("Transpose", [grouped], {"perm": [0, 3, 4, 1, 5, 2]}, name=f"{name}/interleave")
    out, = ed.add("Reshape", [back, const("joined", [-1, o, oh * d, ow * d])], name=name)
    take_name(out, node)
    return out


def _qlinear_concat(m: Match, ed: GraphEditor) -> Built:
    """ONNX Runtime's ``QLinearConcat(y_scale, y_zero, x1, s1, z1, ...)`` -> ``Concat`` of each
    input requantized to ``y``'s scale and zero point: ``QuantizeLinear(DequantizeLinear(x, s,
    z), y_scale, y_zero)`` (the reference's steps exactly: ``(x - z) * s``, ``/ y_scale``,
    rounded half to even, ``+ y_zero``, clipped), or ``x`` itself where its scale and zero point
    are ``y``'s (those steps give ``x`` back)."""
    node = m.node("root")
    params = [node.inputs[0], node.inputs[1], *[node.inputs[i] for i in range(3, len(node.inputs), 3)],
              *[node.inputs[i] for i in range(4, len(node.inputs), 3)]]
    if any(v is None or v.const is None or np.size(v.const) != 1 for v in params):
        return Refusal("a scale or zero point is computed at run time or not one per tensor")
    sy, zy = (np.asarray(v.const).reshape(()) for v in node.inputs[:2])
    parts = []
    for i in range(2, len(node.inputs), 3):
        x, s, z = node.inputs[i:i + 3]
        sx, zx = np.asarray(s.const).reshape(()), np.asarray(z.const).reshape(())
        if zx.dtype == zy.dtype and np.float32(sx) == np.float32(sy) and zx == zy:
            parts.append(x)
            continue
        d, = ed.add("DequantizeLinear", [x, s, z], name=f"{node.name}/dequantize")
        q, = ed.add("QuantizeLinear", [d, node.inputs[0], node.inputs[1]], name=f"{node.name}/requantize")
        parts.append(q)
    out, = ed.add("Concat", parts, {"axis": int(node.attrs["axis"])}, name=node.name)
    take_name(out, node)
    return out


def _sink_squeeze(m: Match, ed: GraphEditor) -> Built:
    """``f(..., Squeeze(x), ...)`` -> ``Squeeze(f(..., x, ...))`` for an elementwise ``f`` whose
    other operands are constants of one element (a 1-D conv's activation, now on its 2-D conv's
    output, where it fuses into the conv's stores)."""
    node = m.node("root")
    moving = [i for i, v in enumerate(node.inputs) if v is not None and v.const is None]
    if len(moving) != 1 or len(node.outputs) != 1:
        return None
    squeeze = node.inputs[moving[0]].producer
    if squeeze is None or squeeze.op != "Squeeze" or len(squeeze.inputs) < 2 or squeeze.inputs[0] is None:
        return None
    if any(v is not None and (np.size(v.const) != 1 or np.ndim(v.const) > 1)
           for i, v in enumerate(node.inputs) if i != moving[0]):
        return Refusal("an operand other than the squeezed one is not a one-element constant")
    inputs = list(node.inputs)
    inputs[moving[0]] = squeeze.inputs[0]
    inner, = ed.add(node.op, inputs, dict(node.attrs), name=f"{node.name}/unsqueezed", domain=node.domain,
                    meta=dict(node.meta))
    out, = ed.add("Squeeze", [inner, squeeze.inputs[1]], name=node.name)
    take_name(out, node)
    return out


def _squeeze_pair(m: Match, ed: GraphEditor) -> Built:
    """``Unsqueeze(Squeeze(x, a), a)`` -> ``x`` (a 1-D conv's rows between two 2-D convs)."""
    root, inner = m.node("root"), m.node("inner")
    x = inner.inputs[0]
    axes = [None if len(n.inputs) < 2 or n.inputs[1] is None or n.inputs[1].const is None
            else np.asarray(n.inputs[1].const).tolist() for n in (root, inner)]
    if x is None or axes[0] is None or axes[0] != axes[1] or x.type is None or x.type != root.outputs[0].type:
        return None
    return x


decompose_rules: list[Rule] = [
    Rule("conv1d_as_conv2d", op("Conv", name="root"), _conv1d, fuses=False,
         doc="a 1-D Conv -> Unsqueeze, a 2-D Conv over planes of one row, Squeeze"),
    Rule("dilated_as_dense", op("Conv", name="root"), _dilated, fuses=False,
         doc="a dilated stride-1 2-D Conv -> its input's phases as a batch, a dense Conv, phases back"),
    Rule("conv3d_as_conv2d", op("Conv", name="root"), _conv3d, fuses=False,
         doc="a 3-D Conv -> Transpose, a 2-D Conv over each depth tap's planes, their sum, Transpose"),
    Rule("groupnorm_as_layernorm", op("GroupNormalization", name="root"), _groupnorm, fuses=False,
         doc="GroupNormalization -> Reshape, LayerNormalization, Reshape, per-channel Mul and Add"),
    Rule("tile_as_expand", op("Tile", name="root"), _tile, fuses=False,
         doc="Tile with constant repeats -> Unsqueeze, Expand, Reshape"),
    *[Rule("blocks_as_transpose", op(name, name="root"), _blocks, fuses=False,
           doc=f"{name} -> Reshape, Transpose, Reshape") for name in ("DepthToSpace", "SpaceToDepth")],
    *[Rule("sink_squeeze", op(None, role=role, name="root"), _sink_squeeze, fuses=False,
           doc="an elementwise op of a Squeeze and one-element constants -> the op, then the Squeeze")
      for role in (Role.ELEMENTWISE, Role.BROADCAST)],
    Rule("qlinear_concat_as_concat", op("QLinearConcat", name="root", domain="com.microsoft"), _qlinear_concat,
         fuses=False,
         doc="QLinearConcat -> each input requantized to the output's scale (unless it has it), Concat"),
    Rule("fold_squeeze_pair", op("Unsqueeze", op("Squeeze", name="inner"), const(), name="root"), _squeeze_pair,
         fuses=False, doc="Unsqueeze(Squeeze(x, axes), axes) -> x"),
]
"""The decompositions, in the order they are tried at a node."""


def decompose(graph: Graph, ctx: PassContext) -> Graph:
    """A new graph with ``decompose_rules`` applied (see the module doc)."""
    new, _ = rewrite(graph, decompose_rules, "decompose", ctx.log, ctx.options)
    return new


__all__ = ["CONCAT_COPIES", "PHASE_PIXELS", "decompose", "decompose_rules"]
