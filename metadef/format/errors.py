"""The typed errors of the .mdef reader and writer: each names what, where (offset) and what to do.

Every one is a :class:`metadef.core.errors.FormatError`, so ``except FormatError`` catches
them all.

Example:
    >>> issubclass(ChecksumError, FormatError)
    True
"""

from __future__ import annotations

from metadef.core.errors import FormatError


class NotAnMdefFileError(FormatError):
    """The file has neither the leading nor the trailing magic ``MDEF``: it is some other file."""


class BadMagicError(FormatError):
    """One of the magics (or the marker after the leading one) is wrong: a damaged .mdef file."""


class TruncatedFileError(FormatError):
    """The file is shorter than its header or structure says: it was cut off."""


class VersionError(FormatError):
    """The file's format version is newer than this reader (or older than any that exists)."""


class ChecksumError(FormatError):
    """A stored xxh3-64 checksum does not match the bytes: the file is damaged."""


class CorruptFileError(FormatError):
    """An offset, length, count or field is out of bounds or malformed."""


class UnknownSectionError(FormatError):
    """The file has a REQUIRED section this reader does not know."""


class CompatError(FormatError):
    """The graph uses format features the requested (older) version cannot hold."""


class ClosedFileError(FormatError, ValueError):
    """A tensor, section or graph of an .mdef file was asked for after the file was closed."""


class LoaderError(FormatError):
    """The background loader failed for a reason that is not the file's (an I/O error, a bug);
    the message names the tensor and the file, and the cause is chained."""


__all__ = [
    "BadMagicError", "ChecksumError", "ClosedFileError", "CompatError", "CorruptFileError", "LoaderError",
    "NotAnMdefFileError",
    "TruncatedFileError", "UnknownSectionError", "VersionError",
]
