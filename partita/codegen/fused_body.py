"""The body of a ``fused`` node (partita/codegen/op.py): its graph, parsed once per text. Its
run op by op on ATen, the fallback where no kernel was generated, is in aten_fallback.py.
``BlockCall`` enters a fused kernel with one address (its arguments in a parameter block)."""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from typing import Any


@functools.lru_cache(maxsize=4096)
def body_graph(text: str):
    """The body graph of a fused node's ``body`` text (parsed once per text)."""
    from ..ir.parser import parse

    return parse(text, "<fused body>")


# --- a fused kernel entered through one parameter block ---------------------------------------

_ENTRIES: dict[int, Any] = {}   # the compiled entry by pointer count (None: it did not compile)
_ENTRY_LOCK = threading.Lock()


def pointer_entry_ir(n: int) -> str:
    """The IR of ``pt_pcall<n>(ptr block)``: the block holds the kernel's address, lo, hi and
    ``n`` addresses (each an i64); it calls ``kernel(p0, ..., p<n-1>, lo, hi)``."""
    name = f"pt_pcall{n}"
    fields = ["fnv", "lo", "hi"] + [f"v{i}" for i in range(n)]
    lines = [f"define void @{name}(ptr %d) nounwind {{", "entry:"]
    for i, f in enumerate(fields):
        lines += [f"  %{f}.p = getelementptr inbounds i64, ptr %d, i64 {i}", f"  %{f} = load i64, ptr %{f}.p, align 8"]
    lines += ["  %fn = inttoptr i64 %fnv to ptr"] + [f"  %p{i} = inttoptr i64 %v{i} to ptr" for i in range(n)]
    args = ", ".join([f"ptr %p{i}" for i in range(n)] + ["i64 %lo", "i64 %hi"])
    lines += [f"  call void %fn({args})", "  ret void", "}"]
    return "\n".join(lines) + "\n"


def pointer_entry(n: int) -> Any:
    """The compiled ``pt_pcall<n>`` (once a process), or None where it does not compile."""
    with _ENTRY_LOCK:
        if n not in _ENTRIES:
            try:
                from .jit import jit

                _ENTRIES[n] = jit().kernel(f"pt_pcall{n}", pointer_entry_ir(n), 0, argtypes=[ctypes.c_void_p]).fn
            except Exception:
                _ENTRIES[n] = None
        return _ENTRIES[n]


class BlockCall:
    """A fused kernel ``fn(p0, ..., p<n-1>, lo, hi)`` called over [0, outer) with one ctypes
    argument: the block (the kernel's address and the range set once; the ``n`` addresses
    written at each call in one struct write) instead of n + 2 converted arguments. One call
    at a time (the block is reused), as the step that holds it."""

    __slots__ = ("block", "addr", "pack", "entry")

    def __init__(self, fn: Any, n: int, outer: int) -> None:
        self.entry = pointer_entry(n)
        fnv = ctypes.cast(fn, ctypes.c_void_p).value or 0
        self.block = (ctypes.c_int64 * (n + 3))(fnv, 0, outer)
        self.addr = ctypes.addressof(self.block)
        self.pack = struct.Struct(f"={n}q").pack_into

    def __call__(self, addrs: list) -> None:
        """Run the kernel on ``addrs`` (its n addresses, inputs then outputs)."""
        self.pack(self.block, 24, *addrs)
        entry = self.entry
        assert entry is not None
        entry(self.addr)


def block_call(fn: Any, n: int, outer: int) -> BlockCall | None:
    """A ``BlockCall`` of ``fn``, or None where the entry does not compile (the caller passes
    the addresses as arguments)."""
    if pointer_entry(n) is None:
        return None
    return BlockCall(fn, n, outer)
