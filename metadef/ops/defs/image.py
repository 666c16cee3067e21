"""``ImageDecoder``: an encoded image (a 1-D uint8 stream) decoded to ``uint8 [H, W, C]``.

Decoding is Pillow's, as in onnx's reference implementation. ``pixel_format`` is ``RGB`` or
``BGR`` (``C = 3``: palette, grayscale, CMYK and alpha images are converted to RGB, alpha
dropped) or ``Grayscale`` (``C = 1``: Pillow's ITU-R 601-2 luma, ``L = (299 R + 587 G +
114 B) / 1000``). The formats are ONNX's: BMP, JPEG, JPEG 2000, TIFF, PNG, WebP and the
portable any-maps (PBM, PGM, PPM); a multi-frame TIFF or WebP gives its first frame.

- A stream Pillow recognizes as another format (GIF, ICO, ...) fails with
  ``UnsupportedOpError`` naming it, and so does one of ONNX's formats whose codec this Pillow
  lacks (:func:`available_formats` says which it has).
- A stream no decoder recognizes, or one that breaks off, gives an empty image ``[0, 0, C]``,
  as the spec asks ("if it can't decode for any reason ... an empty matrix").

JPEG decoders differ in their last bit (chroma upsampling, IDCT rounding): the spec asks for
libjpeg-turbo's "fancy" upsampling, which is what Pillow links.

Example:
    >>> import io
    >>> from PIL import Image
    >>> pixels = np.array([[[255, 0, 0], [0, 0, 255]]], np.uint8)
    >>> stream = io.BytesIO()
    >>> Image.fromarray(pixels).save(stream, format="PNG")
    >>> data = np.frombuffer(stream.getvalue(), np.uint8)
    >>> decode_image(data, "BGR")[0].tolist()
    [[0, 0, 255], [255, 0, 0]]
    >>> decode_image(data, "Grayscale").shape, decode_image(data[:10], "RGB").shape
    ((1, 2, 1), (0, 0, 3))
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np
import PIL.Image
from PIL import features

from metadef.core.dtypes import UINT8
from metadef.core.errors import UnsupportedOpError
from metadef.ops.infer import InferContext
from metadef.ops.interface import string
from metadef.ops.metaop import metaop
from metadef.ops.strategy import Role
from metadef.shape import TensorType

PIXEL_FORMATS = {"RGB": 3, "BGR": 3, "Grayscale": 1}
"""The values ``pixel_format`` may take, with the channels each gives."""

# ONNX's formats by Pillow's name for them, with the Pillow feature that decodes each (None:
# Pillow's own Python code does).
_FORMATS: dict[str, str | None] = {
    "BMP": None, "DIB": None, "JPEG": "jpg", "MPO": "jpg", "JPEG2000": "jpg_2000", "TIFF": None,
    "PNG": "zlib", "WEBP": "webp", "PPM": None,
}
_NAMES = "BMP, JPEG, JPEG 2000, TIFF, PNG, WebP and PNM (PBM, PGM, PPM)"


def available_formats() -> list[str]:
    """ONNX's image formats that this Pillow decodes, by Pillow's names.

    Example:
        >>> {"BMP", "PNG"} <= set(available_formats())
        True
    """
    return [name for name, feature in _FORMATS.items() if feature is None or features.check(feature)]


def _unsupported(fmt: str, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"ImageDecoder: the stream is a {fmt} image, {why}; ImageDecoder decodes "
                              f"{_NAMES} (this Pillow: {', '.join(available_formats())}); convert the "
                              "image before the model")


def decode_image(data: np.ndarray, pixel_format: str = "RGB") -> np.ndarray:
    """The image in ``data`` (the encoded bytes, uint8) as ``uint8 [H, W, C]`` (see the module doc).

    Example:
        >>> decode_image(np.zeros(0, np.uint8), "Grayscale").shape
        (0, 0, 1)
    """
    channels = PIXEL_FORMATS[pixel_format]
    empty = np.zeros((0, 0, channels), np.uint8)
    try:
        image = PIL.Image.open(io.BytesIO(np.ascontiguousarray(data, np.uint8).tobytes()))
    except (PIL.UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
        return empty
    fmt = image.format or "unknown"
    if fmt not in _FORMATS:
        raise _unsupported(fmt, "which is not one of ONNX's image formats")
    if fmt not in available_formats():
        raise _unsupported(fmt, "but this Pillow was built without its codec")
    try:
        image.load()
        converted = image.convert("L" if pixel_format == "Grayscale" else "RGB")
    except OSError as e:
        if "not available" in str(e):  # Pillow: "decoder jpeg2k not available"
            raise _unsupported(fmt, f"but this Pillow cannot decode it ({e})") from e
        return empty
    except (SyntaxError, ValueError, EOFError):
        return empty
    pixels = np.asarray(converted, np.uint8)
    if pixel_format == "Grayscale":
        return pixels[:, :, np.newaxis]
    return np.ascontiguousarray(pixels[:, :, ::-1]) if pixel_format == "BGR" else pixels


def _decoder_rule(ctx: InferContext) -> list[Any]:
    fmt = ctx.attrs["pixel_format"]
    if fmt not in PIXEL_FORMATS:
        ctx.fail(f"pixel_format={fmt!r} must be one of {', '.join(PIXEL_FORMATS)}")
    if ctx.rank(0) not in (None, 1):
        ctx.fail(f"encoded_stream must be 1-D (the bytes of one image), got rank {ctx.rank(0)}")
    return [TensorType(UINT8, (ctx.fresh("height"), ctx.fresh("width"), PIXEL_FORMATS[fmt]))]


def _decoder_reference(inputs: list[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    return decode_image(np.asarray(inputs[0]), attrs["pixel_format"])


ImageDecoder = metaop(
    "ImageDecoder", inputs=("encoded_stream: T1",), outputs=("image: T2",),
    attrs={"pixel_format": string("RGB")}, types="T1 in {uint8}; T2 in {uint8}",
    rule=_decoder_rule, reference=_decoder_reference, role=Role.OPAQUE, since=(20,),
    doc="Decode an encoded image (BMP, JPEG, JPEG 2000, TIFF, PNG, WebP, PNM) to uint8 [H, W, C].",
)

__all__ = ["ImageDecoder", "PIXEL_FORMATS", "available_formats", "decode_image"]
