"""A small run-time linker for the object code LLVM emits: ELF64 x86-64 relocatable objects
into executable memory, without LLVM.

The JIT (:mod:`.jit`) and a compile-cache hit both end here: the code that runs is the very
object code the cache stores. Linking needs no LLVM, so a process that finds every kernel in
the cache never loads ``libllvmlite`` (on the hosts measured, 45-95 MB of RSS and ~0.1 s of
start-up).

What it does, as a static linker would: it lays the object's allocated sections out in one
anonymous mapping (code, then read-only data, then writable data, each on pages of its own),
resolves symbols (the object's own, then the process's libraries: libc, libm, libgcc, then
objects linked before), applies the relocations, and finally makes the code pages
read + execute and the constants read-only. A call to a library function goes through a stub
in the mapping (an absolute jump, as a PLT entry would: the library may lie farther than 2 GiB
away), a GOT load through a slot in the mapping. Unwind tables are not
registered (the generated code raises no exceptions). Anything it does not handle (another
machine, a relocation type it does not know, a symbol no library has) raises
:class:`~metadef.core.errors.BackendError` naming it.

Example:
    >>> import ctypes
    >>> from metadef.codegen.jit import compile_ir, object_code
    >>> ir = 'define i64 @twice(i64 %x) {\\n %y = mul i64 %x, 2\\n ret i64 %y\\n}'
    >>> _ = compile_ir(ir, ["twice"], "doc_twice")
    >>> addr = load_object(object_code("doc_twice"), ["twice"])["twice"]
    >>> ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(addr)(21)
    42
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import struct
import threading
from dataclasses import dataclass
from functools import cache

from metadef.core.errors import BackendError

_LOCK = threading.RLock()
_COUNT = [0]
_GLOBALS: dict[str, int] = {}

PAGE = mmap.PAGESIZE
MAX_IMAGE = 1 << 30
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_X86_64_UNWIND = 2, 4, 8, 0x70000001
SHN_UNDEF, SHN_ABS, SHN_COMMON = 0, 0xFFF1, 0xFFF2
STB_LOCAL = 0

RELOCATIONS = {1: "R_X86_64_64", 2: "R_X86_64_PC32", 4: "R_X86_64_PLT32", 9: "R_X86_64_GOTPCREL",
               10: "R_X86_64_32", 11: "R_X86_64_32S", 24: "R_X86_64_PC64", 25: "R_X86_64_GOTOFF64",
               26: "R_X86_64_GOTPC32", 27: "R_X86_64_GOT64", 28: "R_X86_64_GOTPCREL64", 29: "R_X86_64_GOTPC64",
               31: "R_X86_64_PLTOFF64", 41: "R_X86_64_GOTPCRELX", 42: "R_X86_64_REX_GOTPCRELX"}
"""The relocation types this linker applies (all LLVM emits for our kernels in the large and
small code models, position-dependent or not)."""

_GOT_SLOT_TYPES = frozenset({9, 27, 28, 41, 42})  # those that need the symbol's GOT slot filled
_WIDE = frozenset({1, 24, 25, 27, 28, 29, 31})  # those that patch 64 bits (the rest patch 32)
GOT_SYMBOL = "_GLOBAL_OFFSET_TABLE_"
_STUB = b"\xff\x25\x00\x00\x00\x00"  # jmp *0(%rip), then the 8-byte target: 14 bytes, padded to 16


@dataclass(frozen=True)
class Section:
    """One section header of an object: name, type, flags, where its bytes are, and links."""

    name: str
    kind: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    align: int

    @property
    def allocated(self) -> bool:
        """Whether the section takes memory at run time (unwind tables excepted)."""
        return bool(self.flags & SHF_ALLOC) and self.size > 0 and self.kind != SHT_X86_64_UNWIND \
            and self.name != ".eh_frame"


@dataclass(frozen=True)
class Symbol:
    """One symbol-table entry: name, binding, section index and value."""

    name: str
    binding: int
    section: int
    value: int
    size: int


def _fail(name: str, why: str) -> BackendError:
    return BackendError(f"cannot link object code {name!r}: {why}")


def _string(data: bytes, at: int) -> str:
    end = data.find(b"\0", at)
    return data[at:end if end >= 0 else len(data)].decode("utf-8", "replace")


def read_sections(data: bytes, name: str = "<object>") -> list[Section]:
    """The section headers of an ELF64 little-endian x86-64 relocatable object.

    Example:
        >>> try:
        ...     read_sections(b"not an object")
        ... except BackendError as e:
        ...     print(str(e)[:70])
        cannot link object code '<object>': not an ELF64 x86-64 relocatable ob
    """
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1 \
            or struct.unpack_from("<HH", data, 16) != (1, 62):
        raise _fail(name, f"not an ELF64 x86-64 relocatable object ({len(data)} bytes, starting {data[:8]!r})")
    (table,) = struct.unpack_from("<Q", data, 0x28)
    entry, count, names = struct.unpack_from("<HHH", data, 0x3A)
    if entry != 64 or table + count * 64 > len(data) or names >= count:
        raise _fail(name, "its section table lies outside the file (truncated or damaged)")
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, table + i * 64) for i in range(count)]
    strings = raw[names][4]
    sections = []
    for label, kind, flags, _addr, offset, size, link, info, align, _entsize in raw:
        if kind != SHT_NOBITS and offset + size > len(data):
            raise _fail(name, f"a section ({size} bytes at {offset}) lies outside the file")
        sections.append(Section(_string(data, strings + label), kind, flags, offset, size, link, info,
                                max(int(align), 1)))
    return sections


def read_symbols(data: bytes, sections: list[Section]) -> list[Symbol]:
    """The entries of the object's symbol table, in order (index 0 is the null symbol)."""
    table = next((s for s in sections if s.kind == SHT_SYMTAB), None)
    if table is None:
        return []
    strings = sections[table.link].offset
    symbols = []
    for i in range(table.size // 24):
        label, info, _other, index, value, size = struct.unpack_from("<IBBHQQ", data, table.offset + 24 * i)
        symbols.append(Symbol(_string(data, strings + label) if label else "", info >> 4, index, value, size))
    return symbols


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.restype = ctypes.c_int
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


@cache
def _libraries() -> tuple[ctypes.CDLL, ...]:
    found = [_libc]  # the process: libc and whatever it has loaded
    for lib in ("m", "gcc_s"):
        path = ctypes.util.find_library(lib)
        if path:
            with contextlib.suppress(OSError):  # a library find_library names but cannot load
                found.append(ctypes.CDLL(path))
    return tuple(found)


def process_symbol(symbol: str) -> int | None:
    """The address of a function or object the process's libraries export (libc, libm,
    libgcc), else of one an object linked here before defines; None when none has it.

    Example:
        >>> process_symbol("memcpy") is not None, process_symbol("no_such_symbol_here")
        (True, None)
    """
    for lib in _libraries():
        try:
            return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
        except AttributeError:
            continue
    return _GLOBALS.get(symbol)


def _map(size: int) -> int:
    if size > MAX_IMAGE:
        raise BackendError(f"linked code would take {size} bytes (more than {MAX_IMAGE}): damaged object code?")
    address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise BackendError(f"cannot map {size} bytes for linked code (errno {ctypes.get_errno()})")
    return address  # (linked code lives as long as the process: it is never unmapped once linked)


def _unmap(address: int, size: int) -> None:
    _libc.munmap(address, size)


def _protect(address: int, size: int, prot: int) -> None:
    if size and _libc.mprotect(address, size, prot) != 0:
        raise BackendError(f"cannot protect linked code at {address:#x} (errno {ctypes.get_errno()})")


def _round(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class _Layout:
    """Where each allocated section goes: three page-aligned regions (code, constants, data),
    then the call stubs (in code) for external symbols and a GOT slot (in constants) for each
    symbol-table entry."""

    def __init__(self, sections: list[Section], externals: list[str], symbols: int):
        self.offset: dict[int, int] = {}
        regions = [[i for i, s in enumerate(sections) if s.allocated and s.flags & SHF_EXECINSTR],
                   [i for i, s in enumerate(sections) if s.allocated and not s.flags & (SHF_EXECINSTR | SHF_WRITE)],
                   [i for i, s in enumerate(sections) if s.allocated and s.flags & SHF_WRITE
                    and not s.flags & SHF_EXECINSTR]]
        at, self.bounds = 0, []
        for region, members in enumerate(regions):
            start = at
            for i in members:
                at = _round(at, sections[i].align)
                self.offset[i] = at
                at += sections[i].size
            if region == 0:
                at = _round(at, 16)
                self.stubs = at
                at += 16 * len(externals)
            if region == 1:
                at = _round(at, 8)
                self.got = at
                at += 8 * symbols
            end = _round(at, PAGE)
            self.bounds.append((start, end))
            at = end
        self.size = max(at, PAGE)


def load_object(obj: bytes, symbols: list[str], name: str = "<object>") -> dict[str, int]:
    """Link object code (from :func:`metadef.codegen.jit.compile_ir` or a cache) into this
    process: ``{symbol: address}`` for the named symbols. Its global symbols become visible to
    objects linked later.

    Example:
        >>> import ctypes
        >>> from metadef.codegen.host import generate
        >>> _, code = generate('define i32 @seven() {\\n ret i32 7\\n}', ["seven"], "doc_seven")
        >>> ctypes.CFUNCTYPE(ctypes.c_int32)(load_object(code, ["seven"])["seven"])()
        7
    """
    data = bytes(obj)
    try:
        sections = read_sections(data, name)
        table = read_symbols(data, sections)
    except (struct.error, IndexError, ValueError) as e:
        raise _fail(name, f"the object code is damaged ({type(e).__name__}: {e})") from e
    externals = sorted({s.name for s in table if s.section == SHN_UNDEF and s.name and s.name != GOT_SYMBOL})
    commons = [s for s in table if s.section == SHN_COMMON]
    if commons:
        raise _fail(name, f"common symbols ({commons[0].name}) are not supported")
    with _LOCK:
        layout = _Layout(sections, externals, len(table))
        base = _map(layout.size)
        try:
            defined = _link(data, name, sections, table, externals, layout, base)
        except BackendError:
            _unmap(base, layout.size)
            raise
        except (struct.error, IndexError, KeyError, ValueError, OverflowError) as e:
            _unmap(base, layout.size)
            raise _fail(name, f"the object code is damaged ({type(e).__name__}: {e})") from e
        _GLOBALS.update(defined)
        _COUNT[0] += 1
    missing = [s for s in symbols if s not in defined]
    if missing:
        raise _fail(name, f"it defines no symbol {', '.join(missing)}")
    return {s: defined[s] for s in symbols}


def _link(data: bytes, name: str, sections: list[Section], table: list[Symbol], externals: list[str],
          layout: _Layout, base: int) -> dict[str, int]:
    """Copy, resolve, relocate and protect one object at ``base``: its global symbols' addresses."""
    image = (ctypes.c_char * layout.size).from_address(base)
    for i in sorted(layout.offset):
        s = sections[i]
        if s.kind != SHT_NOBITS:
            ctypes.memmove(base + layout.offset[i], data[s.offset:s.offset + s.size], s.size)
    resolved = {}
    for k, e in enumerate(externals):
        address = process_symbol(e)
        if address is None:
            raise _fail(name, f"no library in this process defines {e!r}")
        resolved[e] = address
        struct.pack_into("<6sQ", image, layout.stubs + 16 * k, _STUB, address)
    slots = {e: k for k, e in enumerate(externals)}

    def address_of(symbol: Symbol) -> int:
        if symbol.section == SHN_UNDEF:
            return base + layout.got if symbol.name == GOT_SYMBOL else resolved.get(symbol.name, 0)
        if symbol.section == SHN_ABS:
            return symbol.value
        if symbol.section not in layout.offset:
            raise _fail(name, f"symbol {symbol.name or '#'} lies in a section that is not loaded")
        return base + layout.offset[symbol.section] + symbol.value

    for rela in sections:
        if rela.kind != SHT_RELA or rela.info not in layout.offset:
            continue  # relocations of unwind tables or debug sections: not loaded
        _relocate(data, rela, sections[rela.info].name, base + layout.offset[rela.info], table, image,
                  base, layout, slots, address_of, name)
    for region, prot in zip(layout.bounds, (mmap.PROT_READ | mmap.PROT_EXEC, mmap.PROT_READ,
                                            mmap.PROT_READ | mmap.PROT_WRITE)):
        _protect(base + region[0], region[1] - region[0], prot)
    defined = {s.name: address_of(s) for s in table
               if s.name and s.section != SHN_UNDEF and s.binding != STB_LOCAL}
    return defined


def _relocate(data: bytes, rela: Section, section: str, where: int, table: list[Symbol], image: ctypes.Array,
              base: int, layout: _Layout, slots: dict[str, int], address_of, name: str) -> None:
    """Apply one relocation section to the section it patches (loaded at ``where``), with the
    psABI's formulas: S symbol, A addend, P place, L call target, GOT the table, G the slot."""
    got = base + layout.got
    for i in range(rela.size // 24):
        offset, info, addend = struct.unpack_from("<QQq", data, rela.offset + 24 * i)
        kind, index = info & 0xFFFFFFFF, info >> 32
        if index >= len(table):
            raise _fail(name, f"a relocation in {section} names symbol #{index}, past the symbol table")
        if kind not in RELOCATIONS:
            raise _fail(name, f"relocation type {kind} in {section} (at {offset:#x}) is not supported; "
                              f"this linker applies {', '.join(RELOCATIONS.values())}")
        symbol = table[index]
        place, at = where + offset, where + offset - base
        s = address_of(symbol)
        if kind in _GOT_SLOT_TYPES:
            struct.pack_into("<Q", image, layout.got + 8 * index, s)
        g = 8 * index
        call = base + layout.stubs + 16 * slots[symbol.name] if symbol.name in slots else s
        if kind in _WIDE:
            value = {1: s + addend, 24: s + addend - place, 25: s + addend - got, 27: g + addend,
                     28: g + got + addend - place, 29: got + addend - place, 31: call + addend - got}[kind]
            struct.pack_into("<Q", image, at, value & (2**64 - 1))
        else:
            value = {2: s + addend - place, 4: call + addend - place, 26: got + addend - place,
                     10: s + addend, 11: s + addend}.get(kind, g + got + addend - place)
            _pack32(image, at, value, signed=kind != 10, what=f"{RELOCATIONS[kind]} in {section}", name=name)


def _fits32(value: int, signed: bool = True) -> bool:
    return -(2**31) <= value < 2**31 if signed else 0 <= value < 2**32


def _pack32(image: ctypes.Array, at: int, value: int, signed: bool, what: str, name: str) -> None:
    if not _fits32(value, signed):
        raise _fail(name, f"{what}: {value:#x} does not fit in 32 bits")
    struct.pack_into("<i" if signed else "<I", image, at, value)


def compile_count() -> int:
    """How many modules this process has linked: generated here or loaded from a cache (a hit
    grows this count, not :func:`metadef.codegen.jit.generated_count`).

    Example:
        >>> isinstance(compile_count(), int)
        True
    """
    return _COUNT[0]


__all__ = ["RELOCATIONS", "Section", "Symbol", "compile_count", "load_object", "process_symbol", "read_sections",
           "read_symbols"]
