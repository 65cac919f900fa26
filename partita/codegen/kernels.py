"""Running a ``fused`` node: its kernel compiled once, called with the tensors' buffers.

``prepare_fused(node)`` lowers the node's body (``lowering.lower``), gets its machine code from
the process's JIT (memory, disk cache or a fresh compile) and returns the torch executor's
step function. The step makes the operands contiguous (a view that is not, such as a transpose,
is copied once), allocates the outputs and calls the kernel over the outermost loop; with more
than one torch thread and enough elements, the outermost loop is split between threads (ctypes
releases the GIL while a kernel runs).

When the body cannot be lowered or the compiler fails, the step runs the body op by op on ATen
and the reason is recorded (``fallbacks()``, codegen/aten_fallback.py) and reported once as a
warning.
"""

from __future__ import annotations

import ctypes
import hashlib
import warnings
from typing import Any, Callable

from ..ops._lazy import to_torch_dtype, torch
from .cpu import kernel_pool

__all__ = ["prepare_fused", "kernel_name", "PARALLEL_MIN_ELEMENTS"]

# Below this many elements a kernel runs on one thread whatever torch's thread count: handing
# a slice to a pool thread costs some 20 microseconds.
PARALLEL_MIN_ELEMENTS = 1 << 16


def kernel_name(body_text: str) -> str:
    return "pk_" + hashlib.sha256(body_text.encode()).hexdigest()[:16]


def _where(node) -> str:
    loc = node.text_loc or node.loc
    return f" at {loc}" if loc else ""


def prepare_fused(node, outs: list | None = None) -> Callable:
    """The step function of a ``fused`` node. ``outs``: for each result, a tensor to write it
    into (from the memory plan), or None to allocate it on each call."""
    from .aten_fallback import record_fallback, run_body_on_aten
    from .fused_body import body_graph
    from .jit import CodegenError, jit, offer_native, trampoline
    from .lowering import LoweringError, lower

    text = node.attrs["body"]
    name = kernel_name(text)
    body = body_graph(text)
    try:
        low = lower(body, name)
        k = jit().kernel(name, low.ir, low.n_inputs + low.n_outputs)
    except (LoweringError, CodegenError) as e:
        fb = record_fallback(name, _where(node), str(e))
        warnings.warn(f"partita: fused kernel {name}{fb.where} runs op by op on ATen: {e}", RuntimeWarning,
                      stacklevel=2)
        return run_body_on_aten
    fn = k.fn
    shapes = [tuple(v.type.shape) for v in body.outputs]
    dtypes = [to_torch_dtype(v.type.dtype) for v in body.outputs]
    outer = low.loops[0]
    numel = 1
    for d in low.shape:
        numel *= d
    single = len(shapes) == 1
    empty = torch.empty
    get_threads = torch.get_num_threads
    given: list[Any] = list(outs) if outs is not None else [None] * len(shapes)
    fixed = [o.data_ptr() if o is not None else 0 for o in given]
    planned = all(o is not None for o in given)

    def step(args: list, attrs: dict) -> Any:
        ptrs = [(a if a.is_contiguous() else a.contiguous()) for a in args]
        res: list[Any]
        if planned:
            res = given
            out_addrs = fixed
        else:
            res = [o if o is not None else empty(s, dtype=d) for o, s, d in zip(given, shapes, dtypes)]
            out_addrs = [o.data_ptr() for o in res]
        if numel:
            addrs = [t.data_ptr() for t in ptrs] + out_addrs
            nt = get_threads()
            if nt > 1 and numel >= PARALLEL_MIN_ELEMENTS and outer > 1:
                _run_parallel(fn, addrs, outer, min(nt, outer))
            else:
                fn(*addrs, 0, outer)
        return res[0] if single else list(res)

    if planned and single and numel:
        n_ptrs = low.n_inputs + low.n_outputs
        block = (ctypes.c_int64 * (n_ptrs + 3))()
        block[0] = ctypes.cast(fn, ctypes.c_void_p).value or 0
        block[n_ptrs], block[n_ptrs + 1], block[n_ptrs + 2] = fixed[0], 0, outer
        block_addr = ctypes.addressof(block)

        def native_entry(args: list | None) -> tuple[int, int] | None:
            """(entry, parameter block) of the kernel's whole range on one thread with ``args``
            (None: asks whether the step can offer one), or None where an operand would need a
            contiguous copy first. The block is written here: codegen/step_chain.py checks
            at each call that the operands are still these tensors at these addresses."""
            entry = trampoline(n_ptrs, 2)
            if entry is None:
                return None
            if args is not None:
                if len(args) != low.n_inputs or not all(a.is_contiguous() for a in args):
                    return None
                for i, a in enumerate(args):
                    block[1 + i] = a.data_ptr()
            return entry, block_addr

        offer_native(step, native_entry, (given[0],), block)
    return step


def _call(fn, addrs: list[int], lo: int, hi: int) -> None:
    fn(*addrs, lo, hi)


def _run_parallel(fn, addrs: list[int], outer: int, nt: int) -> None:
    """The outermost loop split into nt even shares: on torch's OpenMP team where libgomp is
    loaded (a pool of Python-started threads beside it competes with the team's spinning
    workers), else on the pool."""
    from .cpu import split_pointers_on_team

    if split_pointers_on_team(fn, addrs, outer, nt):
        return
    bounds = [outer * i // nt for i in range(nt + 1)]
    pool = kernel_pool(nt - 1)
    futs = [pool.submit(_call, fn, addrs, bounds[i], bounds[i + 1]) for i in range(1, nt)]
    fn(*addrs, bounds[0], bounds[1])
    for f in futs:
        f.result()
