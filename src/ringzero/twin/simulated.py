"""The run's step played by the simulator: `ringzero simulate step`'s events on this machine.

The same configuration the planner prices (`predict.plan_inputs`), played by
`simulate.training.simulate_step` on this machine as a topology (`simulate.local`: nodes of the
run's `ranks_per_node` with the link emulator's NICs, one node of free links when nothing is
emulated), with the run's own rates in place of a GPU's roofline (`simulate.step_costs.Measured`):

- compute: each block's FLOPs at the probe's pooled FLOP/s (`rates.pooled_flops`);
- every collective: its host seconds as the in-run probe timed the same call (same group,
  elements and dtype), or the calibrated α-β-γ price where the probe did not time it (a call the
  simulator cuts differently from the engine, such as ZeRO's one weight all-gather per stage), plus
  its schedule played on the emulated links;
- the engine's own gradient buckets, and the collectives inline with compute: the communication
  thread runs on the cores backward uses, so nothing is credited as hidden (`twin.step`'s reason);
- the optimizer at the probe's seconds per parameter.

What the play adds over `twin.step`'s sum is the step's structure: the strategy's calls in the
engine's order, the pipeline's action lists instead of its bubble formula, the links each call
crosses. Configurations it does not play (offload, gradient compression, ZeRO++, a parameter
server) give None.
"""

from __future__ import annotations

from ringzero.plan.hardware import hardware
from ringzero.run.config import TrainConfig
from ringzero.run.kind import RunKind
from ringzero.simulate import local
from ringzero.simulate.grid import Grid
from ringzero.simulate.measured import Measured
from ringzero.simulate.training import simulate_step
from ringzero.twin import predict
from ringzero.twin.rates import call_key

_GROUPS = {"dp": "dp", "tp": "tp"}
"""The simulator's grid dimension -> the probe's group name of its calls."""


def plays(cfg: TrainConfig) -> bool:
    """Whether the simulator plays this run's step (the module doc's exclusions)."""
    z = cfg.zero
    return (cfg.kind == RunKind.GRID and not z.zeropp and cfg.parallel.comm_algorithm != "torch"
            and cfg.compress.compress == "none" and z.offload_optimizer == "none" and z.offload_params == "none")


def measured_rates(cfg: TrainConfig, world: int, rates: dict, buckets: list) -> Measured:
    """The run's rates as the simulator takes them (module doc)."""
    probed = rates.get("comm") or {}

    def host(dim: str, collective: str, algorithm: str, n: int, count: int, itemsize: int) -> float:
        group = _GROUPS.get(dim, dim)
        key = call_key(collective, count, itemsize, group)
        if key in probed:
            return probed[key]
        return predict.call_seconds(cfg, group, collective, n, count * itemsize)

    gradient = cfg.sharding.calls(buckets, cfg.placement(world).dp, cfg.value_bytes, 1, None)
    reduced = tuple(c.count for c in gradient if c.collective in ("all_reduce", "reduce_scatter") and c.count > 1)
    gathered = tuple(c.count for c in gradient if c.collective == "all_gather")
    return Measured(flops=rates["flops"], optimizer_s_per_param=rates["optimizer_s_per_param"], host=host,
                    buckets=reduced or None, gathers=gathered if cfg.sharding.gathers_after_step else None)


def simulated_step(cfg: TrainConfig, world: int, rates: dict, buckets: list) -> float | None:
    """Seconds of one step of `cfg` on `world` local ranks as the simulator plays it, or None."""
    if not plays(cfg) or "flops" not in rates or "optimizer_s_per_param" not in rates:
        return None
    m, tr, par = predict.plan_inputs(cfg, world)
    p = cfg.parallel
    rpn = p.ranks_per_node or world
    gbps, latency_us = p.emulate_inter_node or (local.FREE_BW / 1e9, 0.0)
    topo = local.emulated_topology(world, rpn, gbps, latency_us)
    sim = simulate_step(m, tr, par, hardware("a100-80gb"), topo, Grid(par.dp, par.tp, par.pp),
                        measured=measured_rates(cfg, world, rates, buckets))
    return sim.seconds
