"""Bytes on the wire per GPU per step, for each parallel strategy (sources in the list below).

Each strategy is a list of `CommOp`s: a collective on a group, how often it runs per optimizer
step, and its exact traffic from `plan.comm.volume.volume` (the formulas the traffic meter is
tested against), taken on the group's busiest rank (`comm_volume.busiest`: the root of naive and
tree, a node leader of hierarchical, the rank that absorbs a folded one in butterfly and
Rabenseifner on a group that is not a power of two). Φ below is the gradient/weight bytes one model-parallel
rank owns (Ψ/(tp·pp) parameters x 2 bytes in 16-bit precision); b, s, h a micro-batch.

- DP (ZeRO-0): one all-reduce of Φ per step (gradient accumulation communicates only on the last
  micro-batch): ring 2(N-1)/N·Φ per GPU (Patarasuk & Yuan 2009), 2Φ for large N; naive puts
  (N-1)·Φ in and out of the root (the parameter server of Li et al. 2014; the system moves
  2(N-1)·Φ, often rounded to 2NΦ).
- ZeRO-1: reduce-scatter of the gradients + all-gather of the updated weights, (N-1)/N·Φ each:
  2Φ (Rajbhandari et al. 2020 §7). ZeRO-2 likewise, but the gradients are sharded, so the
  reduce-scatter runs after every micro-batch. ZeRO-3 adds an all-gather of the weights before
  forward and again before backward, every micro-batch, and no final all-gather: 3Φ for one
  micro-batch (ibid.). Shards are padded to equal size, as ZeRO does: the buffer is ceil(Ψ'/N)·N
  elements.
- TP: every layer all-reduces b·s·h activations twice in forward and twice in backward (Megatron-LM,
  Shoeybi et al. 2019 §3): ring 4 x 2(t-1)/t·bsh per layer, Narayanan et al. 2021 §3.2's
  8·bsh·(t-1)/t, 8·bsh for large t, on the stage with the most layers. Full recomputation
  replays the forward and its reductions: 6 per layer as Megatron-LM re-runs a block, 5 as
  torch's non-reentrant checkpoint does (`Parallel.recompute_replay`,
  `tensor_parallel.layer_collectives`); selective recomputation re-runs no collective. Sequence
  parallelism replaces each all-reduce by a reduce-scatter + all-gather pair of the same bytes.
- PP: each micro-batch sends its b·s·h activation forward and its gradient back across each of the
  p-1 stage boundaries (2(p-1)·bsh in total, Narayanan et al. 2021 §3.2); a middle stage sends
  2·bsh per micro-batch (1·bsh at either end), /t under tensor parallelism: each tp rank sends
  its 1/t slice, split by Megatron's scatter/gather (§4.1) or already by sequence parallelism
  (`pipeline.boundary_bytes`). Scatter/gather then all-gathers each arriving slice over the tp
  group, inside the node (§4.1; ringzero's engine does the same): (t-1)/t·bsh per message, counted
  with the tp traffic since it runs on the tp group's links. The interleaved schedule crosses
  a rank boundary once per model chunk, so v times as often (§2.2.2).

Placement is Megatron-LM's: tp varies fastest, then dp, then pp, so a tp group is consecutive
ranks, a dp group strides by tp, and a group is inside one node when its span fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ringzero.plan.comm.volume import Volume, busiest, call_for, volume
from ringzero.plan.config import Parallel, Training
from ringzero.plan.pipeline.layout import busiest_stage_layers
from ringzero.plan.placement import Placement
from ringzero.plan.model.shapes import ModelShape, param_count
from ringzero.plan.strategies.memory import model_parallel_params
from ringzero.plan.strategies.sharding import by_zero, padded_numel
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.strategies import tensor_parallel
from ringzero.plan.comm.volumes import hierarchical
from ringzero.plan.comm.volumes import hierarchical_2d

KINDS = ("dp", "zero", "tp", "pp")


@dataclass(frozen=True)
class CommOp:
    """One collective of a step on one group, as the busiest GPU of the group sees it."""

    kind: str
    """"dp", "zero", "tp" or "pp" (the JSON `comm` key it adds to)."""
    what: str
    """What moves, for the report (e.g. "gradient all-reduce")."""
    collective: str
    """A collective of `plan.comm.volume`, or "send_recv" for pipeline point-to-point."""
    algorithm: str
    group: int
    """Ranks in the group."""
    count: int
    """Elements per call."""
    itemsize: int
    calls: int
    """Calls per optimizer step."""
    node_size: int
    """Ranks of the group that share a node (= group when the group is inside one node)."""
    overlap: str
    """Compute it can hide behind: "forward", "backward" or "none"."""

    @property
    def spans_nodes(self) -> bool:
        return self.node_size < self.group

    def volume(self) -> Volume:
        """Traffic of one call on the busiest rank."""
        return op_volume(self.collective, self.algorithm, self.group, self.count, self.itemsize,
                         self.node_size)

    @property
    def bytes_sent(self) -> float:
        """Bytes the busiest GPU sends per step."""
        return self.calls * self.volume().bytes_sent


@lru_cache(maxsize=65536)
def op_volume(collective: str, algorithm: str, n: int, count: int, itemsize: int, node_size: int) -> Volume:
    """The busiest rank's traffic for one call (cached: the search asks for the same calls many times)."""
    if collective == "send_recv":
        return Volume(bytes_sent=count * itemsize, bytes_recv=count * itemsize,
                      messages_sent=1, messages_recv=1, rounds=1)
    call = call_for(collective, algorithm, n, count, itemsize, ranks_per_node=node_size)
    return volume(call, busiest(call))


@lru_cache(maxsize=65536)
def hierarchical_parts(algorithm: str, n: int, count: int, itemsize: int,
                       node_size: int) -> tuple[Volume, Volume]:
    """(intra-node, inter-node) traffic of rank 0 (a node leader; the largest piece of
    hierarchical_2d) in a node-aware all-reduce."""
    call = call_for("all_reduce", algorithm, n, count, itemsize, ranks_per_node=node_size)
    return (hierarchical if algorithm == "hierarchical" else hierarchical_2d).parts(call, 0)


def data_parallel_ops(m: ModelShape, tr: Training, par: Parallel, gpus_per_node: int,
                      algorithm: str = "ring") -> list[CommOp]:
    """The gradient/weight collectives of DP or ZeRO over the dp group (empty when dp = 1)."""
    if par.dp == 1:
        return []
    return list(_data_parallel_ops(param_count(m).total, tr.bytes_per_value,
                                   tr.accumulation(par.dp), par.dp, par.tp, par.pp, par.zero, gpus_per_node,
                                   algorithm))


@lru_cache(maxsize=65536)
def _data_parallel_ops(n_params: int, size: int, micro: int, n: int, tp: int, pp: int, zero: int,
                       gpus_per_node: int, algorithm: str) -> tuple[CommOp, ...]:
    """`data_parallel_ops` from plain numbers (cached: a search asks again for every recomputation,
    sequence-parallel and schedule setting, which do not change them)."""
    local = model_parallel_params(n_params, tp, pp)
    node = Placement(dp=n, tp=tp, pp=pp, ranks_per_node=gpus_per_node).node_size("dp")
    padded = padded_numel(local, n)

    strategy = by_zero(zero)
    kind = "dp" if zero == 0 else "zero"
    count = padded if strategy.shard_optimizer else local
    return tuple(CommOp(kind, c.what, c.collective, algorithm if c.collective == "all_reduce" else "ring", n,
                        count, size, c.times(micro), node, c.overlap)
                 for c in strategy.collectives)


def tensor_parallel_ops(m: ModelShape, tr: Training, par: Parallel, gpus_per_node: int) -> list[CommOp]:
    """Megatron-LM's activation collectives of every layer of the stage with the most layers, per
    micro-batch (`plan.strategies.tensor_parallel`; empty when tp = 1)."""
    if par.tp == 1:
        return []
    layers = busiest_stage_layers(m, par.pp, par.virtual_stages)
    return list(_tensor_parallel_ops(par.tp, tr.micro_batch * m.seq * m.hidden, tr.bytes_per_value,
                                     layers * tr.accumulation(par.dp),
                                     par.placement(gpus_per_node).node_size("tp"), par.sequence_parallel,
                                     par.recompute, par.recompute_replay))


@lru_cache(maxsize=65536)
def _tensor_parallel_ops(t: int, count: int, itemsize: int, layer_passes: int, node: int,
                         sequence_parallel: bool, recompute: str, replay: str) -> tuple[CommOp, ...]:
    """`tensor_parallel_ops` from plain numbers (cached, like `_data_parallel_ops`)."""
    return tuple(CommOp("tp", what, collective, "ring", t, count, itemsize, calls * layer_passes, node, "none")
                 for what, collective, calls in tensor_parallel.layer_collectives(sequence_parallel, recompute,
                                                                                  replay))


def pipeline_ops(m: ModelShape, tr: Training, par: Parallel, gpus_per_node: int) -> list[CommOp]:
    """Activation and gradient point-to-point of a middle stage, and under scatter/gather (tp > 1
    without sequence parallelism) the all-gather of each arriving slice over the tp group (a "tp"
    op, on NVLink when the tp group is inside a node; empty when pp = 1)."""
    p = par.pp
    if p == 1:
        return []
    # One micro-batch's activation one way, in elements: 1/t of it per tp rank (boundary_bytes).
    count = pipeline.message_numel(tr.micro_batch, m.seq, m.hidden, par.tp)
    inside = par.tp * par.dp * p <= gpus_per_node
    # A middle stage sends an activation forward and a gradient back per micro-batch and model
    # chunk (and receives as many); with two stages each end's outermost chunk sends in one
    # direction only: v forwards and v - 1 backwards, or the reverse.
    v = par.virtual_stages
    calls = tr.accumulation(par.dp) * (2 * v if p > 2 else 2 * v - 1)
    ops = [_pipeline_op(p, count, tr.bytes_per_value, calls, p if inside else 1)]
    if par.tp > 1 and not par.sequence_parallel:
        # Each message that arrives is rebuilt whole from the tp ranks' slices (Narayanan et al.
        # 2021 §4.1): an all-gather of b·s·h over the tp group per receive, as many as the sends.
        node = par.placement(gpus_per_node).node_size("tp")
        ops.append(_gather_op(par.tp, count * par.tp, tr.bytes_per_value, calls, node))
    return ops


@lru_cache(maxsize=65536)
def _gather_op(t: int, count: int, itemsize: int, calls: int, node: int) -> CommOp:
    """The scatter/gather all-gather of `pipeline_ops`, on the tp group and so of kind "tp" (cached,
    like `_data_parallel_ops`)."""
    return CommOp("tp", "scatter/gather: arriving slices all-gathered over tp", "all_gather", "ring", t, count,
                  itemsize, calls, node, "none")


@lru_cache(maxsize=65536)
def _pipeline_op(p: int, count: int, itemsize: int, calls: int, node: int) -> CommOp:
    """The `pipeline_ops` CommOp (cached, like `_data_parallel_ops`)."""
    return CommOp("pp", "activations forward, gradients backward", "send_recv", "p2p", p, count, itemsize,
                  calls, node, "none")


def seed_tp_bytes_per_layer(b: int, s: int, h: int, value_bytes: int = 2) -> float:
    """8·b·s·h per layer: the large-t limit of Narayanan et al. 2021 §3.2's 8·bsh·(t-1)/t."""
    return 8 * b * s * h * value_bytes


def seed_pp_bytes(p: int, b: int, s: int, h: int, value_bytes: int = 2) -> float:
    """2·(p-1)·b·s·h over the whole pipeline: b·s·h each way per boundary (Narayanan et al. 2021 §3.2)."""
    return 2 * (p - 1) * b * s * h * value_bytes


def seed_dp_bytes(n: int, grad_bytes: float, algorithm: str) -> float:
    """Ring 2(N-1)/N·Φ per GPU (Patarasuk & Yuan 2009); naive 2·N·Φ for the whole system (the
    parameter server's 2(N-1)·Φ, rounded up)."""
    return 2 * (n - 1) / n * grad_bytes if algorithm == "ring" else 2 * n * grad_bytes
