"""``TfIdfVectorizer``: counts of pooled n-grams in token sequences, weighted (TF, IDF, TFIDF).

The input is one sequence ``X [C]`` or a batch of them ``X [N, C]``, of int32/int64 token ids
(with ``pool_int64s``) or of strings (with ``pool_strings``). The pool lists the n-grams to
count, grouped by length: ``ngram_counts[k]`` is where the (k+1)-grams start in the pool, and
the i-th n-gram of the pool (counted across all lengths) goes to output column
``ngram_indexes[i]``, so the output is ``[max(ngram_indexes) + 1]`` (``[N, ...]`` for a batch),
float32.

An n-gram of length ``n`` is read at every start ``s`` with every stride ``d`` from 1 to
``max_skip_count + 1``: the tokens ``X[s], X[s+d], ..., X[s+(n-1)d]``, all inside the row.
Unigrams are read once (a stride means nothing to them). Only the pool's n-grams whose length
lies in ``[min_gram_length, max_gram_length]`` count. ``mode`` weighs each n-gram's count
``f``: ``TF`` gives ``f``, ``IDF`` gives ``weights[i]`` where ``f > 0`` (1 without weights),
``TFIDF`` gives ``weights[i] * f`` (``f`` without weights); ``weights[i]`` belongs to the i-th
n-gram of the pool, as the spec says and ONNX Runtime does (onnx's reference reads it by output
column instead). A pool that lists an n-gram twice is refused, as ONNX Runtime refuses it.

The reference is vectorized: tokens become ids in the pool's vocabulary, each window of
``n`` ids is matched against the pool's n-grams in one ``numpy.unique`` over rows, and the
counts are one ``bincount``.

Example:
    >>> from metadef.testing.onnx_cases import infer_text
    >>> attrs = {"mode": "TF", "min_gram_length": 2, "max_gram_length": 2, "max_skip_count": 0,
    ...          "ngram_counts": (0, 0), "ngram_indexes": (0, 1), "pool_int64s": (5, 6, 6, 7)}
    >>> infer_text("TfIdfVectorizer", ["i32[n,12]"], attrs)
    ['f32[n,2]']
    >>> tfidf_reference([np.array([5, 6, 7, 6, 7], np.int32)], attrs).tolist()
    [1.0, 2.0]
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadef.core.dtypes import FLOAT32, STRING, as_strings
from metadef.core.errors import DTypeError
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, floats, int_, ints, string, strings
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import TensorType

MODES = ("TF", "IDF", "TFIDF")
"""The weightings ``mode`` may name."""


@dataclass(frozen=True)
class NgramPool:
    """The pool of one node, ready to match: per length ``n`` (those counted), the pool's
    n-grams as rows of vocabulary ids ``[m, n]`` and each one's index among all n-grams.

    Example:
        >>> pool = NgramPool.of({"pool_int64s": (4, 9, 4, 9), "ngram_counts": (0, 2),
        ...                      "min_gram_length": 1, "max_gram_length": 2})
        >>> pool.vocabulary.tolist(), {n: rows.tolist() for n, (rows, _) in pool.grams.items()}
        ([4, 9], {1: [[0], [1]], 2: [[0, 1]]})
    """

    vocabulary: np.ndarray
    grams: Mapping[int, tuple[np.ndarray, np.ndarray]]
    count: int
    """How many n-grams the pool lists (all lengths)."""

    @staticmethod
    def of(attrs: Mapping[str, Any]) -> NgramPool:
        """The pool a node's attributes describe (made once per distinct pool)."""
        texts = attrs.get("pool_strings")
        return _pool(tuple(texts) if texts is not None else None, tuple(attrs.get("pool_int64s") or ()),
                     tuple(attrs["ngram_counts"]), attrs["min_gram_length"], attrs["max_gram_length"])


@functools.lru_cache(maxsize=64)
def _pool(texts: tuple[str, ...] | None, numbers: tuple[int, ...], starts: tuple[int, ...],
          min_gram_length: int, max_gram_length: int) -> NgramPool:
    tokens = list(texts if texts is not None else numbers)
    by_length: dict[int, tuple[list[Any], range]] = {}
    index = 0
    for k, start in enumerate(starts):
        n = k + 1
        end = starts[k + 1] if k + 1 < len(starts) else len(tokens)
        m = max(end - start, 0) // n
        if min_gram_length <= n <= max_gram_length and m:
            by_length[n] = (tokens[start:start + m * n], range(index, index + m))
        index += m
    used = [t for flat, _ in by_length.values() for t in flat]
    vocabulary = np.array(sorted(set(used)), dtype=object if texts is not None else np.int64)
    grams = {n: (_token_ids(np.array(flat, dtype=vocabulary.dtype), vocabulary).reshape(-1, n),
                 np.array(ids, np.int64)) for n, (flat, ids) in by_length.items()}
    return NgramPool(vocabulary, grams, index)


def _token_ids(tokens: np.ndarray, vocabulary: np.ndarray) -> np.ndarray:
    """Each token's index in the sorted ``vocabulary``, -1 for a token not in it."""
    if vocabulary.size == 0:
        return np.full(tokens.shape, -1, np.int64)
    if vocabulary.dtype == object:
        lookup = {t: i for i, t in enumerate(vocabulary.tolist())}
        flat = [lookup.get(t, -1) for t in tokens.reshape(-1).tolist()]
        return np.array(flat, np.int64).reshape(tokens.shape)
    tokens = tokens.astype(np.int64)
    at = np.minimum(np.searchsorted(vocabulary, tokens), vocabulary.size - 1)
    return np.where(vocabulary[at] == tokens, at, -1)


def _windows(ids: np.ndarray, n: int, stride: int) -> np.ndarray:
    """Every window ``ids[:, s], ids[:, s+stride], ...`` of ``n`` ids: ``[rows, starts, n]``."""
    starts = ids.shape[1] - (n - 1) * stride
    if starts <= 0:
        return np.zeros((ids.shape[0], 0, n), np.int64)
    return np.stack([ids[:, k * stride:k * stride + starts] for k in range(n)], axis=-1)


def count_ngrams(ids: np.ndarray, pool: NgramPool, max_skip_count: int) -> np.ndarray:
    """How often each pooled n-gram occurs in each row of token ids: ``[rows, pool.count]``.

    Example:
        >>> pool = NgramPool.of({"pool_int64s": (1, 2), "ngram_counts": (0, 0),
        ...                      "min_gram_length": 2, "max_gram_length": 2})
        >>> count_ngrams(np.array([[0, 0, 1, 1]]), pool, max_skip_count=1).tolist()
        [[3]]
    """
    rows = ids.shape[0]
    counts = np.zeros(rows * pool.count, np.int64)
    for n, (grams, which) in pool.grams.items():
        for stride in range(1, (max_skip_count + 2) if n > 1 else 2):
            windows = _windows(ids, n, stride)
            if windows.shape[1] == 0:
                continue
            flat = windows.reshape(-1, n)
            _, codes = np.unique(np.concatenate([grams, flat]), axis=0, return_inverse=True)
            codes = codes.reshape(-1)
            ngram_of_code = np.full(codes.max() + 1, -1, np.int64)
            ngram_of_code[codes[:len(grams)]] = which
            found = ngram_of_code[codes[len(grams):]]
            row = np.repeat(np.arange(rows), windows.shape[1])
            hit = found >= 0
            counts += np.bincount(row[hit] * pool.count + found[hit], minlength=counts.size)
    return counts.reshape(rows, pool.count)


def _weighted(counts: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    weights = attrs.get("weights")
    w = np.ones(counts.shape[1]) if weights is None else np.asarray(weights, np.float64)
    if attrs["mode"] == "TF":
        return counts.astype(np.float64)
    if attrs["mode"] == "IDF":
        return np.where(counts > 0, w, 0.0)
    return w * counts


def tfidf_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    """The weighted n-gram counts of each row (see the module doc).

    Example:
        >>> attrs = {"mode": "TFIDF", "min_gram_length": 1, "max_gram_length": 1, "max_skip_count": 0,
        ...          "ngram_counts": (0,), "ngram_indexes": (1, 0), "pool_int64s": None,
        ...          "pool_strings": ("a", "b"), "weights": (0.5, 2.0)}
        >>> tfidf_reference([np.array([["a", "b", "a"]], dtype=object)], attrs).tolist()
        [[2.0, 1.0]]
    """
    x = np.asarray(inputs[0])
    pool = NgramPool.of(attrs)
    rows = x.reshape(1, -1) if x.ndim < 2 else x
    tokens = as_strings(rows) if pool.vocabulary.dtype == object else rows
    counts = count_ngrams(_token_ids(tokens, pool.vocabulary), pool, attrs["max_skip_count"])
    columns = np.asarray(attrs["ngram_indexes"], np.int64)
    width = int(columns.max()) + 1
    values = _weighted(counts, attrs)
    out = np.zeros((rows.shape[0], width))
    np.add.at(out, (slice(None), columns), values)
    out = out.astype(np.float32)
    return out.reshape(width) if x.ndim < 2 else out


def _pool_problem(attrs: Mapping[str, Any]) -> str | None:
    """What is wrong with the node's pool attributes, or None."""
    pools = [k for k in ("pool_int64s", "pool_strings") if attrs[k] is not None]
    if len(pools) != 1:
        return "give exactly one of pool_int64s and pool_strings"
    if attrs["mode"] not in MODES:
        return f"mode={attrs['mode']!r} must be one of {', '.join(MODES)}"
    if not 1 <= attrs["min_gram_length"] <= attrs["max_gram_length"]:
        return (f"min_gram_length={attrs['min_gram_length']} and max_gram_length="
                f"{attrs['max_gram_length']} must satisfy 1 <= min <= max")
    if attrs["max_skip_count"] < 0:
        return f"max_skip_count={attrs['max_skip_count']} must not be negative"
    starts = list(attrs["ngram_counts"])
    size = len(attrs[pools[0]])
    if any(not 0 <= a <= b <= size for a, b in zip(starts, [*starts[1:], size])):
        return f"ngram_counts {starts} must be ascending starts inside the pool of {size} items"
    pool = NgramPool.of(attrs)
    indexes = attrs["ngram_indexes"]
    if len(indexes) != pool.count or min(indexes, default=0) < 0:
        return (f"ngram_indexes has {len(indexes)} entries but the pool lists {pool.count} n-grams "
                "(it needs one non-negative output column each)")
    if attrs["weights"] is not None and len(attrs["weights"]) != pool.count:
        return f"weights has {len(attrs['weights'])} entries but the pool lists {pool.count} n-grams"
    for n, (grams, _) in pool.grams.items():
        if len(np.unique(grams, axis=0)) != len(grams):
            return f"the pool lists a {n}-gram twice"
    return None


def _tfidf_rule(ctx: InferContext) -> list[Any]:
    problem = _pool_problem(ctx.attrs)
    if problem is not None:
        ctx.fail(problem)
    texts = ctx.attrs["pool_strings"] is not None
    if (ctx.dtype(0) is STRING) != texts:
        raise DTypeError(f"op TfIdfVectorizer (node {ctx.node}): input X is {ctx.dtype(0).name} but the "
                         f"pool is {'pool_strings' if texts else 'pool_int64s'}: "
                         f"{'string' if texts else 'int32 or int64'} tokens are needed")
    x = ctx.shape(0)
    if x is not None and len(x) not in (1, 2):
        ctx.fail(f"X must be [C] or [N, C], got rank {len(x)}")
    width = max(ctx.attrs["ngram_indexes"]) + 1
    shape = None if x is None else (width,) if len(x) == 1 else (x[0], width)
    return [TensorType(FLOAT32, shape)]


TfIdfVectorizer = metaop(
    "TfIdfVectorizer", inputs=("X: T",), outputs=("Y: T1",),
    attrs={"max_gram_length": int_(REQUIRED), "max_skip_count": int_(REQUIRED),
           "min_gram_length": int_(REQUIRED), "mode": string(REQUIRED), "ngram_counts": ints(REQUIRED),
           "ngram_indexes": ints(REQUIRED), "pool_int64s": ints(None), "pool_strings": strings(None),
           "weights": floats(None)},
    types="T in {int32, int64, string}; T1 in {float32}", rule=_tfidf_rule,
    reference=tfidf_reference, role=Role.OPAQUE, since=(9,),
    doc="Weighted counts of the pool's n-grams (with skips) in each token sequence.",
)

__all__ = ["MODES", "NgramPool", "TfIdfVectorizer", "count_ngrams", "tfidf_reference"]
