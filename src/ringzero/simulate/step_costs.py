"""What each pipeline stage of one training step costs on a topology: compute from the planner,
every collective played from its schedule on the GPUs the grid puts it on.

- Compute: `plan.model.compute`'s per-block forward and backward (recomputation included) and the
  head on the model's last chunk, for the blocks of each chunk (`plan.pipeline.layout`): the same
  numbers `ringzero plan` sums, so the two differ only in what the network and the schedule add.
- Tensor parallelism (Megatron-LM, Shoeybi et al. 2019 §3): per block the collectives of
  `tensor_parallel.layer_collectives`, the forward's two all-reduces (under sequence parallelism
  two all-gathers and two reduce-scatters, Korthikanti et al. 2022 §4.2.2) in forward, the rest in
  backward, each of b·s·h values, the ring played on the stage's tp groups of every dp replica at
  once (they run in lockstep and share NICs when a tp group crosses nodes).
- Pipeline messages: each stage boundary's b·s·h/t activation (or gradient) from every tp rank of
  every replica, played as one set of concurrent flows; under Megatron's scatter/gather the
  receiving tp group all-gathers the slices back (Narayanan et al. 2021 §4.1).
- Data parallelism and ZeRO: the strategy's collectives (`plan.strategies.sharding`) over the
  stage's dp groups, on DDP's buckets of `bucket_mb` cut from each model chunk's gradients (ZeRO-3:
  one gather per block, FSDP's unit), the all-reduce named by `dp_algorithm` or under "auto" the
  fastest played of those with a compressed schedule (ring, tree, hierarchical, hierarchical_2d).

Each distinct call is played once (`Played` is cached by call and stage); its link bytes are kept
so the step can name its busiest links.

`measured.Measured` replaces the hardware's roofline with a run's own rates (ringzero's CPU ranks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ringzero.plan.comm.algorithms import fits
from ringzero.plan.comm.schedule.build import built, schedule_for
from ringzero.plan.comm.volume import call_for
from ringzero.plan.config import Parallel, Training
from ringzero.plan.hardware import Hardware
from ringzero.plan.model.compute import head_seconds, layer_seconds
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.pipeline.layout import chunk_layers, stage_chunks, stage_params
from ringzero.plan.pipeline.schedule import effective_virtual_stages, message_numel, messages
from ringzero.plan.step_time import ALL_REDUCE_CHOICES
from ringzero.plan.strategies.sharding import by_zero, padded_numel
from ringzero.plan.strategies.tensor_parallel import layer_collectives
from ringzero.simulate.collective import play_schedule
from ringzero.simulate.fluid import play
from ringzero.simulate.grid import Grid, per_node
from ringzero.simulate.measured import Measured
from ringzero.simulate.topology import Topology

FORWARD_TP = {"all_reduce": 2, "reduce_scatter": 2, "all_gather": 2}
"""Calls per block in forward: Megatron's f/g pair (two all-reduces), or under sequence
parallelism an all-gather before and a reduce-scatter after each of attention and the MLP."""


@dataclass(frozen=True)
class Chunk:
    """One model chunk of a stage: per micro-batch, its compute and its blocking tp time."""

    layers: int
    forward: float
    backward: float
    tp_forward: float
    tp_backward: float
    params: int
    """Parameters one tp rank holds of this chunk (its gradient buffer's elements)."""


@dataclass
class Costs:
    """Everything the step's event simulation needs, per stage; filled by `costs`."""

    chunks: list[list[Chunk]]
    """[stage][local chunk]."""
    send: dict[tuple[int, int], float]
    """(from stage, to stage) -> seconds of one boundary message (all replicas' flows at once)."""
    gather: list[float]
    """Per stage: the scatter/gather all-gather after each message it receives (0 if none)."""
    buckets: list[list[list[tuple[str, float]]]]
    """[stage][local chunk]: the gradient collective of each bucket, last layer's first."""
    layer_gather: list[float]
    """Per stage: ZeRO-3's all-gather of one block's weights (0 otherwise)."""
    after: list[list[tuple[str, float]]]
    """Per stage: collectives after the optimizer (ZeRO-1/2's weight all-gather)."""
    dp_algorithm: str
    link_bytes: dict[str, np.ndarray] = field(default_factory=dict)
    """Kind -> (L,) link bytes of one step, filled as the step uses each call."""


class Player:
    """Plays calls on the grid's GPUs once each and remembers them."""

    def __init__(self, topo: Topology, grid: Grid, slow: dict[int, float], measured: Measured | None = None):
        self.topo, self.grid, self.slow, self.measured = topo, grid, slow, measured
        self.cache: dict[tuple, tuple[float, np.ndarray]] = {}

    def collective(self, collective: str, algorithm: str, dim: str, stage: int, count: int,
                   itemsize: int) -> tuple[float, np.ndarray]:
        key = (collective, algorithm, dim, stage, count, itemsize)
        if key not in self.cache:
            groups = self.grid.groups(dim, stage)
            n = groups.shape[1]
            if n == 1 or count == 0:
                self.cache[key] = (0.0, np.zeros(len(self.topo.capacities())))
            else:
                sched = schedule_for(collective, algorithm, n, count, itemsize, 0,
                                     per_node(groups, self.topo.gpus_per_node))
                got = play_schedule(sched, self.topo, groups, self.slow)
                host = self.measured.host(dim, collective, algorithm, n, count, itemsize) if self.measured else 0.0
                self.cache[key] = (got.seconds + host, got.link_bytes)
        return self.cache[key]

    def flows(self, src: np.ndarray, dst: np.ndarray, nbytes: int) -> tuple[float, np.ndarray]:
        key = ("p2p", src.tobytes(), dst.tobytes(), nbytes)
        if key not in self.cache:
            links, latency = self.topo.routes(src, dst)
            cap = self.topo.capacities()
            factor = None if not self.slow else np.array([self.slow.get(int(g), 1.0) for g in src])
            got = play(links, latency, np.full(len(src), float(nbytes)), cap, factor)
            valid = links >= 0
            self.cache[key] = (got.seconds, np.bincount(links[valid], minlength=len(cap)) * float(nbytes))
        return self.cache[key]


def dp_algorithm(par: Parallel, player: Player, count: int, itemsize: int) -> str:
    """The all-reduce of DP's buckets: `par.dp_algorithm`, or the fastest played under "auto"."""
    if par.dp_algorithm != "auto" or par.zero or par.dp == 1:
        return par.dp_algorithm if par.dp_algorithm != "auto" else "ring"
    node = per_node(player.grid.groups("dp", 0), player.topo.gpus_per_node)
    count = padded_numel(count, par.dp)
    choices = [a for a in ALL_REDUCE_CHOICES if fits(a, par.dp, node)
               and built(call_for("all_reduce", a, par.dp, count, itemsize, ranks_per_node=node))]
    return min(choices, key=lambda a: player.collective("all_reduce", a, "dp", 0, count, itemsize)[0])


def bucket_counts(params: int, itemsize: int, bucket_mb: float, dp: int, sharded: bool) -> list[int]:
    """Elements of each bucket cut from a chunk's `params` gradients (padded to the dp ranks when
    the strategy shards them, as ZeRO pads its flat buffer)."""
    if params == 0:
        return []
    per = max(1, int(bucket_mb * 2**20 // itemsize))
    k = math.ceil(params / per)
    sizes = [per] * (k - 1) + [params - per * (k - 1)]
    return [padded_numel(s, dp) for s in sizes] if sharded else sizes


def _tp_seconds(player: Player, par: Parallel, stage: int, count: int, itemsize: int
                ) -> tuple[float, float, np.ndarray]:
    """(forward, backward seconds, link bytes) of one block's tp collectives for one micro-batch."""
    fwd = bwd = 0.0
    links = np.zeros(len(player.topo.capacities()))
    if par.tp == 1:
        return fwd, bwd, links
    for _, collective, calls in layer_collectives(par.sequence_parallel, par.recompute, par.recompute_replay):
        t, carried = player.collective(collective, "ring", "tp", stage, count, itemsize)
        ahead = FORWARD_TP[collective]
        fwd, bwd, links = fwd + ahead * t, bwd + (calls - ahead) * t, links + calls * carried
    return fwd, bwd, links


def costs(m: ModelShape, tr: Training, par: Parallel, hw: Hardware, player: Player) -> Costs:
    """The per-stage costs of configuration (m, tr, par) on the player's topology and grid."""
    b, item, pp, micro = tr.micro_batch, tr.bytes_per_value, par.pp, tr.accumulation(par.dp)
    v = effective_virtual_stages(par.schedule, par.virtual_stages)
    if player.measured:
        lf, lb, hf, hb = player.measured.compute(m, b, par.tp, par.recompute)
    else:
        lf, lb = layer_seconds(m, b, par.tp, tr.precision, par.recompute, tr.dropout_for(m), par.sequence_parallel,
                               par.flash_attention, hw)
        hf, hb = head_seconds(m, b, par.tp, tr.precision, hw)
    ranges = chunk_layers(m, pp * v)
    strategy = by_zero(par.zero)
    bsh = b * m.seq * m.hidden
    algo = dp_algorithm(par, player, stage_params(m, par.tp, 0, pp, v) if par.dp > 1 else 0, item)
    out = Costs([], {}, [], [], [], [], algo)

    def use(kind: str, played: tuple[float, np.ndarray], times: int = 1) -> float:
        out.link_bytes[kind] = out.link_bytes.get(kind, 0.0) + played[1] * times
        return played[0]

    dp_kind = "dp" if par.zero == 0 else "zero"
    for s in range(pp):
        tpf, tpb, tp_links = _tp_seconds(player, par, s, bsh, item)
        held, layers = stage_params(m, par.tp, s, pp, v), sum(len(ranges[g]) for g in stage_chunks(s, pp, v))
        use("tp", (0.0, tp_links), layers * micro)
        row, buckets = [], []
        for g in stage_chunks(s, pp, v):
            n, head = len(ranges[g]), g == pp * v - 1
            params = held * n // layers if layers else 0
            ef, eb = player.measured.embeddings(m, b, par.tp) if player.measured and g == 0 else (0.0, 0.0)
            row.append(Chunk(n, n * lf + (hf if head else 0.0) + ef, n * lb + (hb if head else 0.0) + eb,
                             n * tpf, n * tpb, params))
            gradient = strategy.gradient.collective
            alg = algo if gradient == "all_reduce" else "ring"
            sizes = bucket_counts(params, item, par.bucket_mb, par.dp, strategy.shard_optimizer)
            if player.measured and player.measured.buckets is not None and pp * v == 1:
                sizes = list(player.measured.buckets)
            if par.zero == 3:       # one reduce-scatter per block, FSDP's unit
                sizes = [padded_numel(max(1, params // max(1, n)), par.dp)] * n
            times = strategy.gradient.times(micro)
            buckets.append([(gradient, use(dp_kind, player.collective(gradient, alg, "dp", s, c, item), times))
                            for c in sizes])
        out.chunks.append(row)
        out.buckets.append(buckets)
        per_layer = padded_numel(max(1, held // max(1, layers)), par.dp)
        out.layer_gather.append(use(dp_kind, player.collective("all_gather", "ring", "dp", s, per_layer, item),
                                    2 * layers * micro) if par.zero == 3 else 0.0)
        sharded = [padded_numel(held, par.dp)]
        if player.measured and player.measured.gathers is not None and pp * v == 1:
            sharded = list(player.measured.gathers)
        weights = strategy.gathers_after_step and par.dp > 1
        out.after.append([("all_gather", use(dp_kind, player.collective("all_gather", "ring", "dp", s, k, item)))
                          for k in sharded] if weights else [])
        received = sum(messages(s, pp, micro, par.schedule, v)[k] for k in ("activations_received",
                                                                             "gradients_received"))
        gathers = par.tp > 1 and not par.sequence_parallel and pp > 1
        out.gather.append(use("tp", player.collective("all_gather", "ring", "tp", s, bsh, item), received)
                          if gathers else 0.0)
    columns = player.grid.groups("pp")              # (tp·dp, pp): one column per (tp, dp) coordinate
    size = message_numel(b, m.seq, m.hidden, par.tp) * item
    for s in range(pp if pp > 1 else 0):
        sent = messages(s, pp, micro, par.schedule, v)
        for d, k in (((s + 1) % pp, "activations_sent"), ((s - 1) % pp, "gradients_sent")):
            out.send[(s, d)] = use("pp", player.flows(columns[:, s], columns[:, d], size), sent[k])
    return out
