"""The process-group table the collectives' torch implementations read (partita/ops/process_groups.py),
and its names re-exported by partita.parallel.comm."""

import pytest

from partita.ops import collective, process_groups
from partita.parallel import comm


def test_comm_re_exports_the_one_table():
    for name in ("CommError", "clear_groups", "current_groups", "group", "set_groups", "use_groups"):
        assert getattr(comm, name) is getattr(process_groups, name)
    assert collective.group is process_groups.group


def test_groups_set_through_comm_are_what_the_collectives_see():
    marker = object()
    with comm.use_groups({"tp": marker}):
        assert process_groups.group("tp") is marker
        assert process_groups.current_groups() == {"tp": marker}
    assert "tp" not in process_groups.current_groups()


def test_a_missing_group_names_the_axis_and_the_fix():
    previous = process_groups.set_groups({"dp": object()})
    try:
        with pytest.raises(comm.CommError, match=r"mesh axis 'tp'.*groups set: dp.*set_groups\(new_mesh_groups"):
            process_groups.group("tp")
    finally:
        process_groups.set_groups(previous)
