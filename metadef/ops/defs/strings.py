"""String ops: ``StringNormalizer``, ``StringConcat``, ``StringSplit`` and ``RegexFullMatch``.

String tensors are numpy object arrays of Python ``str`` (:data:`~metadef.core.dtypes.STRING`).
No op here is a comprehension over numbers, so each carries a numpy reference and is opaque;
the x86 backend runs them on that reference. The semantics are ONNX Runtime's where the ONNX
text leaves room:

- ``StringNormalizer`` (opset 10) takes ``[C]`` or ``[1, C]`` with ``C > 0``. It drops the
  elements equal to a stopword (the whole element; unless ``is_case_sensitive=1`` both sides
  are lowercased first, whatever ``case_change_action`` says), then changes the case of the
  rest (``LOWER``, ``UPPER`` or ``NONE``).
  Case changes map one character to one character (Unicode's simple case mapping, as the
  C library's ``towupper`` does: ``"ß"`` stays, ``"İ"`` lowers to ``"i"``) whatever the
  ``locale`` attribute says. When every element is dropped the output is ``[""]`` of shape
  ``[1]`` (``[1, 1]`` for a 2-D input). With stopwords the output length depends on the
  values (a fresh symbol).
- ``StringConcat`` (opset 20) concatenates elementwise with numpy broadcasting.
- ``StringSplit`` (opset 20) splits each element at ``delimiter`` (at most ``maxsplit`` times;
  absent or negative: no limit). Without a delimiter (absent or ``""``) it splits at runs of
  spaces (U+0020 only) and drops the empty pieces at both ends. An empty string has no pieces.
  ``Y`` is ``[*X.shape, pieces]``: every element's pieces padded with ``""`` to the largest
  count (a data-dependent dim); ``Z`` (int64, X's shape) counts each element's pieces.
- ``RegexFullMatch`` (opset 20) says whether each element matches ``pattern`` as a whole. The
  pattern is RE2 syntax, translated to Python's ``re`` (:func:`re2_to_python`): ``\\d \\w \\s
  \\b`` are ASCII as in RE2; constructs RE2 lacks (backreferences, lookaround, atomic groups,
  possessive quantifiers) are refused at shape inference, as ONNX Runtime refuses them.

Example:
    >>> from metadef.testing.onnx_cases import infer_text
    >>> infer_text("StringSplit", ["str[n,2]"], {"delimiter": ","})
    ['str[n,2,pieces_0]', 'i64[n,2]']
    >>> infer_text("StringConcat", ["str[3]", "str[]"])
    ['str[3]']
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from metadef.core.dtypes import as_strings
from metadef.core.errors import BackendError
from metadef.ops.infer import InferContext
from metadef.ops.interface import REQUIRED, int_, string, strings
from metadef.ops.metaop import BROADCAST_ALL, metaop
from metadef.ops.strategy import Role

Arrays = list[np.ndarray | None]
CASE_ACTIONS = ("NONE", "LOWER", "UPPER")


# ------------------------------------------------------------------------ StringNormalizer


@functools.cache
def _upper_char(c: str) -> str:
    """One character's simple uppercase (one character, or itself when Unicode maps it to
    several: ``"ß"``, ``"ŉ"``; a titlecase form of one character where that is the simple
    mapping, as for ``"ᾳ"``)."""
    up = c.upper()
    if len(up) == 1:
        return up
    title = c.title()
    return title if len(title) == 1 else c


@functools.cache
def _lower_char(c: str) -> str:
    """One character's simple lowercase (``"İ"`` gives ``"i"``, not ``"i̇"``)."""
    return c.lower()[0]


def change_case(text: str, action: str) -> str:
    """``text`` under ``action`` (``LOWER``, ``UPPER`` or ``NONE``), one character to one.

    Example:
        >>> change_case("Straße", "UPPER"), change_case("İSTANBUL", "LOWER")
        ('STRAßE', 'istanbul')
    """
    if action == "NONE":
        return text
    if text.isascii():
        return text.upper() if action == "UPPER" else text.lower()
    return "".join(map(_upper_char if action == "UPPER" else _lower_char, text))


def _normalizer_rule(ctx: InferContext) -> list[Any]:
    action = ctx.attrs["case_change_action"]
    if action not in CASE_ACTIONS:
        ctx.fail(f"case_change_action must be one of {', '.join(CASE_ACTIONS)}, got {action!r}")
    s = ctx.shape(0)
    if s is None:
        return [None]
    if len(s) not in (1, 2) or (len(s) == 2 and isinstance(s[0], int) and s[0] != 1):
        ctx.fail(f"X must be [C] or [1, C], got {list(s)}")
    if isinstance(s[-1], int) and s[-1] == 0:
        ctx.fail("X must hold at least one string (C > 0), as ONNX Runtime requires")
    if not ctx.attrs["stopwords"]:
        return [s]
    return [(*s[:-1], ctx.fresh("kept"))]


def string_normalizer_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """Drop the stopwords, then change the case (see the module doc).

    Example:
        >>> attrs = {"case_change_action": "UPPER", "is_case_sensitive": 0, "locale": None,
        ...          "stopwords": ("monday",)}
        >>> string_normalizer_reference([np.array(["Monday", "tuesday", ""], object)], attrs)
        array(['TUESDAY', ''], dtype=object)
    """
    x = as_strings(inputs[0])
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1) or x.shape[-1] == 0:
        raise BackendError(f"StringNormalizer: X must be [C] or [1, C] with C > 0, got {list(x.shape)}")
    action, stops = attrs["case_change_action"], attrs["stopwords"] or ()
    row = x.reshape(-1).tolist()
    if attrs["is_case_sensitive"]:
        exact = set(stops)
        kept = [t for t in row if t not in exact]
    else:  # compared in lowercase, as ONNX Runtime compares them
        folded = {change_case(w, "LOWER") for w in stops}
        kept = [t for t in row if change_case(t, "LOWER") not in folded]
    out = as_strings([change_case(t, action) for t in kept] or [""])
    return out.reshape(1, -1) if x.ndim == 2 else out


StringNormalizer = metaop(
    "StringNormalizer", inputs=("X: string",), outputs=("Y: string",),
    attrs={"case_change_action": string("NONE"), "is_case_sensitive": int_(0), "locale": string(),
           "stopwords": strings()},
    rule=_normalizer_rule, reference=string_normalizer_reference, role=Role.OPAQUE, since=(10,),
    doc="Drops the elements that are stopwords, then lower- or uppercases the rest.",
)


# ---------------------------------------------------------------------------- StringConcat


def string_concat_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """``X + Y`` elementwise, broadcast.

    Example:
        >>> string_concat_reference([np.array(["a", "é"], object), np.array("!", object)], {})
        array(['a!', 'é!'], dtype=object)
    """
    x, y = np.broadcast_arrays(as_strings(inputs[0]), as_strings(inputs[1]))
    return as_strings([a + b for a, b in zip(x.reshape(-1).tolist(), y.reshape(-1).tolist())]).reshape(x.shape)


StringConcat = metaop(
    "StringConcat", inputs=("X", "Y"), outputs=("Z",), types="T in {string}", rule=BROADCAST_ALL,
    reference=string_concat_reference, role=Role.OPAQUE, since=(20,),
    doc="X and Y concatenated elementwise (numpy broadcasting).",
)


# ----------------------------------------------------------------------------- StringSplit


def _split_spaces(text: str, maxsplit: int) -> list[str]:
    """``text`` split at runs of spaces, no empty pieces; the last piece (after ``maxsplit``
    splits) keeps its inner spaces but not its trailing ones."""
    rest, pieces = text.lstrip(" "), []
    while rest and (maxsplit < 0 or len(pieces) < maxsplit):
        cut = rest.find(" ")
        if cut < 0:
            break
        pieces.append(rest[:cut])
        rest = rest[cut:].lstrip(" ")
    return pieces + [rest.rstrip(" ")] if rest else pieces


def split_string(text: str, delimiter: str | None, maxsplit: int | None) -> list[str]:
    """The pieces of one element (see the module doc).

    Example:
        >>> split_string("a,b,,c", ",", 2), split_string("  a  b c  ", None, 1), split_string("", ",", None)
        (['a', 'b', ',c'], ['a', 'b c'], [])
    """
    limit = -1 if maxsplit is None or maxsplit < 0 else maxsplit
    if not delimiter:
        return _split_spaces(text, limit)
    return text.split(delimiter, limit) if text else []


def _split_rule(ctx: InferContext) -> list[Any]:
    s = ctx.shape(0)
    if s is None:
        return [None, None]
    empty = any(isinstance(d, int) and d == 0 for d in s)
    return [(*s, 0 if empty else ctx.fresh("pieces")), s]


def string_split_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each element's pieces, padded with ``""`` to the largest count, and the counts.

    Example:
        >>> y, z = string_split_reference([np.array(["a b", "c"], object)], {"delimiter": None, "maxsplit": None})
        >>> y.tolist(), z.tolist()
        ([['a', 'b'], ['c', '']], [2, 1])
    """
    x = as_strings(inputs[0])
    pieces = [split_string(t, attrs["delimiter"], attrs["maxsplit"]) for t in x.reshape(-1).tolist()]
    counts = np.array([len(p) for p in pieces], np.int64).reshape(x.shape)
    width = max(map(len, pieces), default=0)
    y = as_strings([t for p in pieces for t in p + [""] * (width - len(p))])
    return y.reshape(*x.shape, width), counts


StringSplit = metaop(
    "StringSplit", inputs=("X: string",), outputs=("Y: string", "Z: int64"),
    attrs={"delimiter": string(), "maxsplit": int_()}, rule=_split_rule,
    reference=string_split_reference, role=Role.OPAQUE, since=(20,),
    doc="Each element split at a delimiter (or at runs of spaces): the pieces padded to the "
        "largest count, and the count of each.",
)


# -------------------------------------------------------------------------- RegexFullMatch

_ASCII_CLASSES = {"d": "0-9", "w": "0-9A-Za-z_", "s": "\\t\\n\\f\\r "}
_WORD = "[0-9A-Za-z_]"
_BOUNDARIES = {"b": f"(?:(?<={_WORD})(?!{_WORD})|(?<!{_WORD})(?={_WORD}))",
               "B": f"(?:(?<={_WORD})(?={_WORD})|(?<!{_WORD})(?!{_WORD}))"}
_POSIX = {"alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ",
          "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9", "graph": "!-~", "lower": "a-z",
          "print": " -~", "punct": "!-/:-@\\[-`{-~", "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z",
          "word": "0-9A-Za-z_", "xdigit": "0-9A-Fa-f"}
_GROUP_REFUSED = {"(?=": "lookahead", "(?!": "negative lookahead", "(?<=": "lookbehind",
                  "(?<!": "negative lookbehind", "(?>": "atomic groups", "(?(": "conditionals",
                  "(?P=": "named backreferences", "(?#": "comments"}
_REPEAT = re.compile(r"\{\d+(?:,\d*)?\}")
_FLAGS = re.compile(r"\(\?([imsU]*)(?:-([imsU]*))?([:)])")


class RE2Unsupported(ValueError):
    """A pattern uses syntax RE2 does not have, or that Python's ``re`` cannot express.

    Example:
        >>> re2_to_python(r"(a)\\1")
        Traceback (most recent call last):
        ...
        metadef.ops.defs.strings.RE2Unsupported: backreferences (\\1 ...)
    """


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """The translation of the escape at ``pattern[i]`` (a backslash), and where it ends."""
    if i + 1 >= len(pattern):
        raise RE2Unsupported("the pattern ends in a lone backslash")
    e = pattern[i + 1]
    if e in "dws":
        return (_ASCII_CLASSES[e] if in_class else f"[{_ASCII_CLASSES[e]}]"), i + 2
    if e in "DWS":
        if in_class:
            raise RE2Unsupported(f"\\{e} inside a character class")
        return f"[^{_ASCII_CLASSES[e.lower()]}]", i + 2
    if e in "bB" and not in_class:
        return _BOUNDARIES[e], i + 2
    if e == "z":
        return "\\Z", i + 2
    if e in "123456789":
        raise RE2Unsupported("backreferences (\\1 ...)")
    if e in "pPCZ":
        raise RE2Unsupported(f"\\{e}")
    if e == "Q":
        end = pattern.find("\\E", i + 2)
        stop = len(pattern) if end < 0 else end
        return re.escape(pattern[i + 2:stop]), (stop if end < 0 else end + 2)
    if e == "x" and pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 3)
        if end < 0 or not re.fullmatch(r"[0-9A-Fa-f]{1,6}", pattern[i + 3:end]):
            raise RE2Unsupported(f"a bad hex escape {pattern[i:i + 12]!r}")
        return f"\\U{int(pattern[i + 3:end], 16):08x}", end + 1
    return "\\" + e, i + 2


def re2_to_python(pattern: str) -> str:
    """An RE2 pattern as a Python ``re`` pattern that matches the same strings; raises
    :class:`RE2Unsupported` for what RE2 lacks (backreferences, lookaround, atomic groups,
    possessive quantifiers).

    Example:
        >>> re2_to_python(r"[\\w.]+\\d")
        '[0-9A-Za-z_.]+[0-9]'
        >>> re2_to_python("a(?i)b|c"), re2_to_python("(x)$")
        ('a(?i:b)|(?i:c)', '(x)\\\\Z')
    """
    out: list[str] = []
    scoped: list[list[str]] = [[]]  # per open group: the scoped-flag groups opened in it
    in_class, repeated, i, n = False, False, 0, len(pattern)
    multiline = any("m" in (m.group(1) or "") for m in _FLAGS.finditer(pattern))
    while i < n:
        c = pattern[i]
        if c == "\\":
            piece, i = _escape(pattern, i, in_class)
            out.append(piece)
            repeated = False
            continue
        if in_class:
            posix = re.match(r"\[:(\^?)([a-z]+):\]", pattern[i:])
            if posix and posix.group(2) in _POSIX:
                if posix.group(1):
                    raise RE2Unsupported(f"negated POSIX class {posix.group(0)}")
                out.append(_POSIX[posix.group(2)])
                i += posix.end()
                continue
            in_class = c != "]"
            out.append("\\[" if c == "[" else c)
            i += 1
            continue
        if c == "[":
            head = "[^" if pattern.startswith("[^", i) else "["
            i += len(head)
            out.append(head)
            if i < n and pattern[i] == "]":
                out.append("\\]")
                i += 1
            in_class, repeated = True, False
            continue
        if c == "(":
            refused = next((what for start, what in _GROUP_REFUSED.items() if pattern.startswith(start, i)), None)
            if refused:
                raise RE2Unsupported(refused)
            flags = _FLAGS.match(pattern, i)
            if flags and "U" in flags.group(0):
                raise RE2Unsupported("the U (ungreedy) flag")
            if flags and flags.group(3) == ")":  # (?i): Python scopes flags, RE2 sets them to the group's end
                out.append(flags.group(0)[:-1] + ":")
                scoped[-1].append(out[-1])
                i = flags.end()
                continue
            scoped.append([])
            if pattern.startswith("(?<", i):  # RE2's (?<name>re) is Python's (?P<name>re)
                out.append("(?P<")
                i += 3
                continue
        elif c == ")":
            out.append(")" * len(scoped.pop()) if len(scoped) > 1 else "")
        elif c == "|":  # the flags hold in every alternative after them
            out.extend([")" * len(scoped[-1]), "|", *scoped[-1]])
            i += 1
            repeated = False
            continue
        elif c == "$" and not multiline:
            out.append("\\Z")
            i += 1
            repeated = False
            continue
        elif c == "+" and repeated:
            raise RE2Unsupported("possessive quantifiers (*+, ++, ?+)")
        elif c == "{" and _REPEAT.match(pattern, i):
            end = _REPEAT.match(pattern, i).end()
            out.append(pattern[i:end])
            i, repeated = end, True
            continue
        out.append(c)
        repeated = c in "*+?"
        i += 1
    if in_class:
        raise RE2Unsupported("an unclosed character class")
    return "".join(out) + ")" * len(scoped[0])


@functools.lru_cache(maxsize=256)
def compile_re2(pattern: str) -> re.Pattern[str]:
    """The compiled Python form of an RE2 pattern (cached); raises :class:`RE2Unsupported`
    (a ``ValueError``) naming what is wrong.

    Example:
        >>> bool(compile_re2(r"\\w+").fullmatch("日本"))
        False
    """
    try:
        return re.compile(re2_to_python(pattern))
    except re.error as e:
        raise RE2Unsupported(f"it does not parse ({e})") from None


def _regex_rule(ctx: InferContext) -> list[Any]:
    try:
        compile_re2(ctx.attrs["pattern"])
    except RE2Unsupported as e:
        ctx.fail(f"pattern {ctx.attrs['pattern']!r} is not an RE2 pattern metadef can run: {e}")
    return [ctx.shape(0)]


def regex_full_match_reference(inputs: Arrays, attrs: Mapping[str, Any]) -> np.ndarray:
    """Whether each element matches the pattern as a whole.

    Example:
        >>> regex_full_match_reference([np.array(["ab1", "ab"], object)], {"pattern": "[a-z]+\\\\d"})
        array([ True, False])
    """
    x = as_strings(inputs[0])
    regex = compile_re2(attrs["pattern"])
    return np.array([regex.fullmatch(t) is not None for t in x.reshape(-1).tolist()], bool).reshape(x.shape)


RegexFullMatch = metaop(
    "RegexFullMatch", inputs=("X: string",), outputs=("Y: bool",), attrs={"pattern": string(REQUIRED)},
    rule=_regex_rule, reference=regex_full_match_reference, role=Role.OPAQUE, since=(20,),
    doc="Whether each element matches an RE2 pattern as a whole.",
)

__all__ = ["CASE_ACTIONS", "RE2Unsupported", "RegexFullMatch", "StringConcat", "StringNormalizer",
           "StringSplit", "change_case", "compile_re2", "re2_to_python", "regex_full_match_reference",
           "split_string", "string_concat_reference", "string_normalizer_reference",
           "string_split_reference"]
