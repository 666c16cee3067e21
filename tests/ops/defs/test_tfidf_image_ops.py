"""``TfIdfVectorizer`` against ONNX Runtime (random pools, skips, modes, weights, batches,
int32/int64/string tokens) and ``ImageDecoder`` against onnx's reference evaluator and Pillow
(images the node tests do not use: other sizes, palettes, alpha, gray sources, PNM), with the
errors each gives; both compile for x86 (their reference kernels, with the reason recorded)."""

from __future__ import annotations

import io

import numpy as np
import onnx.reference
import pytest
from PIL import Image

import metadef as md
from metadef.core.errors import DTypeError, ShapeError, UnsupportedOpError
from metadef.ops.defs.image import available_formats, decode_image
from metadef.testing.onnx_cases import assert_same, infer_text, one_node_model, run_both, run_metadef

# ------------------------------------------------------------------------ TfIdfVectorizer


def _random_case(rng: np.random.Generator) -> tuple[dict, np.ndarray]:
    """Attributes of a random valid TfIdfVectorizer and an input for it."""
    vocab = int(rng.integers(2, 7))
    max_n = int(rng.integers(1, 4))
    pool, starts, seen = [], [], set()
    for n in range(1, 4):
        starts.append(len(pool))
        for _ in range(int(rng.integers(0, 4))):
            gram = tuple(int(v) for v in rng.integers(0, vocab, n))
            if gram not in seen:
                seen.add(gram)
                pool.extend(gram)
    count = max(len(seen), 1)
    if not seen:  # one unigram (ONNX Runtime wants an ngram_counts entry per length up to the max)
        pool, starts = [0], [0, 1, 1]
    attrs = {"mode": str(rng.choice(["TF", "IDF", "TFIDF"])), "min_gram_length": int(rng.integers(1, max_n + 1)),
             "max_gram_length": max_n, "max_skip_count": int(rng.integers(0, 4)), "ngram_counts": starts,
             "ngram_indexes": rng.permutation(count + 2)[:count].tolist(), "pool_int64s": pool}
    if rng.random() < 0.5:
        attrs["weights"] = rng.random(count).round(3).tolist()
    shape = (int(rng.integers(1, 4)), int(rng.integers(0, 14))) if rng.random() < 0.5 else (int(rng.integers(1, 14)),)
    x = rng.integers(0, vocab + 1, shape).astype(np.int32 if rng.random() < 0.5 else np.int64)
    return attrs, x


def test_tfidf_matches_onnxruntime_on_random_pools() -> None:
    rng = np.random.default_rng(2024)
    for _ in range(60):
        attrs, x = _random_case(rng)
        got, want = run_both(one_node_model("TfIdfVectorizer", {"x": x}, opset=9, **attrs), {"x": x})
        assert_same(got, want, rtol=1e-6, atol=0)


def test_tfidf_string_tokens_match_onnxruntime() -> None:
    rng = np.random.default_rng(7)
    for _ in range(15):
        attrs, x = _random_case(rng)
        attrs["pool_strings"] = [f"tok{v}" for v in attrs.pop("pool_int64s")]
        words = np.array([f"tok{v}" for v in x.reshape(-1)], dtype=object).reshape(x.shape)
        got, want = run_both(one_node_model("TfIdfVectorizer", {"x": words}, opset=9, **attrs), {"x": words})
        assert_same(got, want, rtol=1e-6, atol=0)


def test_tfidf_weights_belong_to_ngrams_not_columns() -> None:
    # pool [1, 2, 3] to columns [2, 0, 1]: the weight of n-gram i is weights[i] (ONNX Runtime and the
    # spec), whatever column it lands in
    x = np.array([[1, 2, 1, 3, 3, 3]], np.int64)
    base = {"min_gram_length": 1, "max_gram_length": 1, "max_skip_count": 0, "ngram_counts": [0],
            "ngram_indexes": [2, 0, 1], "pool_int64s": [1, 2, 3], "weights": [10.0, 20.0, 30.0]}
    for mode, want in (("TF", [1, 3, 2]), ("IDF", [20, 30, 10]), ("TFIDF", [20, 90, 20])):
        (y,) = run_metadef(one_node_model("TfIdfVectorizer", {"x": x}, opset=9, mode=mode, **base), {"x": x})
        np.testing.assert_array_equal(y, np.array([want], np.float32))


def test_tfidf_shapes_and_errors() -> None:
    attrs = {"mode": "TF", "min_gram_length": 1, "max_gram_length": 2, "max_skip_count": 1,
             "ngram_counts": (0, 2), "ngram_indexes": (0, 4, 1), "pool_int64s": (3, 4, 3, 4)}
    assert infer_text("TfIdfVectorizer", ["i64[c]"], attrs) == ["f32[5]"]
    assert infer_text("TfIdfVectorizer", ["i32[n,c]"], attrs) == ["f32[n,5]"]
    with pytest.raises(ShapeError, match=r"TfIdfVectorizer.*mode='BM25' must be one of TF, IDF, TFIDF"):
        infer_text("TfIdfVectorizer", ["i64[4]"], {**attrs, "mode": "BM25"})
    with pytest.raises(ShapeError, match="the pool lists a 1-gram twice"):
        infer_text("TfIdfVectorizer", ["i64[4]"], {**attrs, "pool_int64s": (3, 3, 3, 4)})
    with pytest.raises(ShapeError, match="ngram_indexes has 2 entries but the pool lists 3 n-grams"):
        infer_text("TfIdfVectorizer", ["i64[4]"], {**attrs, "ngram_indexes": (0, 1)})
    with pytest.raises(ShapeError, match="exactly one of pool_int64s and pool_strings"):
        infer_text("TfIdfVectorizer", ["i64[4]"], {**attrs, "pool_strings": ("a",)})
    with pytest.raises(ShapeError, match=r"X must be \[C\] or \[N, C\], got rank 3"):
        infer_text("TfIdfVectorizer", ["i64[2,2,2]"], attrs)
    with pytest.raises(DTypeError, match="input X is string but the pool is pool_int64s"):
        infer_text("TfIdfVectorizer", ["str[4]"], attrs)


def test_tfidf_empty_rows_give_zeros_and_x86_falls_back_with_a_reason() -> None:
    x = np.zeros((3, 0), np.int64)
    model = one_node_model("TfIdfVectorizer", {"x": x}, opset=9, mode="TF", min_gram_length=1, max_gram_length=1,
                           max_skip_count=0, ngram_counts=[0], ngram_indexes=[0, 1], pool_int64s=[5, 6])
    (y,) = run_metadef(model, {"x": x})
    np.testing.assert_array_equal(y, np.zeros((3, 2), np.float32))
    sess = md.compile(md.import_onnx(model), target="x86")
    assert [p.op for p in sess.executable.fallbacks] == ["TfIdfVectorizer"]
    np.testing.assert_array_equal(sess.run({"x": x})["out0"], y)


# --------------------------------------------------------------------------- ImageDecoder


def _encoded(image: Image.Image, fmt: str, **options) -> np.ndarray:
    stream = io.BytesIO()
    image.save(stream, format=fmt, **options)
    return np.frombuffer(stream.getvalue(), np.uint8)


def _images() -> list[tuple[str, Image.Image, str]]:
    rng = np.random.default_rng(5)
    rgb = Image.fromarray(rng.integers(0, 256, (13, 21, 3)).astype(np.uint8))
    gray = Image.fromarray(rng.integers(0, 256, (9, 17)).astype(np.uint8))
    rgba = Image.fromarray(rng.integers(0, 256, (6, 11, 4)).astype(np.uint8))
    return [("odd-size RGB PNG", rgb, "PNG"), ("gray PNG", gray, "PNG"), ("RGBA PNG", rgba, "PNG"),
            ("palette PNG", rgb.quantize(16), "PNG"), ("gray JPEG", gray, "JPEG"), ("RGB JPEG", rgb, "JPEG"),
            ("RGB BMP", rgb, "BMP"), ("PGM", gray, "PPM"), ("PPM", rgb, "PPM"), ("RGB TIFF", rgb, "TIFF"),
            ("lossless WebP", rgb, "WEBP"), ("JPEG 2000", rgb, "JPEG2000")]


@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_image_decoder_matches_pillow_on_other_images(pixel_format: str) -> None:
    for what, image, fmt in _images():
        if fmt not in available_formats():
            continue
        data = _encoded(image, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
        (got,) = run_metadef(one_node_model("ImageDecoder", {"data": data}, opset=20, pixel_format=pixel_format),
                             {"data": data})
        decoded = Image.open(io.BytesIO(data.tobytes()))
        want = np.asarray(decoded.convert("L" if pixel_format == "Grayscale" else "RGB"))
        want = want[:, :, None] if pixel_format == "Grayscale" else want[:, :, ::-1] if pixel_format == "BGR" else want
        channels = 1 if pixel_format == "Grayscale" else 3
        assert got.dtype == np.uint8 and got.shape == (image.height, image.width, channels), what
        np.testing.assert_array_equal(got, want, err_msg=what)


def test_image_decoder_matches_onnx_reference_on_rgb_sources() -> None:
    rng = np.random.default_rng(11)
    image = Image.fromarray(rng.integers(0, 256, (24, 40, 3)).astype(np.uint8))
    for fmt in ("PNG", "JPEG", "BMP", "TIFF"):
        data = _encoded(image, fmt)
        for pixel_format in ("RGB", "BGR", "Grayscale"):
            model = one_node_model("ImageDecoder", {"data": data}, opset=20, pixel_format=pixel_format)
            (want,) = onnx.reference.ReferenceEvaluator(model).run(None, {"data": data})
            assert_same(run_metadef(model, {"data": data}), [want])


def test_image_decoder_broken_streams_give_empty_images_and_other_formats_a_clear_error() -> None:
    image = Image.fromarray(np.zeros((4, 4, 3), np.uint8))
    png = _encoded(image, "PNG")
    assert decode_image(png[:20], "RGB").shape == (0, 0, 3)           # cut short
    assert decode_image(np.arange(64, dtype=np.uint8), "Grayscale").shape == (0, 0, 1)  # not an image
    with pytest.raises(UnsupportedOpError, match="ImageDecoder: the stream is a GIF image, which is not one of "
                                                 "ONNX's image formats"):
        decode_image(_encoded(image, "GIF"), "RGB")
    with pytest.raises(ShapeError, match="pixel_format='RGBA' must be one of RGB, BGR, Grayscale"):
        infer_text("ImageDecoder", ["u8[100]"], {"pixel_format": "RGBA"})
    assert infer_text("ImageDecoder", ["u8[n]"], {"pixel_format": "Grayscale"}) == ["u8[height_0,width_1,1]"]


def test_image_decoder_compiles_for_x86() -> None:
    data = _encoded(Image.fromarray(np.full((3, 5, 3), 200, np.uint8)), "PNG")
    model = one_node_model("ImageDecoder", {"data": data}, opset=20, pixel_format="BGR")
    sess = md.compile(md.import_onnx(model), target="x86")
    assert [p.op for p in sess.executable.fallbacks] == ["ImageDecoder"]
    np.testing.assert_array_equal(sess.run({"data": data})["out0"], np.full((3, 5, 3), 200, np.uint8))
