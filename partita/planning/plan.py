"""``Plan``: what the planner chose, in the words ``parallelize`` takes, with its prices.

A plan is data: the mesh text, the strategy words, the pipeline's microbatches, schedule,
virtual stages and stage cut (layers per stage), the recomputation the step is built with,
and the simulated step time, MFU and peak memory per device; ``report`` is the explanation
(the next best plans, and why each rejected family lost). ``to_json``/``from_json`` round-trip
it; ``parallelize_options()`` is the keyword set ``partita.parallelize`` applies, and
``annotations_for(graph)`` the per-value placements of the per-op sharding integer program
(``sharding="milp"``) named for that graph's values.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .shape import PlanError

RECOMPUTE = ("none", "selective", "full")
SHARDING = ("words", "milp")


@dataclass
class Plan:
    """One parallel plan of a training step on a cluster (see the module docstring)."""

    mesh: str
    strategy: str
    recompute: str = "none"
    microbatches: int = 1
    schedule: str | None = None
    virtual_stages: int = 1
    stages: list[int] | None = None
    devices: int = 1
    cluster: str = ""
    step_time: float | None = None          # simulated seconds per step
    mfu: float | None = None
    memory: float | None = None             # predicted peak bytes per device
    memory_cap: float | None = None
    estimate: float | None = None           # the analytic step time the search ranked it by
    report: dict[str, Any] = field(default_factory=dict)
    # "words": the strategy words place the values; "milp": the per-op sharding integer program's
    # placements (``annotations``) do, on top of the words' dp kind.
    sharding: str = "words"
    # Placements by value name, a layer number written "#" ("transformer.h.#.mlp.c_fc.weight"):
    # one entry stands for that value of every layer (``annotations_for`` names them per graph).
    annotations: dict[str, str] = field(default_factory=dict)
    # One recomputation per pipeline stage (the step is built with ``recompute``, "none"); None: ``recompute`` on all.
    stage_recompute: list[str] | None = None

    @property
    def axes(self) -> dict[str, int]:
        """The mesh's axis sizes by name."""
        return {k: int(v) for k, v in (a.split("=") for a in self.mesh.split(",") if a)}

    @property
    def pipelined(self) -> bool:
        """Whether the plan has pipeline stages."""
        return "pp" in self.strategy.split("+")

    def describe(self) -> str:
        """One line: the mesh, strategy, pipeline options and recomputation."""
        words = [self.mesh] + [self.strategy] * bool(self.strategy)
        if self.pipelined:
            words.append(f"M={self.microbatches} {self.schedule}" +
                         (f" V={self.virtual_stages}" if self.virtual_stages > 1 else ""))
        words.append(f"recompute={','.join(self.stage_recompute) if self.stage_recompute else self.recompute}")
        if self.sharding != "words":
            words.append(f"placements={self.sharding}")
        return " ".join(words)

    def annotations_for(self, graph: Any) -> dict[str, str]:
        """The plan's placements named for ``graph``'s values (a pattern entry names every
        layer's value); empty when the strategy words place everything."""
        if not self.annotations:
            return {}
        from ..ir.printer import value_names
        from .sharding_model import layer_key

        out: dict[str, str] = {}
        for name in value_names(graph).values():
            got = self.annotations.get(name)
            if got is None:
                got = self.annotations.get(layer_key(name)[0])
            if got is not None:
                out[name] = got
        return out

    def parallelize_options(self, unroll: bool = True) -> dict[str, Any]:
        """The keywords of ``partita.parallelize`` that apply this plan."""
        kw: dict[str, Any] = {"mesh": self.mesh, "strategy": self.strategy or None}
        if self.pipelined:
            kw.update(microbatches=self.microbatches, schedule=self.schedule or "1f1b",
                      virtual_stages=self.virtual_stages,
                      recompute=list(self.stage_recompute) if self.stage_recompute else self.recompute, unroll=unroll)
            if self.stages is not None and self.virtual_stages == 1:
                kw["stages"] = list(self.stages)
        return kw

    def training_step(self, forward: Any, **options: Any) -> Any:
        """The training step of ``forward`` built with this plan's recomputation (adamw, master weights)."""
        from ..autodiff import training_step

        opts = {"loss": "cross_entropy", "optimizer": "adamw", "master_weights": True, **options}
        return training_step(forward, recompute=self.recompute, **opts)

    def to_json(self) -> str:
        """The plan as JSON text (``Plan.from_json`` reads it back)."""
        data = asdict(self)
        if data["stage_recompute"] is None:     # plans without it read as they did before it existed
            del data["stage_recompute"]
        return json.dumps({"partita_plan": 1, **data}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """A plan from ``to_json``'s text; PlanError naming the field on bad input."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as e:
            raise PlanError(f"Plan.from_json: not JSON ({e}); give the text Plan.to_json wrote") from None
        if not isinstance(data, dict) or data.pop("partita_plan", None) != 1:
            raise PlanError("Plan.from_json: not a partita plan (no \"partita_plan\": 1); give the text Plan.to_json "
                            "or 'partita plan -o' wrote")
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise PlanError(f"Plan.from_json: unknown field {extra[0]!r}; known: {', '.join(sorted(known))}")
        for key in ("mesh", "strategy"):
            if not isinstance(data.get(key), str):
                raise PlanError(f"Plan.from_json: field {key!r} must be a string, got {data.get(key)!r:.60}")
        ann = data.get("annotations", {})
        if not isinstance(ann, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in ann.items()):
            raise PlanError(f"Plan.from_json: field 'annotations' must map value names to placement text, got "
                            f"{ann!r:.60}")
        if data.get("sharding", "words") not in SHARDING:
            raise PlanError(f"Plan.from_json: sharding={data['sharding']!r:.40} is not one of {', '.join(SHARDING)}")
        if data.get("recompute", "none") not in RECOMPUTE:
            raise PlanError(f"Plan.from_json: recompute={data['recompute']!r:.40} is not one of {', '.join(RECOMPUTE)}")
        per = data.get("stage_recompute")
        if per is not None and (not isinstance(per, list) or not all(r in RECOMPUTE for r in per)):
            raise PlanError(f"Plan.from_json: field 'stage_recompute' must be a list of {', '.join(RECOMPUTE)} (one "
                            f"per pipeline stage) or null, got {per!r:.60}")
        return cls(**data)
