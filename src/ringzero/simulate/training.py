"""A training configuration's step on a topology: its costs played (`step_costs`), its events run
(`step`), and what the step is made of on its critical stage, beside the planner's closed form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ringzero.plan.config import Parallel, Training
from ringzero.plan.hardware import Hardware
from ringzero.plan.model.compute import optimizer_seconds
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.pipeline.layout import stage_params
from ringzero.plan.pipeline.schedule import effective_virtual_stages
from ringzero.plan.step_time import offload_seconds
from ringzero.plan.strategies.sharding import by_zero, shard_numel
from ringzero.simulate.grid import Grid
from ringzero.simulate.step import PARTS, Stage, Tail, play_step
from ringzero.simulate.measured import Measured
from ringzero.simulate.step_costs import Player, costs
from ringzero.simulate.topology import Topology


@dataclass(frozen=True)
class Simulated:
    seconds: float
    """The step: its slowest stage's end."""
    critical: int
    """That stage."""
    stages: list[Stage]
    dp_algorithm: str
    link_bytes: dict[str, np.ndarray]
    """Kind -> (L,) bytes each link carried in the step."""

    @property
    def parts(self) -> dict[str, float]:
        return self.stages[self.critical].parts

    def busiest(self, topo: Topology, top: int = 3) -> list[dict]:
        """The `top` links by utilisation over the step: bytes / (capacity · step), with the kind
        that put the most bytes on each."""
        kinds = sorted(self.link_bytes)
        if not kinds or not self.seconds:
            return []
        by_kind = np.stack([self.link_bytes[k] for k in kinds])
        use = by_kind.sum(0) / (topo.capacities() * self.seconds)
        out = []
        for i in np.argsort(-use)[:top]:
            if use[i] > 0:
                out.append({"link": topo.link_name(int(i)), "utilisation": float(use[i]),
                            "bytes": float(by_kind[:, i].sum()), "kind": kinds[int(by_kind[:, i].argmax())]})
        return out


def replica_factors(grid: Grid, slow: dict[int, float]) -> dict[int, float]:
    """Stage -> compute slowdown of the replica the job follows: each straggler's factor on its
    stage, the largest where several fall on one (`step`'s module doc)."""
    out: dict[int, float] = {}
    for gpu, factor in slow.items():
        stage = grid.coords(gpu)["pp"]
        out[stage] = max(out.get(stage, 1.0), factor)
    return out


def simulate_step(m: ModelShape, tr: Training, par: Parallel, hw: Hardware, topo: Topology, grid: Grid,
                  slow: dict[int, float] | None = None, measured: Measured | None = None) -> Simulated:
    """The step of (m, tr, par) on `topo` with the GPUs placed by `grid`; `slow`: GPU -> factor;
    `measured`: a run's rates in place of `hw`'s compute and optimizer (offload keeps `hw`'s)."""
    slow = slow or {}
    if grid.world != topo.gpus:
        raise ValueError(f"the grid holds {grid.world} GPUs, the topology {topo.gpus}")
    player = Player(topo, grid, slow, measured)
    c = costs(m, tr, par, hw, player)
    v = effective_virtual_stages(par.schedule, par.virtual_stages)
    strategy = by_zero(par.zero)
    optimizer = []
    for s in range(par.pp):
        held = stage_params(m, par.tp, s, par.pp, v)
        shard = shard_numel(held, par.dp) if strategy.shard_optimizer else held
        if par.offload != "none":
            optimizer.append(0.0)
        else:
            optimizer.append(shard * measured.optimizer_s_per_param if measured
                             else optimizer_seconds(shard, tr.optimizer, hw))
    tail = Tail(optimizer, offload_seconds(m, tr, par, hw))
    stages = play_step(c, par.pp, tr.accumulation(par.dp), par.schedule, v, par.zero, par.prefetch,
                       replica_factors(grid, slow), tail, inline=bool(measured and measured.inline))
    critical = max(range(par.pp), key=lambda s: stages[s].end)
    return Simulated(stages[critical].end, critical, stages, c.dp_algorithm, c.link_bytes)


def as_dict(sim: Simulated, topo: Topology) -> dict:
    """The JSON form: the step, the critical stage's parts, every stage's end, the busiest links."""
    return {"step_s": sim.seconds, "critical_stage": sim.critical,
            "parts_s": {k: sim.parts[k] for k in PARTS}, "stage_end_s": [st.end for st in sim.stages],
            "dp_algorithm": sim.dp_algorithm, "busiest_links": sim.busiest(topo)}
