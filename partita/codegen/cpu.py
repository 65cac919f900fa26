"""The CPU facts the generated kernels share: the thread pool that runs their slices, the
launchers that split a kernel over torch's OpenMP team (team splitting), and the L2 cache size
that sizes their blocks."""

from __future__ import annotations

import ctypes
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .jit import jit

__all__ = ["kernel_pool", "l2_bytes", "gomp_loaded", "launcher", "launcher_ir", "LAUNCHERS", "split_on_team",
           "split_pointers_on_team"]

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_L2: int | None = None
_LAUNCH_LOCK = threading.Lock()


def kernel_pool(n: int) -> ThreadPoolExecutor:
    """The kernels' thread pool, grown to at least ``n`` workers (one pool for the process)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < n:
            _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="partita-kernel")
        return _POOL


def l2_bytes() -> int:
    """This CPU's L2 per core (Linux sysfs; 512 KiB where it cannot be read)."""
    global _L2
    if _L2 is None:
        _L2 = 512 << 10
        try:
            for idx in range(8):
                base = f"/sys/devices/system/cpu/cpu0/cache/index{idx}/"
                with open(base + "level") as f:
                    level = f.read().strip()
                with open(base + "type") as f:
                    kind = f.read().strip()
                if level == "2" and kind in ("Unified", "Data"):
                    with open(base + "size") as f:
                        text = f.read().strip()
                    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
                    _L2 = int(text.rstrip("KM")) * mult
                    break
        except (OSError, ValueError):
            pass
    return _L2


# --- threads: the split run on torch's own OpenMP team ------------------------------------------

# A GEMM split between threads runs on the OpenMP team torch's parallel ops use (libgomp's
# GOMP_parallel, the team of the calling thread): a second pool of Python-started threads beside
# it would compete with the team's workers, which spin for a while after each of torch's
# parallel ops (with 2 threads, 1.2 to 1.8x slower than one thread on the transformers).

def launcher_ir(name: str, fields: list[str], count: str, body: list[str], call: str) -> str:
    """The IR of ``name(ptr data, i64 nt)``, which runs ``call`` once on each thread of a team of
    nt: ``data`` holds the i64s ``fields`` (each loaded as ``%<field>``; ``fnv`` is the kernel's
    address, called as ``%fn``), and thread ``%tid`` of ``%nt`` gets ``[%lo, %hi)``, its even
    share of ``[0, %<count>)``; the ``body`` lines run before the call."""
    lines = ["declare void @GOMP_parallel(ptr, ptr, i32, i32)",
             "declare i32 @omp_get_thread_num()",
             "declare i32 @omp_get_num_threads()",
             f"define internal void @{name}_body(ptr %d) nounwind {{",
             "entry:",
             "  %tid32 = call i32 @omp_get_thread_num()",
             "  %nt32 = call i32 @omp_get_num_threads()",
             "  %tid = zext i32 %tid32 to i64",
             "  %nt = zext i32 %nt32 to i64"]
    for i, f in enumerate(fields):
        lines += [f"  %{f}.p = getelementptr inbounds i64, ptr %d, i64 {i}", f"  %{f} = load i64, ptr %{f}.p, align 8"]
    lines += [f"  %lo0 = mul i64 %{count}, %tid",
              "  %lo = udiv i64 %lo0, %nt",
              "  %tid1 = add i64 %tid, 1",
              f"  %hi0 = mul i64 %{count}, %tid1",
              "  %hi = udiv i64 %hi0, %nt",
              "  %fn = inttoptr i64 %fnv to ptr",
              *body,
              f"  call void %fn({call})",
              "  ret void",
              "}",
              f"define void @{name}(ptr %d, i64 %nt) nounwind {{",
              "entry:",
              "  %nt32 = trunc i64 %nt to i32",
              f"  call void @GOMP_parallel(ptr @{name}_body, ptr %d, i32 %nt32, i32 0)",
              "  ret void",
              "}"]
    return "\n".join(lines) + "\n"


_GOMP: bool | None = None
# Set to False, this makes the team splits use the Python pool, as where libgomp is missing (tests).
_SPLIT: Any = None   # split_on_team and split_pointers_on_team
LAUNCHERS: dict[str, Any] = {}   # compiled launchers by name (None: it did not compile)
_PSPLIT: dict[str, Any] = {}      # those of split_pointers_on_team, one per pointer count


def gomp_loaded() -> bool:
    """Whether libgomp is loaded in this process (torch's OpenMP runtime), its entry points
    made known to the JIT."""
    global _GOMP
    if _GOMP is None:
        _GOMP = False
        try:
            path = None
            with open("/proc/self/maps") as f:
                for line in f:
                    if "libgomp" in line:
                        path = line.split()[-1]
                        break
            if path is not None:
                lib = ctypes.CDLL(path)
                j = jit()
                for sym in ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads"):
                    j.llvm.add_symbol(sym, ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value)
                _GOMP = True
        except Exception:  # no libgomp (another OpenMP runtime): the Python pool splits instead
            _GOMP = False
    return _GOMP


def launcher(cache: dict[str, Any], name: str, ir: Callable[[], str]) -> Any:
    """The compiled launcher ``name(data, nthreads)`` (its IR made by ``ir`` on first use and
    kept in ``cache``), or None without libgomp in this process or where it does not compile."""
    if not gomp_loaded():
        return None
    with _LAUNCH_LOCK:
        if name not in cache:
            try:
                cache[name] = jit().kernel(name, ir(), 0, argtypes=[ctypes.c_void_p, ctypes.c_int64]).fn
            except Exception:
                cache[name] = None
        return cache[name]


def split_pointers_on_team(fn: Any, addrs: list[int], outer: int, nt: int) -> bool:
    """Run a fused kernel ``fn(*addrs, lo, hi)`` over [0, outer) in ``nt`` even shares on
    torch's OpenMP team; False (nothing run) where libgomp is not loaded, so the caller splits
    on its own pool."""
    n = len(addrs)
    name = f"pt_psplit{n}"

    def ir() -> str:
        fields = ["fnv", "outer"] + [f"v{i}" for i in range(n)]
        body = [f"  %p{i} = inttoptr i64 %v{i} to ptr" for i in range(n)]
        call = ", ".join([f"ptr %p{i}" for i in range(n)] + ["i64 %lo", "i64 %hi"])
        return launcher_ir(name, fields, "outer", body, call)

    launch = None if _SPLIT is False else launcher(_PSPLIT, name, ir)
    if launch is None:
        return False
    data = (ctypes.c_int64 * (n + 2))(ctypes.cast(fn, ctypes.c_void_p).value or 0, outer, *addrs)
    launch(ctypes.addressof(data), nt)
    return True


def split_on_team(fn: Any, params: Any, n: int, nt: int) -> None:
    """Run ``fn(params, lo, hi, tid)`` over [0, n) in ``nt`` even shares: on torch's OpenMP
    team where libgomp is loaded, else on the Python pool (ctypes releases the GIL)."""
    launch = None if _SPLIT is False else launcher(LAUNCHERS, "pt_split_omp", lambda: launcher_ir(
        "pt_split_omp", ["fnv", "pv", "n"], "n", ["  %pp = inttoptr i64 %pv to ptr"], "ptr %pp, i64 %lo, i64 %hi, i64 %tid"))
    if launch is not None:
        data = (ctypes.c_int64 * 3)(ctypes.cast(fn, ctypes.c_void_p).value or 0, ctypes.addressof(params), n)
        launch(ctypes.addressof(data), nt)
        return
    bounds = [n * i // nt for i in range(nt + 1)]
    pool = kernel_pool(nt - 1)
    futs = [pool.submit(fn, params, bounds[i], bounds[i + 1], i) for i in range(1, nt)]
    fn(params, bounds[0], bounds[1], 0)
    for f in futs:
        f.result()
