"""Compiling kernels with LLVM (llvmlite) and caching the machine code on disk.

One MCJIT engine per process holds every kernel. A kernel's machine code is keyed by the
SHA-256 of its LLVM IR, the LLVM version, the host CPU and its features, and this module's
``FORMAT``; a hit in the in-process table costs nothing, a hit on disk costs reading one small
object file, and a miss costs parsing, optimizing (LLVM's O3 pipeline with the loop and SLP
vectorizers) and emitting code, about 15 ms a kernel (docs/codegen-choice.md).

The cache directory is ``$PARTITA_CACHE_DIR`` or ``$XDG_CACHE_HOME/partita/kernels`` (default
``~/.cache/partita/kernels``). Entries are written to a temporary name and renamed, so a second
process never reads half a file; each entry starts with a header and the SHA-256 of its
payload, so a truncated or damaged file is noticed before LLVM sees it, reported, compiled
again and replaced. A directory that cannot be written is reported once and kernels are then
compiled in memory only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..ir.diagnostics import PartitaError

__all__ = ["CodegenError", "CompiledKernel", "Jit", "jit", "cache_dir", "CacheStats", "FORMAT", "RANGE_ARGTYPES", "range_kernel"]

FORMAT = "partita-kernel-1"
_MAGIC = b"PARTITA-KERNEL-1\n"


class CodegenError(PartitaError):
    """The code generator cannot run (llvmlite missing or failing) or a kernel did not compile."""


def cache_dir() -> Path:
    env = os.environ.get("PARTITA_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "partita" / "kernels"


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    compiled: int = 0
    corrupt: int = 0
    compile_seconds: float = 0.0
    load_seconds: float = 0.0


@dataclass
class CompiledKernel:
    name: str
    address: int
    n_args: int
    source: str                   # "memory", "disk" or "compiled"
    fn: Any = field(default=None, repr=False)


class Jit:
    """The process's LLVM engine and kernel table."""

    def __init__(self) -> None:
        try:
            import llvmlite.binding as llvm  # type: ignore[import-untyped]
        except ImportError as e:  # pragma: no cover - a dependency of partita
            raise CodegenError(f"the code generator needs llvmlite, which is not installed ({e}); install partita "
                               "from requirements.lock (make setup), or run without codegen (backend='torch')") from None
        self.llvm = llvm
        self.lock = threading.RLock()
        try:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            target = llvm.Target.from_default_triple()
            self.cpu = llvm.get_host_cpu_name()
            self.features = llvm.get_host_cpu_features().flatten()
            self.tm = target.create_target_machine(cpu=self.cpu, features=self.features, opt=3)
            self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.tm)
        except Exception as e:  # pragma: no cover - a broken LLVM install
            raise CodegenError(f"LLVM (llvmlite {getattr(llvm, '__version__', '?')}) could not set up code generation "
                               f"for this CPU: {e}") from None
        self.version = ".".join(map(str, llvm.llvm_version_info))
        self.kernels: dict[str, CompiledKernel] = {}
        self.stats = CacheStats()
        self._dir_warned = False

    # --- keys and files ----------------------------------------------------------------
    def key(self, ir: str) -> str:
        h = hashlib.sha256()
        for part in (FORMAT, self.version, self.cpu, self.features, ir):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def _read(self, path: Path) -> bytes | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            self._warn_dir(f"cannot read {path}: {e}")
            return None
        n = len(_MAGIC)
        if data[:n] == _MAGIC and len(data) >= n + 64:
            digest, payload = data[n:n + 64], data[n + 64:]
            if hashlib.sha256(payload).hexdigest().encode() == digest:
                return payload
        self.stats.corrupt += 1
        warnings.warn(f"partita: the kernel cache entry {path} is damaged (bad header or checksum); it is compiled "
                      "again and replaced", RuntimeWarning, stacklevel=4)
        return None

    def _write(self, path: Path, payload: bytes) -> None:
        data = _MAGIC + hashlib.sha256(payload).hexdigest().encode() + payload
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".o")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as e:
            self._warn_dir(f"cannot write {path.parent}: {e}")

    def _warn_dir(self, why: str) -> None:
        if not self._dir_warned:
            self._dir_warned = True
            warnings.warn(f"partita: the kernel cache is not usable ({why}); kernels are compiled in memory for this "
                          "process only. Set PARTITA_CACHE_DIR to a writable directory to keep them.",
                          RuntimeWarning, stacklevel=4)

    # --- compiling ---------------------------------------------------------------------
    def compile_object(self, ir: str) -> bytes:
        llvm = self.llvm
        try:
            mod = llvm.parse_assembly(ir)
            mod.verify()
        except Exception as e:
            raise CodegenError(f"LLVM refused a generated kernel (a code generator bug; please report it with the "
                               f"kernel's IR, `partita opt --emit=kernels`): {e}") from None
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pb = llvm.create_pass_builder(self.tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return bytes(self.tm.emit_object(mod))

    def optimized_ir(self, ir: str) -> str:
        """The IR after LLVM's optimizations (what ``--emit=kernels --optimized`` shows)."""
        llvm = self.llvm
        mod = llvm.parse_assembly(ir)
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pb = llvm.create_pass_builder(self.tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return str(mod)

    def kernel(self, name: str, ir: str, n_args: int, use_disk: bool = True,
               argtypes: list | None = None) -> CompiledKernel:
        """The callable kernel ``name`` (with ``n_args`` pointer arguments, then lo and hi; or
        the ctypes ``argtypes`` given)."""
        with self.lock:
            key = self.key(ir)
            got = self.kernels.get(key)
            if got is not None:
                self.stats.memory_hits += 1
                return CompiledKernel(got.name, got.address, got.n_args, "memory", got.fn)
            path = cache_dir() / key[:2] / f"{key}.o"
            t0 = time.perf_counter()
            obj = self._read(path) if use_disk else None
            source = "disk"
            if obj is None:
                obj = self.compile_object(ir)
                source = "compiled"
                self.stats.compiled += 1
                self.stats.compile_seconds += time.perf_counter() - t0
                if use_disk:
                    self._write(path, obj)
            else:
                self.stats.disk_hits += 1
            t1 = time.perf_counter()
            try:
                self.engine.add_object_file(self.llvm.ObjectFileRef.from_data(obj))
                self.engine.finalize_object()
                addr = self.engine.get_function_address(name)
            except Exception as e:
                raise CodegenError(f"kernel {name} could not be loaded: {e}") from None
            if not addr:
                raise CodegenError(f"kernel {name} is missing from its machine code (cache entry {path}); delete the "
                                   "entry and run again")
            self.stats.load_seconds += time.perf_counter() - t1
            types = argtypes if argtypes is not None else [ctypes.c_void_p] * n_args + [ctypes.c_int64] * 2
            proto = ctypes.CFUNCTYPE(None, *types)
            k = CompiledKernel(name, addr, n_args, source, proto(addr))
            self.kernels[key] = k
            return k


_JIT: Jit | None = None
_JIT_LOCK = threading.Lock()


def jit() -> Jit:
    """The process's ``Jit`` (created on first use)."""
    global _JIT
    with _JIT_LOCK:
        if _JIT is None:
            _JIT = Jit()
        return _JIT


# The signature of a kernel run over a range of work items: void NAME(ptr params, i64 lo, i64 hi, i64 tid).
RANGE_ARGTYPES = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
_RANGE: dict[tuple, Any] = {}
_RANGE_LOCK = threading.Lock()


def range_kernel(key: tuple, source: Callable[[], tuple[str, str]]) -> Any:
    """The ctypes function of a kernel of ``RANGE_ARGTYPES``, compiled once a process per ``key``
    (a tuple naming the kernel family first, then every constant its IR depends on); ``source()``
    gives its (name, LLVM IR) when it is not compiled yet (the disk cache may still hold it)."""
    with _RANGE_LOCK:
        fn = _RANGE.get(key)
        if fn is None:
            name, ir = source()
            fn = _RANGE[key] = jit().kernel(name, ir, 0, argtypes=RANGE_ARGTYPES).fn
        return fn


_TRAMPOLINES: dict[tuple[int, int], int | None] = {}
_TRAMPOLINE_LOCK = threading.Lock()


def trampoline(n_ptrs: int, n_ints: int) -> int | None:
    """The address of ``pt_trampoline_P_I(ptr p)`` (compiled once a process), which calls a
    kernel from a block of i64: p = [the kernel's address, ``n_ptrs`` pointers, ``n_ints``
    integers], as ``kernel(ptr..., i64...)``. A run of kernels (codegen/step_chain.py) calls
    each through it on its own block: a fused kernel's whole range is (its operands' and
    results' addresses, 0, the outer count); a ``RANGE_ARGTYPES`` kernel's is (its parameter
    block, 0, the work items, 0). None where it does not compile."""
    key = (n_ptrs, n_ints)
    with _TRAMPOLINE_LOCK:
        if key in _TRAMPOLINES:
            return _TRAMPOLINES[key]
    name = f"pt_trampoline_{n_ptrs}_{n_ints}"
    lines = [f"define void @{name}(ptr %p) nounwind {{", "entry:", "  %fv = load i64, ptr %p, align 8",
             "  %f = inttoptr i64 %fv to ptr"]
    for i in range(1, n_ptrs + n_ints + 1):
        lines += [f"  %q{i} = getelementptr inbounds i64, ptr %p, i64 {i}", f"  %v{i} = load i64, ptr %q{i}, align 8"]
        if i <= n_ptrs:
            lines.append(f"  %a{i} = inttoptr i64 %v{i} to ptr")
    args = [f"ptr %a{i}" for i in range(1, n_ptrs + 1)] + [f"i64 %v{i}" for i in range(n_ptrs + 1, n_ptrs + n_ints + 1)]
    lines += [f"  call void %f({', '.join(args)})", "  ret void", "}"]
    try:
        addr: int | None = jit().kernel(name, "\n".join(lines) + "\n", 0, argtypes=[ctypes.c_void_p]).address
    except CodegenError:
        addr = None
    with _TRAMPOLINE_LOCK:
        _TRAMPOLINES[key] = addr
    return addr


def range_block(fn: Any, params_addr: int, items: int) -> tuple[Any, int]:
    """A block for ``trampoline(1, 3)`` that runs the ``RANGE_ARGTYPES`` kernel ``fn`` on the
    parameter block at ``params_addr`` over all ``items`` on one thread: (the block, its address)."""
    block = (ctypes.c_int64 * 5)(ctypes.cast(fn, ctypes.c_void_p).value or 0, params_addr, 0, items, 0)
    return block, ctypes.addressof(block)


def offer_native(step: Any, native_entry: Callable[[list | None], tuple[int, int] | None], outs: tuple,
                 block: Any = None) -> None:
    """Give a step with no packed operand (a fused kernel, a norm, attention) what a chain
    reads of it: ``native_entry``, the buffers of its results in their order (``native_outs``,
    the first as ``native_out``), no packed operands (``native_packed``: nothing whose version
    the chain checks; a step that refuses then refuses for good, for an operand's strides), and
    ``block``, the parameter block its entry runs on, kept alive with the step."""
    step.native_entry = native_entry
    step.native_out = outs[0]
    step.native_outs = tuple(outs)
    step.native_packed = ()
    step.native_block = block


def range_entry(fn: Any, params_addr: int, items: int,
                bind: Callable[[list], bool]) -> Callable[[list | None], tuple[int, int] | None]:
    """The ``native_entry`` of a step whose ``jit.RANGE_ARGTYPES`` kernel ``fn`` runs on the
    parameter block at ``params_addr`` over ``items`` work items: ``bind(args)`` points the
    block at a call's tensors (False where one would need a copy first); the entry is the
    trampoline on a block of its own (``jit.range_block``), kept alive by the function."""
    block, block_addr = range_block(fn, params_addr, items)

    def native_entry(args: list | None) -> tuple[int, int] | None:
        entry = trampoline(1, 3)
        if entry is None or (args is not None and not bind(args)):
            return None
        return entry, block_addr

    native_entry.block = block  # type: ignore[attr-defined]
    return native_entry
