"""The CPU facts the generated kernels share: the thread pool that runs their slices and the
L2 cache size that sizes their blocks."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_L2: int | None = None


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
