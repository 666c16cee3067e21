"""The rule tables of ``recognize_patterns``, one family a file: ``layernorm_rules``,
``gelu_rules``, ``silu_rules``, ``hardswish_rules``, ``attention_rules``; ``common`` holds the
checks they share (constants within 1e-6 relative, interior values read outside the match,
opset bumps, deterministic names).

Example:
    >>> from metadef.passes.patterns.common import scalar
    >>> import numpy as np
    >>> from metadef.ir import Value
    >>> scalar(0.5)(Value("half", None, np.float32(0.5)))
    True
"""
