"""The generated attention kernel on narrower vectors for heads the machine's width does not divide.

``attention.supported`` refuses a v head size ``Ev`` that is not a multiple of the machine's
f32 lanes (16 with AVX-512): such an ``attention`` node ran on the library's flash kernel, whose
fixed cost per (batch, head) pair dominates small heads (MobileViT's 32 pairs of 4 x 4 keys,
head size 8: 40 to 110 us a call on one thread, where the generated kernel on 4-lane vectors
takes about 10). The same emitter (``attention_ir``) takes any lane count the head divides: this
module picks a narrower ``AttentionConfig`` (8 lanes where the head is a multiple of 8, else 4;
tiles of 4 rows, one vector of keys a block, one of out columns a pass: small blocks, since such
heads come with few keys in the zoo) and leaves every other refusal of ``supported`` standing.

Used by ``attention._prepared`` (the executor's step for an ``attention`` node); the results are
the generated kernel's, only the vectors are narrower (tests/codegen/test_narrow_attention.py).
``PARTITA_NARROW_ATTENTION=0`` keeps the flash kernel for these heads.
"""

from __future__ import annotations

import os
from typing import Callable

from .lowering import vector_width

__all__ = ["narrow_config", "NARROW_LANES"]

# The lane counts tried, widest first: each must divide the head size.
NARROW_LANES = (8, 4)

ENABLED = os.environ.get("PARTITA_NARROW_ATTENTION", "1") != "0"


def narrow_config(q_shape: tuple, k_shape: tuple, v_shape: tuple, group: int,
                  supported: Callable[..., str | None]) -> tuple[int, int, int, int] | None:
    """``AttentionConfig``'s fields (lanes, mr, nvs, nvo) on narrower vectors for these shapes
    when the only thing ``supported`` (``attention.supported``) refuses is v's head size
    against the machine's lanes; else None."""
    if not ENABLED or not v_shape:
        return None
    lanes, ev = vector_width(), int(v_shape[-1])
    if ev <= 0 or ev % lanes == 0:
        return None
    if supported(tuple(q_shape), tuple(k_shape), tuple(v_shape[:-1]) + (lanes,), group) is not None:
        return None   # something else is refused too: the flash kernel as before
    for n in NARROW_LANES:
        if n < lanes and ev % n == 0:
            return (n, 4, 1, 1)
    return None
