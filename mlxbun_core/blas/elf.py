"""Where a loaded ELF shared library keeps the addresses of the functions it imports.

A call from ``libmlx.so`` to ``cblas_sgemm`` goes through a pointer in its global offset
table (GOT), filled by the dynamic linker with whichever library exported the name
first. :func:`import_slots` finds those pointers' offsets from the file's relocation
tables (64-bit little-endian ELF: x86-64 and AArch64 Linux); :func:`loaded_base`
finds where the library sits in this process; :func:`owner` says which loaded file an
address belongs to. Nothing here writes memory: :mod:`.route` does.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SHT_RELA, SHT_DYNSYM = 4, 11
PT_GNU_RELRO = 0x6474E552
# relocation types that store a symbol's plain address in a pointer-sized slot
_SLOT_TYPES = {
    62: {1, 6, 7},  # x86-64: R_X86_64_64, GLOB_DAT, JUMP_SLOT
    183: {257, 1025, 1026},  # AArch64: R_AARCH64_ABS64, GLOB_DAT, JUMP_SLOT
}


class NotSupported(Exception):
    """Not an ELF file this module reads (32-bit, big-endian, another machine)."""


@dataclass(frozen=True)
class Slots:
    """Import slots by symbol name (offsets from the load base) and the read-only-after-
    relocation ranges (RELRO) they may sit in."""

    by_name: dict
    relro: tuple  # ((start, end), ...) as offsets from the load base


def import_slots(path: Path, names: Iterable[str]) -> Slots:
    """The GOT offsets through which ``path`` calls each of ``names``."""
    wanted = set(names)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise NotSupported(f"{path} is not a 64-bit little-endian ELF file")
        machine = struct.unpack_from("<H", data, 0x12)[0]
        if machine not in _SLOT_TYPES:
            raise NotSupported(f"{path}: ELF machine {machine} is not x86-64 or AArch64")
        phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
        relro = []
        for i in range(phnum):
            p_type, _, _, p_vaddr, _, _, p_memsz, _ = struct.unpack_from(
                "<IIQQQQQQ", data, phoff + i * phentsize)
            if p_type == PT_GNU_RELRO:
                relro.append((p_vaddr, p_vaddr + p_memsz))
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                    for i in range(shnum)]
        dynsym_index = next((i for i, s in enumerate(sections) if s[1] == SHT_DYNSYM), None)
        if dynsym_index is None:
            raise NotSupported(f"{path} has no dynamic symbol table")
        dynsym = sections[dynsym_index]
        strtab_off = sections[dynsym[6]][4]
        found: dict[str, list[int]] = {n: [] for n in wanted}
        for s in sections:
            if s[1] != SHT_RELA or s[6] != dynsym_index:
                continue
            for off in range(s[4], s[4] + s[5], 24):
                r_offset, r_info, addend = struct.unpack_from("<QQq", data, off)
                sym, kind = r_info >> 32, r_info & 0xFFFFFFFF
                if not sym or addend or kind not in _SLOT_TYPES[machine]:
                    continue
                name_off = strtab_off + struct.unpack_from("<I", data, dynsym[4] + sym * 24)[0]
                name = data[name_off:data.find(b"\0", name_off)].decode("ascii", "replace")
                if name in found:
                    found[name].append(r_offset)
    return Slots({n: tuple(v) for n, v in found.items() if v}, tuple(relro))


def loaded_base(path: Path) -> int | None:
    """Where ``path`` is mapped in this process (the mapping of file offset 0), or None."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and int(parts[2], 16) == 0 and \
                    os.path.realpath(parts[5].strip()) == real:
                return int(parts[0].split("-")[0], 16)
    return None


def loaded_library(suffix: str) -> Path | None:
    """The loaded file whose path ends with ``suffix`` (e.g. ``/libmlx.so``), or None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip().endswith(suffix):
                return Path(parts[5].strip())
    return None


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


_libc = ctypes.CDLL(None)
_libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def owner(address: int) -> str | None:
    """The file of the loaded library that holds ``address`` (dladdr), or None."""
    info = _DlInfo()
    if not address or not _libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)):
        return None
    return os.path.realpath(info.dli_fname.decode()) if info.dli_fname else None


def read_pointer(address: int) -> int:
    return ctypes.c_void_p.from_address(address).value or 0


def write_pointer(address: int, value: int, *, relro: bool) -> None:
    """Store ``value`` at ``address``; a RELRO page is made writable for the store only."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = address & ~(page - 1)
    if relro and _libc.mprotect(start, page, 3) != 0:  # PROT_READ | PROT_WRITE
        raise OSError(ctypes.get_errno(), "mprotect failed")
    try:
        ctypes.c_void_p.from_address(address).value = value
    finally:
        if relro:
            _libc.mprotect(start, page, 1)  # PROT_READ, as the linker left it
