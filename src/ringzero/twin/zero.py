"""The report's twins of ZeRO's options: bytes over intra- and cross-node links (emulated nodes),
hpZ's secondary weights, and where offloaded states live."""

from __future__ import annotations

from ringzero.plan.strategies import zeropp
from ringzero.plan.strategies.memory import zero3_layers_held
from ringzero.plan.strategies.offload import DEFAULT_BUFFER_NUMEL
from ringzero.twin import predict
from ringzero.twin import links as predict_links
from ringzero.twin.offload import optimizer_shards, predict_offload, predicted_update_seconds
from ringzero.twin.twin import Twin
from ringzero.run import zero_options
from ringzero.run.config import TrainConfig


def _metered(r, key: str) -> int:
    return sum(op.get(key, 0) for op in r.traffic.get("ops", {}).values())


def link_twins(cfg: TrainConfig, world: int, results: list) -> list:
    """Bytes each rank sends over cross-node and intra-node links in one step (the busiest rank of
    each), when the run has nodes."""
    if cfg.parallel.ranks_per_node is None or world == 1 or cfg.parallel.comm_algorithm == "torch":
        return []
    rows = []
    try:
        predict_links.cross_node(cfg, world, results[0].buckets, results[0].rank, results[0].sp_elements)
    except ValueError:           # an algorithm `plan.comm.links` does not model: no row rather than a guess
        return rows
    for kind, sign in (("cross-node", 1), ("intra-node", 0)):
        want, got = [], []
        for r in results:
            cross = predict_links.cross_node(cfg, world, r.buckets, r.rank, r.sp_elements)["cross_node_bytes_sent"]
            total = predict.traffic(cfg, world, r.buckets, r.rank, r.sp_elements)["bytes_sent"]
            metered_cross = _metered(r, "cross_node_bytes_sent")
            want.append(cross if sign else total - cross)
            got.append(metered_cross if sign else _metered(r, "bytes_sent") - metered_cross)
        rows.append(Twin(f"{kind} bytes sent per step", max(want), max(got), "bytes"))
    return rows


def gathered_twins(cfg: TrainConfig, world: int, results: list) -> list:
    """ZeRO-3: the layers held gathered at once, in forward and in backward, against
    `plan.strategies.memory.zero3_layers_held` at the run's prefetch depth."""
    if not cfg.sharding.shard_params:
        return []
    want = zero3_layers_held(cfg.zero.prefetch, cfg.shape.layers)
    return [Twin(f"ZeRO-3 {way}: layers gathered", want, max(r.gathered.get(way, 0) for r in results), "layers")
            for way in ("forward", "backward")]


def zeropp_twins(cfg: TrainConfig, world: int, results: list) -> list:
    zpp = zero_options.zeropp(cfg, world)
    if zpp is None or not zpp.hpz:
        return []
    dp = cfg.placement(world).dp
    return [Twin("hpZ secondary weights held", max(zeropp.secondary_bytes(zpp, r.buckets, dp, cfg.value_bytes)
                                                    for r in results),
                  max(r.held.get("secondary", 0) for r in results), "bytes")]


def offload_update_seconds(cfg: TrainConfig, world: int, buckets: list[tuple[int, bool]], rates: dict) -> float:
    """The offloaded optimizer's update at the run's probed rates (`train.offload_probe`)."""
    return predicted_update_seconds(cfg.zero.offload_optimizer, optimizer_shards(cfg, world, buckets), cfg.value_bytes,
                                    cfg.zero.offload_buffers, DEFAULT_BUFFER_NUMEL, rates["offload"],
                                    rates["optimizer_s_per_param"])


def offload_twins(cfg: TrainConfig, world: int, results: list) -> list:
    """Offloaded bytes by location (optimizer states, weight shards) and disk bytes per step, when
    anything is offloaded (`predict_offload` against what each rank's tensors and files hold)."""
    if cfg.zero.offload_optimizer == "none" and cfg.zero.offload_params == "none":
        return []
    pairs = [(predict_offload(cfg, world, r.buckets), r.offload) for r in results]
    rows = []
    for what, key in (("optimizer states", "optimizer"), ("weight shards", "params")):
        for place, label in (("host", "in host memory"), ("disk", "on disk")):
            want, got = max(p[key][place] for p, _ in pairs), max(m[key][place] for _, m in pairs)
            if want or got:
                rows.append(Twin(f"{what} {label}", want, got, "bytes"))
    for way in ("read", "write"):
        want = max(sum(p["disk_io"][k][way] for k in ("optimizer", "params")) for p, _ in pairs)
        got = max(sum(m["disk_io"][k][way] for k in ("optimizer", "params")) for _, m in pairs)
        if want or got:
            rows.append(Twin(f"disk bytes {'read' if way == 'read' else 'written'} per step", want, got, "bytes"))
    return rows
