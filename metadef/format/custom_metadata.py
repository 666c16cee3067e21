"""Custom metadata classes that round-trip through the auxiliary layer of a .mdef file.

A class derives from :class:`BaseMetadata` (it becomes a dataclass: declare annotated fields)
and is registered under a versioned namespace. Saving writes ``to_dict()`` (JSON values only)
under ``auxiliary.namespaces[name]``; loading gives back an instance for a registered
namespace, and the plain dict for any other (a file from another application still loads).

Example:
    >>> class Labels(BaseMetadata):
    ...     names: list
    ...     source: str = "zoo"
    >>> register_metadata_type("doc_example/v1", Labels, replace=True)
    >>> encoded = encode_namespaces({"doc_example/v1": Labels(["cat", "dog"])})
    >>> encoded
    {'doc_example/v1': {'names': ['cat', 'dog'], 'source': 'zoo'}}
    >>> decode_namespace("doc_example/v1", encoded["doc_example/v1"])
    Labels(names=['cat', 'dog'], source='zoo')
    >>> decode_namespace("someone_else/v3", {"x": 1})
    {'x': 1}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from metadef.core.errors import FormatError

M = TypeVar("M", bound="BaseMetadata")


class MetadataError(FormatError):
    """A custom metadata value is not JSON-able, or a stored namespace does not fit its class."""


class BaseMetadata:
    """Base of custom metadata classes: subclasses become dataclasses of JSON-able fields.

    Do not add ``@dataclass`` yourself; declare fields as annotations (with defaults, or
    ``dataclasses.field(default_factory=list)``). ``to_dict`` checks that every value is JSON
    (str, int, float, bool, None, lists and dicts of those); ``from_dict`` refuses missing
    required fields and unknown keys, naming them.
    """

    __metadata_fields__: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__dataclass_fields__" not in cls.__dict__:
            dataclasses.dataclass(cls)
            for f in dataclasses.fields(cls):  # type: ignore[arg-type]
                if f.default_factory is not dataclasses.MISSING:  # so an extra @dataclass sees them again
                    setattr(cls, f.name, f)
        cls.__metadata_fields__ = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dict (MetadataError names a field that is not JSON)."""
        out = {}
        for name in self.__metadata_fields__:
            value = getattr(self, name)
            try:
                out[name] = json.loads(json.dumps(value, allow_nan=False))
            except (TypeError, ValueError) as e:
                raise MetadataError(f"{type(self).__name__}.{name} = {value!r} is not JSON-able ({e}); custom "
                                    "metadata holds str, int, float, bool, None, lists and dicts") from None
        return out

    @classmethod
    def from_dict(cls: type[M], data: Mapping[str, Any]) -> M:
        """An instance from ``to_dict``'s output; MetadataError names unknown or missing keys."""
        if not isinstance(data, Mapping):
            raise MetadataError(f"{cls.__name__}.from_dict expects a dict, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__metadata_fields__))
        if unknown:
            raise MetadataError(f"{cls.__name__} has no field(s) {', '.join(map(repr, unknown))}; its fields are "
                                f"{', '.join(cls.__metadata_fields__)} (a newer version of the namespace?)")
        required = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise MetadataError(f"{cls.__name__} needs field(s) {', '.join(map(repr, missing))}")
        return cls(**data)


_registry: dict[str, type[BaseMetadata]] = {}


def register_metadata_type(namespace: str, cls: type[BaseMetadata], *, replace: bool = False) -> None:
    """Register ``cls`` for ``namespace`` (e.g. ``"my_app/v1"``: put a version in the name).

    Registering a second class for a namespace is an error unless ``replace=True``.
    """
    if not isinstance(namespace, str) or not namespace:
        raise MetadataError(f"a namespace is a non-empty string such as 'my_app/v1', not {namespace!r}")
    if not (isinstance(cls, type) and issubclass(cls, BaseMetadata)):
        raise MetadataError(f"register_metadata_type({namespace!r}, {cls!r}): the class must derive from "
                            "metadef.BaseMetadata")
    old = _registry.get(namespace)
    if old is not None and old is not cls and not replace:
        raise MetadataError(f"namespace {namespace!r} is already registered to {old.__qualname__}; pass "
                            "replace=True to replace it")
    _registry[namespace] = cls


def metadata_type(namespace: str) -> type[BaseMetadata] | None:
    """The class registered for ``namespace``, or None."""
    return _registry.get(namespace)


def encode_namespaces(namespaces: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: BaseMetadata | dict}`` -> ``{name: dict}``, as the writer stores them."""
    out: dict[str, Any] = {}
    for name, body in namespaces.items():
        registered = _registry.get(name)
        if isinstance(body, BaseMetadata):
            if registered is not None and not isinstance(body, registered):
                raise MetadataError(f"namespace {name!r} is registered to {registered.__qualname__}, but a "
                                    f"{type(body).__qualname__} was given for it")
            out[name] = body.to_dict()
        else:
            out[name] = body
    return out


def encode_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``save``'s ``metadata=`` with its custom namespaces encoded (other layers unchanged)."""
    if metadata is None or "namespaces" not in metadata or not isinstance(metadata["namespaces"], Mapping):
        return None if metadata is None else dict(metadata)
    return {**metadata, "namespaces": encode_namespaces(metadata["namespaces"])}


def decode_namespace(namespace: str, body: Any) -> Any:
    """An instance of the class registered for ``namespace``, else ``body`` as stored."""
    cls = _registry.get(namespace)
    if cls is None or not isinstance(body, Mapping):
        return body
    try:
        return cls.from_dict(body)
    except MetadataError as e:
        raise MetadataError(f"namespace {namespace!r}: {e}") from None
    except TypeError as e:  # a __post_init__ or a field type the class refuses
        raise MetadataError(f"namespace {namespace!r}: {cls.__qualname__}: {e}") from None


def read_namespace(namespaces: Mapping[str, Any], namespace: str) -> Any:
    """``namespaces[namespace]`` decoded; KeyError naming the namespaces there are."""
    if namespace not in namespaces:
        raise KeyError(f"no metadata namespace {namespace!r}; the file has "
                       f"{', '.join(map(repr, sorted(namespaces))) or 'none'}")
    return decode_namespace(namespace, namespaces[namespace])


__all__ = [
    "BaseMetadata", "MetadataError", "decode_namespace", "encode_metadata", "encode_namespaces", "metadata_type",
    "read_namespace", "register_metadata_type",
]
