"""The run-time linker: LLVM's object code in the code models it emits, calls into libm, symbols
across objects, and damaged or unsupported objects as clear errors (never a crash)."""

from __future__ import annotations

import contextlib
import ctypes
import math
import struct

import llvmlite.binding as llvm
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadef.codegen import jit
from metadef.codegen.host import generate, host_target
from metadef.codegen.link import RELOCATIONS, load_object, process_symbol, read_sections, read_symbols
from metadef.core.errors import BackendError

pytestmark = pytest.mark.jit

# a table of constants (read-only data), a call into libm, and a mutable global
IR = """
@table = private unnamed_addr constant [4 x float] [float 1.0, float 2.0, float 4.0, float 8.0]
@counter = global i64 0
declare float @sinf(float)

define float @{name}(i64 %i, float %x) {{
  %p = getelementptr [4 x float], ptr @table, i64 0, i64 %i
  %t = load float, ptr %p
  %s = call float @sinf(float %x)
  %c = load i64, ptr @counter
  %c1 = add i64 %c, 1
  store i64 %c1, ptr @counter
  %r = fmul float %t, %s
  ret float %r
}}
"""
SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_float)


def _object(ir: str, reloc: str, codemodel: str) -> bytes:
    """Object code for ``ir`` in a given relocation and code model (the JIT's own is
    ``default`` / ``jitdefault``: the large model, absolute 64-bit relocations)."""
    jit._initialize()
    host = host_target()
    machine = llvm.Target.from_triple(host.triple).create_target_machine(
        cpu=host.cpu, features=host.features, opt=2, reloc=reloc, codemodel=codemodel)
    module = llvm.parse_assembly(ir)
    module.triple = host.triple
    module.data_layout = str(machine.target_data)
    return machine.emit_object(module)


def _relocation_types(obj: bytes) -> set[str]:
    found = set()
    for s in read_sections(obj):
        if s.kind == 4 and not s.name.startswith(".rela.eh_frame"):
            for i in range(s.size // 24):
                (info,) = struct.unpack_from("<Q", obj, s.offset + 24 * i + 8)
                found.add(RELOCATIONS.get(info & 0xFFFFFFFF, str(info & 0xFFFFFFFF)))
    return found


@pytest.mark.parametrize("reloc, codemodel, expected", [
    ("default", "jitdefault", {"R_X86_64_64"}),
    ("pic", "small", {"R_X86_64_PLT32", "R_X86_64_PC32"}),
    ("pic", "large", {"R_X86_64_GOTOFF64", "R_X86_64_GOT64", "R_X86_64_GOTPC64"}),
])
def test_objects_of_each_code_model_link_and_run(reloc: str, codemodel: str, expected: set[str]) -> None:
    name = f"linked_{reloc}_{codemodel}"
    obj = _object(IR.format(name=name), reloc, codemodel)
    assert expected <= _relocation_types(obj) | {"R_X86_64_PC32"}
    f = SIGNATURE(load_object(obj, [name], name)[name])
    for i, x in [(0, 0.5), (2, -1.25), (3, 3.0)]:
        assert f(i, x) == pytest.approx([1.0, 2.0, 4.0, 8.0][i] * math.sin(x), rel=1e-6)
    counter = ctypes.c_int64.from_address(load_object(obj, ["counter"], name)["counter"])
    assert counter.value == 0  # a second link is a second copy, with its own data
    f(1, 1.0)
    assert counter.value == 0


def test_code_that_needs_32_bit_addresses_runs_or_is_refused_by_name() -> None:
    """Position-dependent small-model code holds absolute 32-bit addresses: it links only where
    the mapping lands below 4 GiB (it rarely does), and is refused with the reason otherwise."""
    obj = _object(IR.format(name="low_only"), "static", "small")
    assert "R_X86_64_32S" in _relocation_types(obj) or "R_X86_64_32" in _relocation_types(obj)
    try:
        f = SIGNATURE(load_object(obj, ["low_only"], "low_only")["low_only"])
    except BackendError as e:
        assert "does not fit in 32 bits" in str(e) and "low_only" in str(e)
    else:
        assert f(2, 0.5) == pytest.approx(4 * math.sin(0.5), rel=1e-6)


def test_a_library_call_goes_through_a_stub_that_jumps_to_the_library() -> None:
    obj = _object(IR.format(name="stub_sinf"), "pic", "small")
    f = SIGNATURE(load_object(obj, ["stub_sinf"])["stub_sinf"])
    assert f(1, 0.25) == pytest.approx(2 * math.sin(0.25), rel=1e-6)
    # the call's target: rel32 after the e8 opcode, from the end of the instruction
    code = (ctypes.c_ubyte * 256).from_address(ctypes.cast(f, ctypes.c_void_p).value)
    at = bytes(code).index(0xE8)
    (rel,) = struct.unpack("<i", bytes(code[at + 1:at + 5]))
    stub = ctypes.cast(f, ctypes.c_void_p).value + at + 5 + rel
    jump = bytes((ctypes.c_ubyte * 14).from_address(stub))
    assert jump[:6] == b"\xff\x25\x00\x00\x00\x00"
    assert struct.unpack("<Q", jump[6:])[0] == process_symbol("sinf")


def test_an_object_calls_a_function_an_earlier_object_defines() -> None:
    first = generate("define i64 @linked_base(i64 %x) {\n %y = mul i64 %x, 3\n ret i64 %y\n}",
                     ["linked_base"], "linked_base")[1]
    load_object(first, ["linked_base"])
    caller = _object("declare i64 @linked_base(i64)\n"
                     "define i64 @linked_caller(i64 %x) {\n %y = call i64 @linked_base(i64 %x)\n"
                     " %z = add i64 %y, 1\n ret i64 %z\n}", "pic", "small")
    f = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(load_object(caller, ["linked_caller"])["linked_caller"])
    assert f(5) == 16


def test_the_jit_links_its_own_object_code() -> None:
    addresses, obj = generate(IR.format(name="jit_linked"), ["jit_linked"], "jit_linked")
    assert obj[:4] == b"\x7fELF" and "R_X86_64_64" in _relocation_types(obj)
    assert SIGNATURE(addresses["jit_linked"])(3, 1.0) == pytest.approx(8 * math.sin(1.0), rel=1e-6)


def test_a_symbol_no_library_defines_is_named() -> None:
    obj = _object("declare void @md_no_such_function()\ndefine void @calls_nothing() {\n"
                  " call void @md_no_such_function()\n ret void\n}", "pic", "small")
    with pytest.raises(BackendError, match="no library in this process defines 'md_no_such_function'"):
        load_object(obj, ["calls_nothing"], "calls_nothing")


def test_an_unknown_relocation_type_is_named() -> None:
    obj = bytearray(_object(IR.format(name="bad_type"), "pic", "small"))
    rela = next(s for s in read_sections(bytes(obj)) if s.kind == 4 and s.name == ".rela.text")
    info_at = rela.offset + 8
    (info,) = struct.unpack_from("<Q", obj, info_at)
    struct.pack_into("<Q", obj, info_at, (info >> 32) << 32 | 37)  # R_X86_64_IRELATIVE
    with pytest.raises(BackendError, match=r"relocation type 37 in \.text .* is not supported"):
        load_object(bytes(obj), ["bad_type"], "bad_type")


def test_an_object_without_the_symbol_asked_for_says_so() -> None:
    obj = generate("define void @only_this() {\n ret void\n}", ["only_this"], "only_this")[1]
    with pytest.raises(BackendError, match="defines no symbol not_that"):
        load_object(obj, ["not_that"], "only_this")


def test_symbols_and_sections_read_back() -> None:
    obj = _object(IR.format(name="readable"), "default", "jitdefault")
    names = {s.name for s in read_sections(obj)}
    assert {".symtab", ".strtab"} <= names and any(n.endswith("text") for n in names)
    symbols = {s.name for s in read_symbols(obj, read_sections(obj))}
    assert {"readable", "counter", "sinf"} <= symbols


def test_not_an_object_is_refused() -> None:
    for data in (b"", b"\x7fELF" + bytes(60), b"MZ" + bytes(100)):
        with pytest.raises(BackendError, match="not an ELF64 x86-64 relocatable object"):
            load_object(data, ["f"], "junk")


_GOOD = _object(IR.format(name="fuzzed"), "pic", "small")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_GOOD) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_damaged_object_code_links_or_raises_a_backend_error(edits: list[tuple[int, int]]) -> None:
    data = bytearray(_GOOD)
    for at, byte in edits:
        data[at] = byte
    with contextlib.suppress(BackendError):
        load_object(bytes(data), ["fuzzed"], "fuzzed")
