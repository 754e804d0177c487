"""The planner's cross-node bytes of one training step, the twin of the traffic meter's
`cross_node_bytes_sent` / `cross_node_bytes_recv`.

Every collective of `predict.grouped_calls` is priced by `plan.comm.links.cross_node_bytes` with its
group's global ranks, and a pipeline stage's point-to-point messages by where its neighbours sit:
activations go to the next stage and gradients to the previous one (the interleaved schedule's
last stage sends its chunk boundary on to the first). Nodes are the run's `ranks_per_node`
consecutive ranks; without it, one node and no cross-node byte.
"""

from __future__ import annotations

from ringzero.plan.comm import links
from ringzero.plan.strategies import zeropp
from ringzero.plan.comm.volume import call_for, formula
from ringzero.twin import predict
from ringzero.twin import pipeline as pipe
from ringzero.run import zero_options
from ringzero.run.config import TrainConfig


def _members(cfg: TrainConfig, world: int, group: str, rank: int) -> tuple[int, ...]:
    """The ranks of `rank`'s `group` (a `predict.grouped_calls` name), in group-rank order."""
    pl = cfg.placement(world)
    if group == "embedding":
        return pl.embedding_members(rank)
    if group in ("dp_node", "dp_cross"):
        return zeropp.group_members(zero_options.zeropp(cfg, world), group, pl.group(("dp",), rank),
                                    pl.coords(rank)["dp"])
    return pl.group((predict.GROUP_DIM[group],), rank)


def _p2p(cfg: TrainConfig, world: int, rank: int, node) -> tuple[int, int]:
    if cfg.parallel.pp == 1:
        return 0, 0
    pl = cfg.placement(world)
    at = pl.coords(rank)
    nxt = pl.rank(tp=at["tp"], dp=at["dp"], pp=(at["pp"] + 1) % cfg.parallel.pp)
    prev = pl.rank(tp=at["tp"], dp=at["dp"], pp=(at["pp"] - 1) % cfg.parallel.pp)
    n, size = pipe._messages(cfg, at["pp"]), pipe.boundary_numel(cfg) * cfg.value_bytes
    far_next, far_prev = node(nxt) != node(rank), node(prev) != node(rank)
    sent = size * (n["activations_sent"] * far_next + n["gradients_sent"] * far_prev)
    recv = size * (n["activations_received"] * far_prev + n["gradients_received"] * far_next)
    return sent, recv


def cross_node(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]], rank: int = 0,
               sp_elements: int | None = None) -> dict[str, int]:
    """{"cross_node_bytes_sent", "cross_node_bytes_recv"} of `rank` in one step."""
    rpn = cfg.parallel.ranks_per_node
    if rpn is None:
        return {"cross_node_bytes_sent": 0, "cross_node_bytes_recv": 0}
    sent, recv = _p2p(cfg, world, rank, lambda r: r // rpn)
    for group, n, calls in predict.grouped_calls(cfg, world, buckets, sp_elements, rank):
        members = _members(cfg, world, group, rank)
        index = members.index(rank)
        for collective, count, size, times, _ in calls:
            algo = formula(collective, predict.algorithm(cfg, group, collective, n, count * size))
            call = call_for(collective, algo, n, count, size, ranks_per_node=min(rpn, n))
            s, r = links.cross_node_bytes(call, index, members, rpn)
            sent += times * s
            recv += times * r
    return {"cross_node_bytes_sent": sent, "cross_node_bytes_recv": recv}


def emulated_link_seconds(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]], rank: int = 0,
                          sp_elements: int | None = None) -> float:
    """Seconds `rank`'s NIC spends sending its cross-node bytes of one step over the emulated link
    (`--emulate-inter-node GBPS`: the emulator holds each cross-node message for its size over the
    bandwidth, one at a time per NIC); 0 without one. Latency per message is left out."""
    if cfg.parallel.emulate_inter_node is None:
        return 0.0
    gbps, _ = cfg.parallel.emulate_inter_node
    return cross_node(cfg, world, buckets, rank, sp_elements)["cross_node_bytes_sent"] / (gbps * 1e9)
