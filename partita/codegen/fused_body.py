"""The body of a ``fused`` node (partita/codegen/op.py): its graph, parsed once per text. Its
run op by op on ATen, the fallback where no kernel was generated, is in aten_fallback.py."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=4096)
def body_graph(text: str):
    """The body graph of a fused node's ``body`` text (parsed once per text)."""
    from ..ir.parser import parse

    return parse(text, "<fused body>")
