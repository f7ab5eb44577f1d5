"""Polars' own jemalloc, reached for an experiment: its ``mallctl``, to purge on demand.

Polars links jemalloc statically (symbols prefixed ``_rjem_``) and exports none of it, so
no setting lets a process hand freed pages back at a moment of its choosing, the way
Redis's ``MEMORY PURGE`` does. The runtime library keeps its full symbol table, though:
``_rjem_mallctl``'s offset is read from the ELF ``.symtab`` and placed against where the
library's exported ``PyInit_`` symbol was loaded. That is a measuring instrument for
``bench.research.purge``, not something to ship: a stripped Polars wheel would have no table (the
lookup then raises ``LookupError``), and nothing checks the signature but the call.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import BinaryIO

import numpy as np
from polars import _plr  # Polars' binary module, whichever runtime build is installed

# jemalloc's MALLCTL_ARENAS_ALL: "arena.4096.purge" purges every arena.
_ALL_ARENAS = 4096
_SYMBOL = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                    ("value", "<u8"), ("size", "<u8")])
_SHT_SYMTAB = 2
_MallCtl = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_void_p, ctypes.c_size_t)


def symbol_values(path: Path, names: list[str]) -> dict[str, int]:
    """The ``st_value`` of each of ``names`` in a little-endian ELF64 file's ``.symtab``."""
    with path.open("rb") as handle:
        header = handle.read(64)
        if header[:6] != b"\x7fELF\x02\x01":
            raise LookupError(f"{path.name} is not a little-endian ELF64 file")
        (section_headers,) = struct.unpack_from("<Q", header, 0x28)
        entry_size, count = struct.unpack_from("<HH", header, 0x3A)
        handle.seek(section_headers)
        table = handle.read(entry_size * count)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * entry_size)
                    for i in range(count)]
        found: dict[str, int] = {}
        for _name, kind, _flags, _addr, offset, size, link, _info, _align, _entry in sections:
            if kind != _SHT_SYMTAB:
                continue
            strings = _read(handle, sections[link][4], sections[link][5])
            symbols = np.frombuffer(_read(handle, offset, size), dtype=_SYMBOL)
            for name in names:
                at = strings.find(b"\0" + name.encode() + b"\0")
                hits = symbols["value"][symbols["name"] == at + 1] if at >= 0 else []
                if len(hits):
                    found[name] = int(hits[0])
    missing = set(names) - set(found)
    if missing:
        raise LookupError(f"{path.name} has no symbol table entry for {sorted(missing)}")
    return found


def _read(handle: BinaryIO, offset: int, size: int) -> bytes:
    handle.seek(offset)
    return handle.read(size)


@cache
def _mallctl() -> Callable[..., int]:
    path = Path(_plr.__file__ or "")
    library = ctypes.CDLL(str(path))
    init = f"PyInit_{path.name.split('.')[0]}"
    offsets = symbol_values(path, [init, "_rjem_mallctl"])
    loaded_at = ctypes.cast(getattr(library, init), ctypes.c_void_p).value or 0
    function: Callable[..., int] = _MallCtl(loaded_at - offsets[init] + offsets["_rjem_mallctl"])
    return function


def version() -> str:
    """jemalloc's version string, read through ``mallctl`` (a check that the call works)."""
    value = ctypes.c_char_p()
    size = ctypes.c_size_t(ctypes.sizeof(value))
    _check(_mallctl()(b"version", ctypes.byref(value), ctypes.byref(size), None, 0), "version")
    return (value.value or b"").decode()


def purge() -> None:
    """Hand every arena's freed pages back to the kernel now."""
    _check(_mallctl()(f"arena.{_ALL_ARENAS}.purge".encode(), None, None, None, 0), "purge")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise OSError(status, f"jemalloc's mallctl {what} failed")
