"""Placements: how a tensor of the global view is laid out over a device mesh.

A ``Placement`` gives, for each tensor dimension, the mesh axes that split it, major to
minor: ``f32[32@dp@tp]`` on ``mesh(dp=2, tp=2)`` is cut in two along ``dp``, and each half
in two again along ``tp``, so rank ``(i, j)`` holds rows ``[16*i + 8*j, 16*i + 8*j + 8)``.
``partial`` names the mesh axes over which the value is a pending sum: every rank of a group
along such an axis holds a summand, and the global value is their sum. A placement with no
splits and no partial axes is replicated: every rank holds the whole tensor.

Placements are data of the IR (``Value.placement``, printed in the text form); whether they
are consistent with the ops is the sharding rules' business (partita/parallel/sharding.py),
not this module's. ``partita.ir.placement`` re-exports these names.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from .diagnostics import PartitaError, suggest

if TYPE_CHECKING:
    from .mesh import Mesh

_AXIS_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class PlacementError(PartitaError):
    """A placement that does not fit its tensor or its mesh.

    Besides the message, it says where the problem is, so the parser can put its caret on
    the offending token: ``kind`` (``"unknown_axis"``, ``"axis_twice"``, ``"rank"``,
    ``"indivisible"``, ``"bad_axis"``), ``dim`` (the tensor dimension, or None) and ``axis``
    (the mesh axis, or None); ``in_partial`` is true when the axis is one of the partial ones.
    """

    def __init__(self, message: str, kind: str, dim: int | None = None, axis: str | None = None,
                 in_partial: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.dim = dim
        self.axis = axis
        self.in_partial = in_partial


@dataclass(frozen=True, slots=True)
class Placement:
    """Per dimension, the mesh axes that split it (major to minor); the partial-sum axes.

    ``partial`` is a set of axes; it is kept sorted so that equal placements compare equal.
    Construction checks only the form (names are identifiers); whether the placement fits a
    shape and a mesh is ``validate``'s job, since a placement is often built before either
    is at hand (the parser reads placements before the graph's mesh).
    """

    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        d, p = self.dims, self.partial
        # Fast path: the passes build placements by the ten thousand, from tuples of axis
        # names that were checked before (whole dims tuples seen before: one set lookup).
        if type(d) is tuple and type(p) is tuple:
            try:
                seen = d in _CHECKED_DIMS
            except TypeError:  # a list inside: the slow path below says what is wrong
                seen = False
            if seen or all(type(x) is tuple and all(a in _CHECKED for a in x) for x in d):
                if all(a in _CHECKED for a in p):
                    if not seen and len(_CHECKED_DIMS) < 4096:
                        _CHECKED_DIMS.add(d)
                    if len(p) > 1 and list(p) != sorted(p):
                        object.__setattr__(self, "partial", tuple(sorted(p)))
                    return
        dims = tuple(tuple(_axis_names(x, f"dim {i}")) for i, x in enumerate(_as_seq(d, "dims")))
        partial = tuple(sorted(_axis_names(p, "partial")))
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "partial", partial)

    # --- construction -------------------------------------------------------------------
    @classmethod
    def replicated(cls, rank: int) -> "Placement":
        """The placement of a tensor of ``rank`` dims that every rank holds whole."""
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise PlacementError(f"a tensor rank is a non-negative integer, got {rank!r}", "rank")
        return cls(((),) * rank)

    @classmethod
    def split(cls, rank: int, splits: "dict[int, str | Sequence[str]]",
              partial: Iterable[str] = ()) -> "Placement":
        """A placement of ``rank`` dims from ``{dim: axis or axes}``: ``split(2, {0: "dp"})``."""
        dims: list[tuple[str, ...]] = [() for _ in range(rank)]
        for d, axes in splits.items():
            if not isinstance(d, int) or not -rank <= d < rank:
                raise PlacementError(f"dim {d!r} is out of range for a tensor of rank {rank}", "rank", None)
            dims[d] = (axes,) if isinstance(axes, str) else tuple(axes)
        return cls(tuple(dims), tuple(partial))

    # --- facts --------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def is_replicated(self) -> bool:
        """True when no dimension is split and nothing is a pending sum."""
        return not self.partial and not any(self.dims)

    def axes_used(self) -> tuple[str, ...]:
        """Every mesh axis the placement mentions, splits first (by dim), then partial axes."""
        out: list[str] = []
        for axes in self.dims:
            out.extend(axes)
        out.extend(self.partial)
        return tuple(out)

    def validate(self, shape: Sequence[int], mesh: "Mesh", what: str = "the tensor") -> None:
        """Raise PlacementError unless the placement fits ``shape`` on ``mesh``.

        ``what`` names the tensor in the message (``%w``). Checked: one entry per dim, every
        axis on the mesh, no axis used twice, every split dim divisible by the product of
        its axes' sizes (uneven splits are not supported yet).
        """
        shape = tuple(shape)
        key = (self, shape, mesh)
        if key in _VALID:
            return
        self._validate(shape, mesh, what)
        if len(_VALID) >= 1 << 16:
            _VALID.clear()
        _VALID.add(key)

    def _validate(self, shape: tuple[int, ...], mesh: "Mesh", what: str) -> None:
        """``validate``'s checks (not memoized)."""
        if len(self.dims) != len(shape):
            raise PlacementError(
                f"the placement of {what} has {len(self.dims)} dim(s) but the tensor has rank "
                f"{len(shape)} (shape {list(shape)}); give one entry per dim", "rank")
        names = mesh.names
        first_use: dict[str, str] = {}
        for d, axes in enumerate(self.dims):
            for a in axes:
                where = f"dim {d} of {what}"
                self._check_axis(a, names, mesh, where, first_use, d, False)
                first_use[a] = f"dim {d}"
        for a in self.partial:
            self._check_axis(a, names, mesh, f"the partial sum of {what}", first_use, None, True)
            first_use[a] = "the partial sum"
        for d, axes in enumerate(self.dims):
            if not axes:
                continue
            pieces = math.prod(mesh.axis_size(a) for a in axes)
            if shape[d] % pieces:
                over = (f"{axes[0]}={pieces}" if len(axes) == 1 else
                        " x ".join(f"{a}={mesh.axis_size(a)}" for a in axes) + f" ({pieces} pieces)")
                raise PlacementError(
                    f"dim {d} of {what} (size {shape[d]}) does not divide over {over}; pad the "
                    f"dimension to a multiple of {pieces} or choose another split",
                    "indivisible", d, axes[-1])

    @staticmethod
    def _check_axis(a: str, names: tuple[str, ...], mesh: "Mesh", where: str, first_use: dict[str, str],
                    dim: int | None, in_partial: bool) -> None:
        if a not in names:
            raise PlacementError(
                f"{where} uses mesh axis '{a}', which {mesh} does not have{suggest(a, names)}; "
                f"its axes are {', '.join(names)}", "unknown_axis", dim, a, in_partial)
        prev = first_use.get(a)
        if prev is not None:
            same = prev == ("the partial sum" if in_partial else f"dim {dim}")
            again = ("the same partial list" if in_partial else "the same dim") if same else prev
            raise PlacementError(
                f"{where} uses mesh axis '{a}' a second time (already used by {again}); a mesh "
                f"axis splits one dimension once, or marks a partial sum, never both",
                "axis_twice", dim, a, in_partial)

    def local_shape(self, shape: Sequence[int], mesh: "Mesh") -> tuple[int, ...]:
        """The shape of the piece each rank holds (after ``validate``'s checks)."""
        self.validate(shape, mesh)
        return tuple(n // math.prod(mesh.axis_size(a) for a in axes) for n, axes in zip(shape, self.dims))

    def format_shape(self, shape: Sequence[int]) -> str:
        """The bracketed shape of the text form with the splits: ``[32@dp,256@tp]``."""
        return "[" + ",".join(str(n) + "".join("@" + a for a in axes) for n, axes in zip(shape, self.dims)) + "]"

    def format_partial(self) -> str:
        """`` partial(tp)`` as it follows a type in the text form, or ``""``."""
        return f" partial({', '.join(self.partial)})" if self.partial else ""

    def __str__(self) -> str:
        if self.is_replicated:
            return "replicated"
        dims = ", ".join("@".join(axes) if axes else "-" for axes in self.dims)
        return f"[{dims}]{self.format_partial()}"


def _as_seq(x, what: str) -> Sequence:
    if isinstance(x, (str, bytes)) or not isinstance(x, (tuple, list)):
        raise PlacementError(f"placement {what} must be a tuple, got {x!r}", "bad_axis")
    return x


_CHECKED: set[str] = set()  # axis names that passed the check below
_VALID: "set[tuple]" = set()  # (placement, shape, mesh) that passed validate: it is asked again and again
_CHECKED_DIMS: set[tuple] = set()  # dims tuples of such names (tuples of tuples of str)


def _axis_names(axes, what: str) -> list[str]:
    out = list(_as_seq(axes, what))
    for a in out:
        if not isinstance(a, str) or not _AXIS_RE.match(a):
            raise PlacementError(f"placement {what}: mesh axis name {a!r} is not an identifier "
                                 f"(letters, digits, _)", "bad_axis", None, a if isinstance(a, str) else None)
        if len(_CHECKED) < 4096:
            _CHECKED.add(a)
    return out
