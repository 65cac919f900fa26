"""The op groups of partita/ops/kinds.py name registered ops, and no op is in two groups."""

from __future__ import annotations

from partita.ops.kinds import COLLECTIVE_OPS, GROUPS, kind_of
from partita.ops.registry import OPS


def test_every_grouped_op_is_registered_and_in_one_group():
    seen: dict[str, str] = {}
    for name, ops in GROUPS.items():
        for op in ops:
            assert op in OPS, f"{name}: '{op}' is not a registered op"
            assert op not in seen, f"'{op}' is in {seen[op]} and {name}"
            seen[op] = name
    assert kind_of("matmul") == "gemm" and kind_of("transpose") == "strided_view" and kind_of("add") == ""


def test_the_collectives_are_the_ops_that_communicate_data():
    # axis_index and shard_slice have a group semantics (their rank's position, its slice)
    # but move nothing between ranks.
    communicating = {n for n, d in OPS.items() if d.collective is not None} - {"axis_index", "shard_slice"}
    assert COLLECTIVE_OPS == communicating
