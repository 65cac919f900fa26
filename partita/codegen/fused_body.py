"""The body of a ``fused`` node (partita/codegen/op.py): its graph, parsed once per text, and
its run op by op on ATen, the fallback where no kernel was generated."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=4096)
def body_graph(text: str):
    """The body graph of a fused node's ``body`` text (parsed once per text)."""
    from ..ir.parser import parse

    return parse(text, "<fused body>")


@functools.lru_cache(maxsize=1024)
def _aten_program(text: str):
    from ..backend.torch_exec import TorchProgram

    return TorchProgram(body_graph(text))


def run_body_on_aten(args, attrs):
    """The body op by op on ATen: what runs when no kernel was prepared."""
    out = _aten_program(attrs["body"])(list(args))
    return out[0] if len(out) == 1 else out
