"""Digest of the LLVM IR the code generator emits while a set of tests runs: the check that a
refactoring of an IR emitter changed no kernel (run it before and after, and compare).

    .venv/bin/python tools/kernel_ir_digest.py before.txt tests/codegen/test_gemm.py
    # ... change the emitter ...
    .venv/bin/python tools/kernel_ir_digest.py after.txt tests/codegen/test_gemm.py
    diff before.txt after.txt                                       # nothing: byte-identical

It runs pytest on the given paths with ``Jit.kernel`` wrapped so that every kernel's name and
the SHA-256 of its IR text are recorded (kernels compiled from the cache count too: the IR is
made before the cache is asked), then writes the distinct (name, digest) pairs, sorted, and
their count to the output file (the first argument). Tests must pass for the comparison to mean anything; a failing run exits non-zero.
"""

from __future__ import annotations

import hashlib
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    out, argv = argv[0], argv[1:]
    import pytest

    import importlib

    jit_module = importlib.import_module("partita.codegen.jit")

    seen: set[tuple[str, str]] = set()
    original = jit_module.Jit.kernel

    def recording(self, name, ir, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.add((name, hashlib.sha256(ir.encode()).hexdigest()))
        return original(self, name, ir, *args, **kwargs)

    jit_module.Jit.kernel = recording  # type: ignore[method-assign]
    try:
        code = pytest.main(["-q", "-p", "no:cacheprovider", *argv])
    finally:
        jit_module.Jit.kernel = original  # type: ignore[method-assign]
    with open(out, "w") as f:
        for name, digest in sorted(seen):
            f.write(f"{name} {digest}\n")
        f.write(f"# {len(seen)} kernels\n")
    print(f"{len(seen)} kernels recorded in {out}")
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
