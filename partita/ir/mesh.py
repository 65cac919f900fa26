"""Device meshes: named axes with sizes, mapped to ranks.

A ``Mesh`` such as ``mesh(dp=2, tp=4)`` arranges ``2 * 4 = 8`` ranks in a grid, row-major:
the last axis varies fastest, so rank ``r`` has coordinates ``(r // 4, r % 4)`` and the ranks
that share a ``dp`` coordinate (one ``tp`` group) are consecutive, which keeps tensor-parallel
traffic between neighbouring devices. A collective "over axis tp" runs within each group of
ranks that differ only in their ``tp`` coordinate.

A mesh is a record of the IR (``Graph.mesh``, ``mesh(...)`` in the text form): the parser,
the printer and the graph store and compare it. The rank mapping lives here because it is
what the axes mean; the layers above (partita/parallel, partita/runtime) compute with it.
``partita.ir.mesh`` re-exports these names.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable

from .diagnostics import PartitaError


class MeshError(PartitaError):
    """A mesh that cannot exist, or a mesh axis that is not there (the message says which)."""


# The most ranks a mesh may have: far beyond any cluster (the simulator's largest files hold
# 10^5 devices), small enough that per-rank work sized by it stays finite.
MAX_RANKS = 1 << 24

_AXIS_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Mesh:
    """Named axes with sizes, in order (major to minor)."""

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.axes:
            raise MeshError("a mesh needs at least one axis, e.g. mesh(dp=2)")
        seen = set()
        for name, size in self.axes:
            if not isinstance(name, str) or not _AXIS_RE.match(name):
                raise MeshError(f"mesh axis name {name!r} is not an identifier (letters, digits, _)")
            if name in seen:
                raise MeshError(f"mesh axis '{name}' appears twice")
            seen.add(name)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise MeshError(f"mesh axis '{name}' must have a positive integer size, got {size!r:.40}")
        total = math.prod(s for _, s in self.axes)
        if total > MAX_RANKS:
            raise MeshError(f"the mesh {', '.join(f'{n}={s}' for n, s in self.axes)[:200]} has {total:,} ranks, more than "
                            f"the {MAX_RANKS:,} partita plans for (the largest clusters hold about 10^5 devices)")

    # --- construction -------------------------------------------------------------------
    @classmethod
    def of(cls, spec: "str | Mesh | dict[str, int] | Iterable[tuple[str, int]]") -> "Mesh":
        """A mesh from ``"dp=2,tp=2"``, ``"mesh(dp=2, tp=2)"``, a dict or (name, size) pairs."""
        if isinstance(spec, Mesh):
            return spec
        if isinstance(spec, str):
            return cls.parse(spec)
        items = spec.items() if isinstance(spec, dict) else spec
        return cls(tuple((str(n), s) for n, s in items))

    @classmethod
    def parse(cls, text: str) -> "Mesh":
        s = text.strip()
        if s.startswith("mesh(") and s.endswith(")"):
            s = s[5:-1]
        axes = []
        for part in s.split(","):
            part = part.strip()
            if not part:
                continue
            name, eq, size = part.partition("=")
            if not eq or not size.strip().lstrip("-").isdigit():
                raise MeshError(f"bad mesh axis {part!r} in {text!r}: write name=size, e.g. 'dp=2,tp=4'")
            axes.append((name.strip(), int(size)))
        return cls(tuple(axes))

    # --- facts --------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        got = self.__dict__.get("_names")
        if got is None:  # asked for by every placement check: computed once
            got = tuple(n for n, _ in self.axes)
            object.__setattr__(self, "_names", got)
        return got

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def size(self) -> int:
        """The number of ranks."""
        return math.prod(self.shape)

    def axis_size(self, axis: str) -> int:
        sizes = self.__dict__.get("_sizes")
        if sizes is None:
            sizes = dict(self.axes)
            object.__setattr__(self, "_sizes", sizes)
        got = sizes.get(axis) if isinstance(axis, str) else None
        if got is not None:
            return got
        for n, s in self.axes:
            if n == axis:
                return s
        raise MeshError(f"the mesh {self} has no axis '{axis}'; its axes are {', '.join(self.names)}")

    def index(self, axis: str) -> int:
        self.axis_size(axis)
        return self.names.index(axis)

    def coords(self, rank: int) -> tuple[int, ...]:
        """The coordinates of ``rank`` (row-major: the last axis varies fastest)."""
        if not 0 <= rank < self.size:
            raise MeshError(f"rank {rank} is outside the mesh {self} of {self.size} ranks")
        out = []
        for s in reversed(self.shape):
            out.append(rank % s)
            rank //= s
        return tuple(reversed(out))

    def rank(self, coords: Iterable[int]) -> int:
        c = tuple(coords)
        if len(c) != len(self.axes) or any(not 0 <= x < s for x, s in zip(c, self.shape)):
            raise MeshError(f"coordinates {c} are outside the mesh {self}")
        r = 0
        for x, s in zip(c, self.shape):
            r = r * s + x
        return r

    def coord(self, rank: int, axis: str) -> int:
        """The coordinate of ``rank`` along ``axis``."""
        return self.coords(rank)[self.index(axis)]

    def groups(self, axis: str) -> list[list[int]]:
        """The rank groups of a collective over ``axis``: ranks that differ only along it,
        each group ordered by the coordinate along ``axis``."""
        i = self.index(axis)
        groups: dict[tuple[int, ...], list[int]] = {}
        for r in range(self.size):
            c = self.coords(r)
            groups.setdefault(c[:i] + c[i + 1:], []).append(r)
        return list(groups.values())

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The group of ``rank`` for a collective over ``axis``."""
        c = list(self.coords(rank))
        i = self.index(axis)
        out = []
        for x in range(self.shape[i]):
            c[i] = x
            out.append(self.rank(c))
        return out

    def __str__(self) -> str:
        return "mesh(" + ", ".join(f"{n}={s}" for n, s in self.axes) + ")"
