"""String tensors and the ONNX string ops (StringNormalizer, StringConcat, StringSplit,
RegexFullMatch, Equal on strings, LabelEncoder with string keys or values): numerics against
ONNX Runtime on inputs the node tests do not use (unicode, empty strings, empty tensors,
broadcasting, 2-D), the x86 backend's per-node fallback, the .mdef refusal, and the errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import metadef as md
from metadef.cache.keys import array_hash
from metadef.core.dtypes import STRING
from metadef.core.errors import AttributeError_, BackendError, DTypeError, InputError, ShapeError
from metadef.format.errors import CompatError
from metadef.ir import GraphBuilder, parse_graph, verify
from metadef.ops.defs.strings import re2_to_python, split_string
from metadef.shape import parse_type
from metadef.testing.onnx_cases import assert_same, infer_text, one_node_model, run_both, run_metadef
from metadef.testing.oracle import compare_with_onnxruntime, run_onnxruntime


def S(*items: Any) -> np.ndarray:
    """A string tensor (a numpy object array of str)."""
    return np.array(items, dtype=object)


def model(op: str, feeds: Mapping[str, np.ndarray], n_out: int = 1, **attrs: Any) -> onnx.ModelProto:
    return one_node_model(op, feeds, n_out=n_out, opset=20, **attrs)


def check(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """metadef's reference backend gives ONNX Runtime's outputs (strings: exactly); returns them."""
    got, want = run_both(m, feeds)
    assert_same(got, want)
    for g in got:
        if g.dtype == object:
            assert all(type(s) is str for s in g.reshape(-1).tolist())
    return got


# ------------------------------------------------------------------------ the string dtype


def test_string_is_a_dtype_that_numeric_ops_refuse() -> None:
    assert STRING.onnx == TensorProto.STRING and STRING.numpy == np.dtype(object) and STRING.short == "str"
    assert infer_text("Equal", ["str[n,3]", "str[3]"]) == ["b8[n,3]"]
    with pytest.raises(DTypeError, match=r"op Relu \(node /node\): input 0 \(X\) has dtype string"):
        infer_text("Relu", ["str[n]"])
    with pytest.raises(DTypeError, match=r"op Add \(node /node\).*dtype string"):
        infer_text("Add", ["str[n]", "str[n]"])
    with pytest.raises(DTypeError, match="earlier input of type T is string"):
        infer_text("Equal", ["str[n]", "f32[n]"])
    with pytest.raises(DTypeError, match=r"output 0 \(output\) would be a string tensor, but EyeLike computes"):
        infer_text("EyeLike", ["f32[3,3]"], {"dtype": TensorProto.STRING})
    with pytest.raises(DTypeError, match="would be a string tensor, but ConstantOfShape"):
        infer_text("ConstantOfShape", ["i64[1]"], {"value": S("a")}, values=[[2]])


def test_string_inputs_initializers_and_constants_import() -> None:
    """Graph inputs, initializers (bytes in the proto, str in metadef) and Constant nodes
    (value, value_string, value_strings) of strings."""
    nodes = [helper.make_node("Constant", [], ["c1"], value_string="¡"),
             helper.make_node("Constant", [], ["c2"], value_strings=["é", "", "z"]),
             helper.make_node("Constant", [], ["c3"], value=helper.make_tensor("v", TensorProto.STRING, [1], [b"!"])),
             helper.make_node("StringConcat", ["x", "init"], ["a"]),
             helper.make_node("StringConcat", ["a", "c1"], ["b"]),
             helper.make_node("StringConcat", ["b", "c2"], ["c"]),
             helper.make_node("StringConcat", ["c", "c3"], ["y"])]
    init = helper.make_tensor("init", TensorProto.STRING, [3], ["ñ".encode(), b"", "日".encode()])
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.STRING, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.STRING, None)], [init])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    graph = md.import_onnx(m)
    assert str(graph.inputs[0].type) == "str[n,3]" and str(graph.outputs[0].type) == "str[n,3]"
    assert all(type(s) is str for c in graph.constants for s in c.const.reshape(-1).tolist())
    x = np.array([["a", "b", "c"], ["", "ü", "😀"]], dtype=object)
    (got,), _ = run_both(m, {"x": x})
    want = run_onnxruntime(m, {"x": x})["y"]
    assert got.tolist() == want.tolist() == [["añ¡é!", "b¡!", "c日¡z!"], ["ñ¡é!", "ü¡!", "😀日¡z!"]]


# ------------------------------------------------------------------------- StringNormalizer


def normalizer(x: np.ndarray, **attrs: Any) -> onnx.ModelProto:
    return one_node_model("StringNormalizer", {"x": x}, opset=10, locale="C.UTF-8", **attrs)


def check_normalizer(x: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """Against ONNX Runtime, whose StringNormalizer needs a C library locale (C.UTF-8 here)."""
    m = normalizer(x, **attrs)
    try:
        want = run_onnxruntime(m, {"x": x})["out0"]
    except Exception as e:  # pragma: no cover - depends on the machine's locales
        pytest.skip(f"ONNX Runtime cannot build its locale here: {e}")
    got = run_metadef(m, {"x": x})
    assert_same(got, [want])
    return got


WORDS = S("Straße", "ÉCOLE", "İstanbul", "ΣΑΣ", "ǅ", "", "monday", "MONDAY", "ﬁx", "σας", "ẞ", "ς", "Σ")


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("sensitive", [0, 1])
def test_string_normalizer_matches_onnxruntime(action: str, sensitive: int) -> None:
    check_normalizer(WORDS, case_change_action=action, is_case_sensitive=sensitive,
                     stopwords=["Monday", "straße", "σας", "ß", "Σ"])
    check_normalizer(WORDS.reshape(1, -1), case_change_action=action, is_case_sensitive=sensitive)


def test_string_normalizer_keeps_one_empty_string_when_all_are_dropped() -> None:
    (y,) = check_normalizer(S("a", "A", "a"), stopwords=["a"])
    assert y.tolist() == [""]
    (y,) = check_normalizer(S("a", "b").reshape(1, 2), case_change_action="UPPER", stopwords=["B", "A"])
    assert y.tolist() == [[""]]


def test_string_normalizer_shapes_and_errors() -> None:
    assert infer_text("StringNormalizer", ["str[n]"]) == ["str[n]"]
    assert infer_text("StringNormalizer", ["str[1,n]"], {"stopwords": ("a",)}) == ["str[1,kept_0]"]
    with pytest.raises(ShapeError, match=r"X must be \[C\] or \[1, C\], got \[2, 3\]"):
        infer_text("StringNormalizer", ["str[2,3]"])
    with pytest.raises(ShapeError, match=r"at least one string \(C > 0\)"):
        infer_text("StringNormalizer", ["str[0]"])
    with pytest.raises(ShapeError, match="case_change_action must be one of NONE, LOWER, UPPER, got 'TITLE'"):
        infer_text("StringNormalizer", ["str[3]"], {"case_change_action": "TITLE"})
    with pytest.raises(DTypeError, match=r"input 0 \(X\) must be string, got float32"):
        infer_text("StringNormalizer", ["f32[3]"])
    b = GraphBuilder("n")
    b.output(*b.node("StringNormalizer", [b.input("x", parse_type("str[c]"))]))
    with pytest.raises(BackendError, match=r"C > 0, got \[0\]"):
        md.compile(b.build()).run({"x": np.zeros(0, object)})


# ----------------------------------------------------------------------------- StringConcat


@pytest.mark.parametrize(("x", "y"), [
    (S("a", "é", "", "日本"), S("ß", "", "😀", "")),
    (np.array([["x"], ["", ]], dtype=object), S("1", "", "ü")),           # 2-D broadcast both ways
    (np.array("pre-", dtype=object), np.array([["a", "b"], ["", "c"]], dtype=object)),  # 0-d
    (np.zeros((0, 3), object), S("1", "2", "3")),                          # empty
])
def test_string_concat_matches_onnxruntime(x: np.ndarray, y: np.ndarray) -> None:
    check(model("StringConcat", {"x": x, "y": y}), {"x": x, "y": y})


def test_string_concat_shapes_and_errors() -> None:
    assert infer_text("StringConcat", ["str[n,1]", "str[4]"]) == ["str[n,4]"]
    with pytest.raises(ShapeError, match="cannot broadcast"):
        infer_text("StringConcat", ["str[3]", "str[4]"])
    with pytest.raises(DTypeError, match=r"must be one of \{string\}"):
        infer_text("StringConcat", ["str[3]", "i64[3]"])


# ------------------------------------------------------------------------------ StringSplit


SENTENCES = S("a,b,,c", "", ",", "日本,語", "  a  b\tc\n ", "a  b  c  ", " ", "x", "é,", "abcabc")


@pytest.mark.parametrize("attrs", [
    {"delimiter": ","}, {"delimiter": ",", "maxsplit": 1}, {"delimiter": ",", "maxsplit": 0},
    {"delimiter": ",", "maxsplit": -1}, {}, {"maxsplit": 1}, {"maxsplit": 2}, {"delimiter": ""},
    {"delimiter": "bc"}, {"delimiter": " "}, {"delimiter": "日"},
])
def test_string_split_matches_onnxruntime(attrs: dict[str, Any]) -> None:
    check(model("StringSplit", {"x": SENTENCES}, n_out=2, **attrs), {"x": SENTENCES})


@pytest.mark.parametrize("x", [
    SENTENCES[:6].reshape(2, 3), np.zeros((2, 0), object), S("", ""), np.array("a b  c", dtype=object)])
def test_string_split_shapes_match_onnxruntime(x: np.ndarray) -> None:
    y, z = check(model("StringSplit", {"x": x}, n_out=2), {"x": x})
    assert y.shape[:-1] == z.shape == x.shape


def test_string_split_shapes() -> None:
    assert infer_text("StringSplit", ["str[n,3]"]) == ["str[n,3,pieces_0]", "i64[n,3]"]
    assert infer_text("StringSplit", ["str[n,0]"]) == ["str[n,0,0]", "i64[n,0]"]
    assert split_string("a b", None, None) == ["a", "b"] and split_string("", None, None) == []


# --------------------------------------------------------------------------- RegexFullMatch


TEXTS = S("abc", "ABC", "", "日本", "a1_", "é", "a b", "www.x.com", "a\nb", "aaa", "Ab-9", "x@gmail.com")


@pytest.mark.parametrize("pattern", [
    "[a-z]*", r"\w+", r"\W*", r"\d\w*", r"[\w.]+", r"[^\d\s]+", r"\s", r".\s.", "(?i)ab[c-d]", "a(?i)BC",
    "A(?i)b|abc", "(a(?i)B|x)C", ".", ".*", r"a.b", r"(?s)a.b", r"www\.\w+\.\bcom\b", r"\Bb\w*",
    "[[:alpha:]]+", "[[:digit:][:upper:]]+",
    "a{2,}", r"(a|b)+?", r"\x{65}\x{301}?|é", r"\Qa.b\E|a\z", r"(?P<w>\w+)-\d", r"(?<n>[a-z])+\d?",
    r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)", "abc$", "(?m)abc$",
])
def test_regex_full_match_matches_onnxruntime(pattern: str) -> None:
    check(model("RegexFullMatch", {"x": TEXTS}, pattern=pattern), {"x": TEXTS})


def test_regex_full_match_shapes_2d_and_empty() -> None:
    for x in (TEXTS.reshape(3, 4), np.zeros((2, 0), object), np.array("abc", dtype=object)):
        (y,) = check(model("RegexFullMatch", {"x": x}, pattern=r"\w+"), {"x": x})
        assert y.shape == x.shape and y.dtype == np.bool_


@pytest.mark.parametrize(("pattern", "why"), [
    (r"(a)\1", "backreferences"), ("a(?=b)", "lookahead"), ("(?<!a)b", "negative lookbehind"),
    ("a++", "possessive"), ("(?>a)", "atomic groups"), ("a(", "does not parse"), (r"\pL", r"\\p"),
])
def test_regex_full_match_refuses_what_re2_lacks(pattern: str, why: str) -> None:
    with pytest.raises(ShapeError, match=f"pattern .* is not an RE2 pattern metadef can run: .*{why}"):
        infer_text("RegexFullMatch", ["str[n]"], {"pattern": pattern})
    with pytest.raises(AttributeError_, match="required attribute 'pattern'"):
        infer_text("RegexFullMatch", ["str[n]"])


def test_re2_translation_keeps_classes_ascii() -> None:
    assert re2_to_python(r"\d[\s]\W") == "[0-9][\\t\\n\\f\\r ][^0-9A-Za-z_]"
    assert re2_to_python("[]a]") == "[\\]a]" and re2_to_python(r"[a\]]") == r"[a\]]"


# ---------------------------------------------------------------------- Equal and LabelEncoder


@pytest.mark.parametrize(("a", "b"), [
    (S("a", "é", "", "日本", "e\u0301"), S("a", "e", "", "日本", "é")),
    (np.array([["x", ""], ["y", "z"]], dtype=object), S("", "z")),
    (np.zeros((0, 2), object), S("a", "b")),
])
def test_equal_on_strings_matches_onnxruntime(a: np.ndarray, b: np.ndarray) -> None:
    check(model("Equal", {"a": a, "b": b}), {"a": a, "b": b})


def ml_model(x: np.ndarray, **attrs: Any) -> onnx.ModelProto:
    attrs = {k: numpy_helper.from_array(v, k) if isinstance(v, np.ndarray) else v for k, v in attrs.items()}
    g = helper.make_graph([helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", **attrs)], "g",
                          [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
                          [helper.make_empty_tensor_value_info("y")])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                              helper.make_opsetid("ai.onnx.ml", 4)])


KEYS = S("a", "é", "", "日本")


@pytest.mark.parametrize(("x", "attrs"), [
    (S("a", "z", "", "日本", "é"), {"keys_strings": list(KEYS), "values_int64s": [1, 2, 3, 4]}),
    (np.array([["é", "q"], ["", "a"]], dtype=object),
     {"keys_strings": list(KEYS), "values_floats": [0.5, 1.5, 2.5, 3.5], "default_float": -2.0}),
    (S("a", "z"), {"keys_strings": list(KEYS), "values_strings": ["A", "É", "∅", "にほん"]}),
    (S("a", "z"), {"keys_strings": list(KEYS), "values_strings": list("wxyz"), "default_string": "?"}),
    (np.array([3, 7, 9], np.int64), {"keys_int64s": [7, 3], "values_strings": ["seven", "three"]}),
    (np.array([0.5, 2.0], np.float32), {"keys_floats": [0.5], "values_strings": ["half"], "default_string": ""}),
    (S("a", "z", "日本"), {"keys_tensor": KEYS, "values_tensor": np.array([1, 2, 3, 4], np.int64),
                          "default_tensor": np.array([-7], np.int64)}),
    (S("é", "z"), {"keys_tensor": KEYS, "values_tensor": S("1", "2", "3", "4"), "default_tensor": S("none")}),
    (np.zeros((0, 3), object), {"keys_strings": ["a"], "values_int64s": [1]}),
])
def test_label_encoder_with_strings_matches_onnxruntime(x: np.ndarray, attrs: dict[str, Any]) -> None:
    check(ml_model(x, **attrs), {"x": x})


def test_label_encoder_string_errors() -> None:
    def infer(t: str, **attrs: Any) -> list[str]:
        from metadef.ops import get_op, infer_types

        return [str(o) for o in infer_types(get_op("LabelEncoder", "ai.onnx.ml"), "/le", [parse_type(t)], attrs)]

    assert infer("str[n]", keys_strings=("a",), values_strings=("b",)) == ["str[n]"]
    assert infer("i64[n]", keys_int64s=(1,), values_tensor=S("b")) == ["str[n]"]
    with pytest.raises(DTypeError, match="input X is float32 but the keys are string"):
        infer("f32[n]", keys_strings=("a",), values_int64s=(1,))
    with pytest.raises(ShapeError, match="give the keys in one attribute, got keys_strings, keys_tensor"):
        infer("str[n]", keys_strings=("a",), keys_tensor=S("a"), values_int64s=(1,))
    with pytest.raises(DTypeError, match="default_tensor is object but the values are int64"):
        infer("str[n]", keys_strings=("a",), values_int64s=(1,), default_tensor=S("x"))


# -------------------------------------------------------------- sessions, x86, optimize, save


def test_session_checks_string_inputs() -> None:
    sess = md.compile(md.import_onnx(model("Equal", {"a": S("a", "b"), "b": S("b", "c")})))
    assert sess.run({"a": np.array(["x", "é"]), "b": [b"x", "é".encode()]})["out0"].tolist() == [True, True]
    with pytest.raises(InputError, match="input 'a' has dtype float32, expected string"):
        sess.run({"a": np.zeros(1, np.float32), "b": S("x")})
    with pytest.raises(InputError, match="input 'a' must hold strings, but element 1 is int 3"):
        sess.run({"a": np.array(["x", 3], object), "b": S("x")})
    floats = md.compile(md.import_onnx(model("Relu", {"x": np.zeros(2, np.float32)})))
    with pytest.raises(InputError, match=r"input 'x' has dtype <U1 \(strings or Python objects\), but it is float32"):
        floats.run({"x": np.array(["1", "2"])})


MIXED = '''graph g(%x: str[n], %f: f32[n]) -> (%y, %t, %z) {
  %s: str[n] = StringConcat(%x, %x) @cat
  %t: str[n] = StringNormalizer(%s) {case_change_action="UPPER"} @norm
  %e: b8[n] = Equal(%s, %x) @eq
  %y: b8[n] = Not(%e) @not
  %r: f32[n] = Relu(%f) @relu
  %z: f32[n] = Neg(%r) @neg
  return %y, %t, %z }'''
FEEDS = {"x": S("a", "", "é"), "f": np.array([-1.0, 2.0, 3.0], np.float32)}


@pytest.mark.jit
@pytest.mark.parametrize("level", [None, "aggressive"])
def test_x86_runs_string_nodes_on_their_reference_with_the_reason(level: str | None) -> None:
    g = parse_graph(MIXED)
    if level is not None:  # string nodes stay out of fused groups; the numeric ones fuse
        g = md.optimize(g, level=level)
        verify(g, types=True)
        assert sorted(n.op for n in g.nodes) == ["Equal", "Fused", "Not", "StringConcat", "StringNormalizer"]
    want = md.compile(g, target="reference").run(FEEDS)
    sess = md.compile(g, target="x86", cache=False)
    for _ in range(2):  # the prepared program is reused: its string intermediates too
        got = sess.run(FEEDS)
        assert [got[k].tolist() for k in want] == [want[k].tolist() for k in want]
    assert got["t"].tolist() == ["AA", "", "ÉÉ"]
    plan = {p.node: p for p in sess.executable.plan}
    for name in ("cat", "norm", "eq"):
        assert plan[name].fallback and plan[name].kind == "reference"
        assert "string tensors" in plan[name].reason and "x86 kernels take numbers" in plan[name].reason
    assert not any(p.fallback for p in plan.values() if p.node in ("relu", "neg", "relu/fused"))
    assert "string tensors" in sess.executable.summary()


@pytest.mark.jit
def test_x86_runs_the_split_step_by_step() -> None:
    m = model("StringSplit", {"x": SENTENCES}, n_out=2, delimiter=",")
    want = run_onnxruntime(m, {"x": SENTENCES})
    got = md.compile(md.import_onnx(m), target="x86", cache=False).run({"x": SENTENCES})
    assert got["out0"].tolist() == want["out0"].tolist() and (got["out1"] == want["out1"]).all()


def test_constant_folding_folds_string_ops() -> None:
    b = GraphBuilder("fold")
    x = b.input("x", parse_type("str[2]"))
    c, = b.node("StringConcat", [b.const("a", S("x", "y")), b.const("b", S("!"))])
    b.output(*b.node("Equal", [x, c]))
    g = md.optimize(b.build(), level="safe")
    assert [n.op for n in g.nodes] == ["Equal"] and g.constants[0].const.tolist() == ["x!", "y!"]
    assert md.compile(g).run({"x": S("x!", "y")})["Equal_1_out"].tolist() == [True, False]


def test_save_keeps_string_graphs_and_refuses_string_constants(tmp_path: Any) -> None:
    g = parse_graph('''graph g(%x: str[n]) -> (%y, %z) {
      %y: str[n] = StringNormalizer(%x) {case_change_action="LOWER", stopwords=["B"]} @norm
      %z: b8[n] = RegexFullMatch(%x) {pattern="[a-z]"} @re
      return %y, %z }''')
    loaded = md.load(md.save(g, tmp_path / "s.mdef"))
    got = loaded.compile(target="reference").run({"x": S("A", "b", "É")})
    assert got["y"].tolist() == ["a", "é"] and got["z"].tolist() == [False, True, False]
    b = GraphBuilder("c")
    x = b.input("x", parse_type("str[n]"))
    b.output(*b.node("StringConcat", [x, b.const("suffix", S("!"))]))
    with pytest.raises(CompatError, match=r"constant 'suffix' is a string tensor \[1\], which format 1.0 cannot"):
        md.save(b.build(), tmp_path / "c.mdef")
    b = GraphBuilder("le")
    x = b.input("x", parse_type("str[n]"))
    b.output(*b.node("LabelEncoder", [x], {"keys_tensor": S("a"), "values_int64s": (1,)}, domain="ai.onnx.ml"))
    with pytest.raises(CompatError, match="attribute 'keys_tensor': a string tensor cannot be stored"):
        md.save(b.build(), tmp_path / "le.mdef")


def test_the_oracle_compares_string_outputs() -> None:
    x = S("a", "é")
    assert compare_with_onnxruntime(model("StringConcat", {"x": x, "y": x}), {"x": x, "y": x}).ok


def test_cache_keys_hash_the_text_of_string_tensors() -> None:
    assert array_hash(S("ab", "c")) == array_hash(S("".join("ab"), "c")) != array_hash(S("ab", "d"))
