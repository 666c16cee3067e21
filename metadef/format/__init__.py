"""The .mdef file format (L4): one file, mapped and read lazily. The spec is docs/format.md.

Example:
    >>> import tempfile, pathlib
    >>> from metadef.ir import parse_graph, print_graph
    >>> g = parse_graph("graph g(%x: f32[b]) -> (%y) { %y: f32[b] = Relu(%x) return %y }")
    >>> path = save_graph(g, pathlib.Path(tempfile.mkdtemp()) / "g.mdef")
    >>> print_graph(open_mdef(path).graph()) == print_graph(g)
    True
"""

from metadef.format.compat import FEATURES, Feature, extra_feature, features_used
from metadef.format.errors import (
    BadMagicError,
    ChecksumError,
    ClosedFileError,
    CompatError,
    CorruptFileError,
    LoaderError,
    NotAnMdefFileError,
    TruncatedFileError,
    UnknownSectionError,
    VersionError,
)
from metadef.format.layout import FORMAT_VERSION
from metadef.format.loader import DynamicLoader, need_order
from metadef.format.reader import MdefFile, TensorInfo, VerifyReport, open_mdef
from metadef.format.storage import release_mapped
from metadef.format.writer import save_graph, write_compat

__all__ = [
    "FEATURES", "FORMAT_VERSION", "BadMagicError", "ChecksumError", "ClosedFileError", "CompatError",
    "CorruptFileError", "DynamicLoader", "Feature", "LoaderError", "MdefFile", "NotAnMdefFileError", "TensorInfo",
    "TruncatedFileError", "UnknownSectionError", "VerifyReport", "VersionError", "extra_feature", "features_used",
    "need_order", "open_mdef", "release_mapped", "save_graph", "write_compat",
]
