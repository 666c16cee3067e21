"""Pattern rewriting (L4): the pattern language, the editor, the engine and the decision log.

Example:
    >>> from metadef.rewrite import Rule, op, var
    >>> Rule("drop_identity", op("Identity", var("x")), lambda m, ed: m.value("x"), fuses=False).name
    'drop_identity'
"""

from metadef.rewrite.decisions import Decision, DecisionLog
from metadef.rewrite.editor import GraphEditor
from metadef.rewrite.engine import Refusal, RewriteOptions, Rule, apply_rules, rewrite
from metadef.rewrite.pattern import Match, OpPattern, Pattern, VarPattern, const, match, op, var

__all__ = [
    "Decision", "DecisionLog", "GraphEditor", "Match", "OpPattern", "Pattern", "Refusal",
    "RewriteOptions", "Rule", "VarPattern", "apply_rules", "const", "match", "op", "rewrite", "var",
]
