"""The optimization levels: named lists of named passes.

- ``safe``: never changes numerics (only removes, folds and deduplicates what is exactly
  equal: constant folding evaluates the same ops the runtime would).
- ``moderate``: also folds BatchNormalization into the preceding weights and recognizes
  decomposed patterns (LayerNorm, GELU, SiLU, HardSwish, attention; first, before folding
  dequantizes int8 weights, quantized layers in QDQ form) as single ops; numerics change by
  rounding only.
- ``aggressive``: also decomposes ops the backends have no fast form of (GroupNormalization,
  Tile), chooses layouts, tabulates costly elementwise chains of one 8-bit tensor (256-entry
  tables of the reference's own results) and forms fusion groups, the units of code generation.

Example:
    >>> [p.__name__ for p in PIPELINES["safe"]][:3]
    ['simplify', 'fold_shape_arithmetic', 'fold_constants']
"""

from __future__ import annotations

from metadef.passes.base import GraphPass
from metadef.passes.decompose import decompose
from metadef.passes.eliminate_common_subexpressions import eliminate_common_subexpressions
from metadef.passes.eliminate_dead_code import eliminate_dead_code
from metadef.passes.fold_batchnorm import fold_batchnorm
from metadef.passes.fold_constants import fold_constants
from metadef.passes.fold_if import fold_if
from metadef.passes.fold_shape_arithmetic import fold_shape_arithmetic
from metadef.passes.fuse_groups import fuse_groups
from metadef.passes.optimize_layout import optimize_layout
from metadef.passes.recognize_patterns import recognize_patterns
from metadef.passes.recognize_quantized import recognize_quantized
from metadef.passes.simplify import simplify
from metadef.passes.tabulate import tabulate

_CLEANUP: list[GraphPass] = [
    simplify,
    fold_shape_arithmetic,
    fold_constants,
    fold_if,
    eliminate_common_subexpressions,
    eliminate_dead_code,
]

PIPELINES: dict[str, list[GraphPass]] = {
    "none": [],
    "safe": _CLEANUP,
    "moderate": [recognize_quantized, *_CLEANUP, fold_batchnorm, recognize_patterns, fold_constants, simplify,
                 eliminate_dead_code],
    "aggressive": [
        recognize_quantized, *_CLEANUP, fold_batchnorm, recognize_patterns, decompose, optimize_layout,
        fold_shape_arithmetic, fold_constants, simplify, tabulate,
        eliminate_common_subexpressions, eliminate_dead_code, fuse_groups,
    ],
}

LEVELS = tuple(PIPELINES)

__all__ = ["LEVELS", "PIPELINES"]
