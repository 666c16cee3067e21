"""Classical machine-learning ops of domain ``ai.onnx.ml`` on numeric tensors: ``Binarizer``,
``ArrayFeatureExtractor``, ``LabelEncoder`` and ``TreeEnsemble``.

- ``Binarizer`` is an index expression: ``1`` where ``X > threshold``, else ``0`` (NaN gives 0),
  in X's dtype.
- ``ArrayFeatureExtractor`` picks the last-axis entries whose indices ``Y`` lists (flattened),
  ``[..., F] -> [..., len(Y)]``; a 1-D X is read as one row, as ONNX Runtime does.
- ``LabelEncoder`` maps each element through a table of keys to values (a ``default_*`` for
  keys not in the table; NaN keys match NaN; of repeated keys the first counts). Keys and
  values come from ``keys_int64s`` / ``keys_floats`` / ``keys_strings`` / ``keys_tensor`` and
  ``values_int64s`` / ``values_floats`` / ``values_strings`` / ``values_tensor``: int64,
  float32, string or the tensor's dtype. The default is ``default_tensor`` when given, else
  ``default_int64``, ``default_float`` or ``default_string`` by the values' kind.
- ``TreeEnsemble`` (opset 5) evaluates decision trees on the rows of ``X [N, F]``: every row
  walks every tree at once (vectorized over rows, one step per tree level), the leaf weights
  are aggregated per target (``AVERAGE``, ``SUM``, ``MIN``, ``MAX``: a target no leaf reaches
  scores 0, as in ONNX Runtime) and ``post_transform`` applies (``NONE`` 0, ``SOFTMAX`` 1,
  ``LOGISTIC`` 2, ``SOFTMAX_ZERO`` 3, ``PROBIT`` 4, numbered as the ONNX spec numbers them;
  ONNX Runtime 1.32 swaps 1 and 2). ``BRANCH_MEMBER`` tests the feature value itself, as the
  spec and onnx's reference do (ONNX Runtime tests its integer part). The tree encoding is
  checked at shape inference.

The last three are opaque (numpy references).

Example:
    >>> from metadef.ops import get_op, infer_types
    >>> from metadef.shape import parse_type
    >>> str(infer_types(get_op("ArrayFeatureExtractor", DOMAIN), "/afe",
    ...                 [parse_type("f32[n,10]"), parse_type("i64[3]")], {})[0])
    'f32[n,3]'
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

from metadef.core.dtypes import STRING, as_strings, from_numpy
from metadef.core.errors import BackendError, DTypeError
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, float_, floats, int_, ints, string, strings, tensor_
from metadef.ops.metaop import SAME_AS_FIRST, metaop
from metadef.ops.strategy import Role
from metadef.shape import TensorType

DOMAIN = "ai.onnx.ml"
Arrays = list[np.ndarray | None]

Binarizer = metaop(
    "Binarizer", domain=DOMAIN, inputs=("X",), outputs=("Y",), attrs={"threshold": float_(0.0)},
    types="T in {float32, float64, int32, int64}", rule=SAME_AS_FIRST,
    semantics="Y[...] = where(X[...] > threshold, 1, 0)", role=Role.ELEMENTWISE,
    doc="1 where X > threshold, else 0, in X's dtype.",
)


# ----------------------------------------------------------------- ArrayFeatureExtractor


def _feature_extractor_rule(ctx: InferContext) -> list[Any]:
    x, indices = ctx.shape(0), ctx.shape(1)
    if x is None or indices is None:
        return [None]
    if not x:
        ctx.fail("X must have at least one axis (the features)")
    count = 1
    for d in indices:
        if not isinstance(d, int):
            return [(*(x[:-1] if len(x) > 1 else (1,)), ctx.fresh("features"))]
        count *= d
    return [(*(x[:-1] if len(x) > 1 else (1,)), count)]


def _feature_extractor_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """``X[..., Y.flat]``; a 1-D X gives one row."""
    x, indices = inputs[0], np.asarray(inputs[1]).reshape(-1)
    features = x.shape[-1]
    if indices.size and (indices.min() < -features or indices.max() >= features):
        raise BackendError(f"ArrayFeatureExtractor: indices {indices.tolist()} fall outside "
                           f"the {features} features of X {list(x.shape)}")
    out = np.take(x, indices, axis=-1)
    return out.reshape(1, -1) if x.ndim == 1 else out


ArrayFeatureExtractor = metaop(
    "ArrayFeatureExtractor", domain=DOMAIN, inputs=("X", "Y: int64"), outputs=("Z",),
    types="T in {float32, float64, int32, int64}", rule=_feature_extractor_rule,
    reference=_feature_extractor_reference, role=Role.OPAQUE,
    doc="The entries of X's last axis at the indices Y (flattened); a 1-D X is one row.",
)


# -------------------------------------------------------------------------- LabelEncoder


_FORMS = ("int64s", "floats", "strings", "tensor")


def _table_form(attrs: Mapping[str, Any], side: str) -> tuple[np.ndarray, np.dtype] | None:
    """The keys or values of the table (``side``: ``keys`` or ``values``) as a flat array in
    the dtype they give (``*_int64s`` int64, ``*_floats`` float32, ``*_strings`` string, an
    object array of ``str``, ``*_tensor`` its own); None when the node has none."""
    for form in _FORMS:
        raw = attrs[f"{side}_{form}"]
        if raw is None:
            continue
        if form == "strings" or np.asarray(raw).dtype.kind in "OUS":
            return as_strings(raw, f"LabelEncoder {side}_{form}").reshape(-1), STRING.numpy
        dtype = {"int64s": np.dtype(np.int64), "floats": np.dtype(np.float32)}.get(form, np.asarray(raw).dtype)
        return np.asarray(raw, dtype).reshape(-1), dtype
    return None


def _label_encoder_rule(ctx: InferContext) -> list[Any]:
    for side in ("keys", "values"):
        given = [f"{side}_{form}" for form in _FORMS if ctx.attrs[f"{side}_{form}"] is not None]
        if len(given) > 1:
            ctx.fail(f"give the {side} in one attribute, got {', '.join(given)}")
    keys, values = _table_form(ctx.attrs, "keys"), _table_form(ctx.attrs, "values")
    if keys is None or values is None:
        ctx.fail("the table needs keys (keys_int64s, keys_floats, keys_strings or keys_tensor) and "
                 "values (values_int64s, values_floats, values_strings or values_tensor)")
    if keys[0].size != values[0].size:
        ctx.fail(f"{keys[0].size} keys but {values[0].size} values")
    key_dtype = from_numpy(keys[1])
    if ctx.dtype(0) is not key_dtype:
        raise DTypeError(f"op LabelEncoder (node {ctx.node}): input X is {ctx.dtype(0).name} but "
                         f"the keys are {key_dtype.name}; insert a Cast")
    default = ctx.attrs["default_tensor"]
    if default is not None and np.size(default) != 1:
        ctx.fail(f"default_tensor must hold one value, got shape {list(np.shape(default))}")
    if default is not None and (np.asarray(default).dtype.kind in "OUS") != (values[1] == STRING.numpy):
        raise DTypeError(f"op LabelEncoder (node {ctx.node}): default_tensor is "
                         f"{np.asarray(default).dtype} but the values are {from_numpy(values[1]).name}")
    return [TensorType(from_numpy(values[1]), ctx.shape(0))]


def _label_default(attrs: Mapping[str, Any], dtype: np.dtype) -> Any:
    """The value of keys missing from the table: ``default_tensor``, else the default of the
    values' kind (``default_int64``, ``default_string`` or ``default_float``)."""
    if attrs["default_tensor"] is not None:
        default = np.asarray(attrs["default_tensor"]).reshape(-1)
        return as_strings(default)[0] if dtype == STRING.numpy else default[0]
    if dtype == STRING.numpy:
        return attrs["default_string"]
    return attrs["default_int64"] if dtype.kind in "iu" else attrs["default_float"]


def label_encoder_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """Look every element up in the sorted keys (string keys: in a dict); missing keys take
    the default.

    Example:
        >>> attrs = {name: spec.default for name, spec in LabelEncoder.attrs.items()}
        >>> attrs.update(keys_int64s=(3, 1, 7), values_floats=(0.5, 1.5, 2.5), default_float=-1.0)
        >>> label_encoder_reference([np.array([7, 2, 1, 3])], attrs)
        array([ 2.5, -1. ,  1.5,  0.5], dtype=float32)
        >>> attrs.update(keys_int64s=None, keys_strings=("a", "b", "c"))
        >>> label_encoder_reference([np.array(["c", "z", "a"], object)], attrs)
        array([ 2.5, -1. ,  0.5], dtype=float32)
    """
    x = np.asarray(inputs[0])
    (keys, _), (values, dtype) = _table_form(attrs, "keys"), _table_form(attrs, "values")
    out = np.full(x.shape, _label_default(attrs, dtype), dtype)
    if keys.dtype == STRING.numpy:  # a dict lookup; the first of repeated keys counts
        table = dict(zip(keys.tolist()[::-1], values.tolist()[::-1]))
        flat = out.reshape(-1)
        for i, key in enumerate(as_strings(x).reshape(-1).tolist()):
            if key in table:
                flat[i] = table[key]
        return out
    keys = keys.astype(x.dtype)
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    if keys.size:
        at = np.clip(np.searchsorted(keys, x), 0, keys.size - 1)
        found = keys[at] == x
        out[found] = values[at[found]]
        if x.dtype.kind == "f" and np.isnan(keys).any():  # NaN keys match NaN inputs
            out[np.isnan(x)] = values[np.isnan(keys)][0]
    return out


_TABLE = ("int64s", "floats", "strings")
LabelEncoder = metaop(
    "LabelEncoder", domain=DOMAIN, inputs=("X: T1",), outputs=("Y: T2",),
    attrs={**{f"keys_{k}": (ints() if k == "int64s" else floats() if k == "floats" else strings())
              for k in _TABLE},
           **{f"values_{k}": (ints() if k == "int64s" else floats() if k == "floats" else strings())
              for k in _TABLE},
           "keys_tensor": tensor_(), "values_tensor": tensor_(), "default_tensor": tensor_(),
           "default_int64": int_(-1), "default_float": float_(-0.0), "default_string": string("_Unused")},
    types="T1 in {int16, int32, int64, float32, float64, string}; "
          "T2 in {int16, int32, int64, float32, float64, string}",
    rule=_label_encoder_rule, reference=label_encoder_reference, role=Role.OPAQUE, since=(2, 4),
    doc="Each element mapped through a key -> value table (numbers or strings); keys not in the "
        "table give the default.",
)


# -------------------------------------------------------------------------- TreeEnsemble

AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
         "BRANCH_MEMBER")
MEMBER = MODES.index("BRANCH_MEMBER")
_NODE_FIELDS = ("nodes_featureids", "nodes_modes", "nodes_splits", "nodes_truenodeids",
                "nodes_falsenodeids", "nodes_trueleafs", "nodes_falseleafs")


def _flat(value: Any, dtype: Any = None) -> np.ndarray:
    return np.asarray(value, dtype).reshape(-1)


def n_targets_of(attrs: Mapping[str, Any]) -> int:
    """``n_targets``, or one more than the largest ``leaf_targetids`` when it is absent.

    Example:
        >>> n_targets_of({"n_targets": None, "leaf_targetids": (0, 2, 1)})
        3
    """
    if attrs["n_targets"] is not None:
        return attrs["n_targets"]
    return int(max(attrs["leaf_targetids"], default=-1)) + 1


def _check_tree_encoding(ctx: InferContext) -> None:
    """The ``nodes_*`` and ``leaf_*`` attributes describe trees: equal lengths, known modes,
    children, roots and targets in range, one membership set per ``BRANCH_MEMBER`` node."""
    a = ctx.attrs
    if a["aggregate_function"] not in range(len(AGGREGATES)):
        ctx.fail(f"aggregate_function={a['aggregate_function']} is not 0 to 3 "
                 f"({', '.join(AGGREGATES)})")
    if a["post_transform"] not in range(len(POST_TRANSFORMS)):
        ctx.fail(f"post_transform={a['post_transform']} is not 0 to 4 ({', '.join(POST_TRANSFORMS)})")
    sizes = {name: _flat(a[name]).size for name in _NODE_FIELDS}
    for name in ("nodes_missing_value_tracks_true", "nodes_hitrates"):
        if a[name] is not None:
            sizes[name] = _flat(a[name]).size
    n_nodes = sizes["nodes_featureids"]
    if len(set(sizes.values())) != 1:
        ctx.fail(f"the nodes_* attributes must have one entry per node, got lengths {sizes}")
    n_leaves = len(a["leaf_targetids"])
    if _flat(a["leaf_weights"]).size != n_leaves:
        ctx.fail(f"leaf_weights has {_flat(a['leaf_weights']).size} entries but leaf_targetids "
                 f"{n_leaves}")
    modes = _flat(a["nodes_modes"], np.int64)
    if modes.size and (modes.min() < 0 or modes.max() >= len(MODES)):
        ctx.fail(f"nodes_modes holds {sorted(set(modes.tolist()))}; the modes are 0 to 6 "
                 f"({', '.join(MODES)})")
    for side in ("true", "false"):
        ids, leafs = _flat(a[f"nodes_{side}nodeids"], np.int64), _flat(a[f"nodes_{side}leafs"], bool)
        bound = np.where(leafs, n_leaves, n_nodes)
        if ids.size and ((ids < 0) | (ids >= bound)).any():
            ctx.fail(f"nodes_{side}nodeids points outside the {n_nodes} nodes or {n_leaves} leaves")
    roots = np.asarray(a["tree_roots"], np.int64)
    if not roots.size or roots.min() < 0 or roots.max() >= n_nodes:
        ctx.fail(f"tree_roots {list(a['tree_roots'])} must name one or more of the {n_nodes} nodes")
    targets = np.asarray(a["leaf_targetids"], np.int64)
    if targets.size and (targets.min() < 0 or targets.max() >= n_targets_of(a)):
        ctx.fail(f"leaf_targetids must lie in [0, n_targets={n_targets_of(a)})")
    sets = 0 if a["membership_values"] is None else int(np.isnan(_flat(a["membership_values"], np.float64)).sum())
    if sets != int((modes == MEMBER).sum()):
        ctx.fail(f"membership_values holds {sets} NaN-delimited sets for "
                 f"{int((modes == MEMBER).sum())} BRANCH_MEMBER nodes")


def _tree_ensemble_rule(ctx: InferContext) -> list[Any]:
    """``Y [N, n_targets]`` in X's dtype, for ``X [N, F]`` (a 1-D X is one row)."""
    _check_tree_encoding(ctx)
    x = ctx.shape(0)
    if x is None:
        return [None]
    if len(x) not in (1, 2):
        ctx.fail(f"X must be [N, F] (or one row [F]), got rank {len(x)}")
    features = _flat(ctx.attrs["nodes_featureids"], np.int64)
    if isinstance(x[-1], int) and features.size and (features.min() < 0 or features.max() >= x[-1]):
        ctx.fail(f"nodes_featureids reads feature {int(features.max())} of {x[-1]}")
    return [(x[0] if len(x) == 2 else 1, n_targets_of(ctx.attrs))]


def _member_sets(attrs: Mapping[str, Any]) -> dict[int, np.ndarray]:
    """Node index -> the values its ``BRANCH_MEMBER`` test accepts."""
    modes = _flat(attrs["nodes_modes"], np.int64)
    values = _flat(attrs["membership_values"] if attrs["membership_values"] is not None else [],
                   np.float64)
    cuts = np.flatnonzero(np.isnan(values))
    sets = np.split(values, cuts)  # each set but the first starts with its NaN delimiter
    return {int(node): s[~np.isnan(s)] for node, s in zip(np.flatnonzero(modes == MEMBER), sets)}


def _goes_true(value: np.ndarray, nodes: np.ndarray, attrs: Mapping[str, Any],
               members: Mapping[int, np.ndarray]) -> np.ndarray:
    """Each row's test at its current node (``value`` is the row's feature, in float64)."""
    modes = _flat(attrs["nodes_modes"], np.int64)[nodes]
    split = _flat(attrs["nodes_splits"], np.float64)[nodes]
    tests = [value <= split, value < split, value >= split, value > split, value == split,
             value != split]
    result = np.choose(np.minimum(modes, MEMBER - 1), tests)
    for node in np.unique(nodes[modes == MEMBER]):
        here = nodes == node
        result[here] = np.isin(value[here], members[int(node)])
    tracks = attrs["nodes_missing_value_tracks_true"]
    if tracks is not None:
        result |= np.isnan(value) & _flat(tracks, bool)[nodes]
    return result


def _leaves(x: np.ndarray, root: int, attrs: Mapping[str, Any],
            members: Mapping[int, np.ndarray]) -> np.ndarray:
    """The leaf each row of ``x`` reaches in the tree at ``root``: all rows step together."""
    true_ids, false_ids = (_flat(attrs[f"nodes_{s}nodeids"], np.int64) for s in ("true", "false"))
    true_leaf, false_leaf = (_flat(attrs[f"nodes_{s}leafs"], bool) for s in ("true", "false"))
    features = _flat(attrs["nodes_featureids"], np.int64)
    rows = x.shape[0]
    if true_leaf[root] and false_leaf[root] and true_ids[root] == false_ids[root]:
        return np.full(rows, true_ids[root])  # a tree that is one leaf
    node, leaf = np.full(rows, root), np.full(rows, -1)
    active = np.arange(rows)
    for _ in range(features.size + 1):  # no path is longer than the node count
        at = node[active]
        go = _goes_true(x[active, features[at]].astype(np.float64), at, attrs, members)
        nxt = np.where(go, true_ids[at], false_ids[at])
        done = np.where(go, true_leaf[at], false_leaf[at])
        leaf[active[done]] = nxt[done]
        node[active] = nxt
        active = active[~done]
        if not active.size:
            return leaf
    raise BackendError(f"TreeEnsemble: the tree at node {root} has a cycle (no leaf reached)")


def _post_transform(scores: np.ndarray, kind: str) -> np.ndarray:
    """ONNX's score transforms, row by row over the targets."""
    if kind == "SOFTMAX":
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if kind == "LOGISTIC":
        return 1 / (1 + np.exp(-scores))
    if kind == "SOFTMAX_ZERO":  # a softmax over the nonzero scores; zeros stay zero
        nonzero = scores != 0
        top = np.where(nonzero, scores, -np.inf).max(axis=1, keepdims=True)
        e = np.where(nonzero, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0)
        total = e.sum(axis=1, keepdims=True)
        return e / np.where(total == 0, 1, total)
    if kind == "PROBIT":
        return np.vectorize(_probit, otypes=[np.float64])(scores)
    return scores


def _probit(p: float) -> float:
    """The standard normal quantile ``sqrt(2) * erfinv(2p - 1)``: ±inf at 1 and 0, NaN outside."""
    if p in (0.0, 1.0):
        return np.inf if p else -np.inf
    if not 0 < p < 1:
        return np.nan
    return statistics.NormalDist().inv_cdf(p)


def tree_ensemble_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """Aggregate, per target, the leaf weights every tree gives each row; then transform.

    Example (one split on feature 0 at 0.5, two leaves, one target):
        >>> attrs = {"nodes_featureids": (0,), "nodes_modes": np.array([0], np.uint8),
        ...          "nodes_splits": np.array([0.5]), "nodes_truenodeids": (0,),
        ...          "nodes_trueleafs": (1,), "nodes_falsenodeids": (1,), "nodes_falseleafs": (1,),
        ...          "leaf_targetids": (0, 0), "leaf_weights": np.array([10.0, 20.0]),
        ...          "tree_roots": (0,), "n_targets": None, "aggregate_function": 1,
        ...          "post_transform": 0, "membership_values": None,
        ...          "nodes_missing_value_tracks_true": None}
        >>> tree_ensemble_reference([np.array([[0.2], [0.9]], np.float32)], attrs)
        array([[10.],
               [20.]], dtype=float32)
    """
    x = np.asarray(inputs[0])
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    members = _member_sets(attrs)
    weights = _flat(attrs["leaf_weights"], np.float64)
    targets = np.asarray(attrs["leaf_targetids"], np.int64)
    aggregate = AGGREGATES[attrs["aggregate_function"]]
    scores = np.full((rows.shape[0], n_targets_of(attrs)), 0.0 if aggregate in ("SUM", "AVERAGE")
                     else np.nan)
    row_ids = np.arange(rows.shape[0])
    for root in attrs["tree_roots"]:
        leaf = _leaves(rows, int(root), attrs, members)
        where = (row_ids, targets[leaf])
        if aggregate in ("SUM", "AVERAGE"):
            np.add.at(scores, where, weights[leaf])
        else:
            (np.fmin if aggregate == "MIN" else np.fmax).at(scores, where, weights[leaf])
    if aggregate == "AVERAGE":
        scores /= len(attrs["tree_roots"])
    scores = np.nan_to_num(scores, nan=0.0, posinf=np.inf, neginf=-np.inf)  # unreached: 0
    return _post_transform(scores, POST_TRANSFORMS[attrs["post_transform"]]).astype(x.dtype)


TreeEnsemble = metaop(
    "TreeEnsemble", domain=DOMAIN, inputs=("X",), outputs=("Y",),
    attrs={"aggregate_function": int_(1), "post_transform": int_(0), "n_targets": int_(None),
           "tree_roots": ints(REQUIRED), "nodes_featureids": ints(REQUIRED),
           "nodes_modes": tensor_(REQUIRED), "nodes_splits": tensor_(REQUIRED),
           "nodes_truenodeids": ints(REQUIRED), "nodes_trueleafs": ints(REQUIRED),
           "nodes_falsenodeids": ints(REQUIRED), "nodes_falseleafs": ints(REQUIRED),
           "nodes_missing_value_tracks_true": ints(None), "nodes_hitrates": tensor_(None),
           "leaf_targetids": ints(REQUIRED), "leaf_weights": tensor_(REQUIRED),
           "membership_values": tensor_(None)},
    types="T in {float16, float32, float64}", rule=_tree_ensemble_rule,
    reference=tree_ensemble_reference, role=Role.OPAQUE, since=(5,),
    doc="Decision trees on the rows of X: leaf weights aggregated per target (average, sum, "
        "min, max), then a post transform (softmax, logistic, softmax_zero, probit).",
)

__all__ = ["AGGREGATES", "DOMAIN", "MODES", "POST_TRANSFORMS", "ArrayFeatureExtractor",
           "Binarizer", "LabelEncoder", "TreeEnsemble", "label_encoder_reference",
           "n_targets_of", "tree_ensemble_reference"]
