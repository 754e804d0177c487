"""The predicted twin of a run's `RankResult.offload`: where the optimizer's and the weights' bytes
live and what they move to and from disk per step (`plan.strategies.offload`: ZeRO-Offload, Ren et al. 2021
§4; ZeRO-Infinity, Rajbhandari et al. 2021 §5).

From the rank's buckets as the strategy laid them out (`RankResult.buckets`: elements, is ZeRO-3's
root), padded as `parallel.flat.FlatBucket` pads them: a bucket of n elements over dp ranks has
shards of ⌈n / dp⌉ elements. The optimizer updates a shard under ZeRO-1/2/3 and the whole bucket
under DP; ZeRO-3 with parameter offload stores every weight shard, and without it no weight is
offloaded (all zeros, as the strategy reports).
"""

from __future__ import annotations

from typing import Sequence

from ringzero.plan.strategies import offload as plan
from ringzero.plan.strategies.offload import DEFAULT_BUFFER_NUMEL, OffloadDevice, OffloadRates, update_seconds
from ringzero.plan.strategies.sharding import shard_numel
from ringzero.run.config import TrainConfig
from ringzero.twin import predict


def predict_offload(cfg: TrainConfig, world: int, buckets: Sequence[tuple[int, bool]]) -> dict:
    """{"optimizer": {device, host, disk}, "params": {device, host, disk}, "disk_io": {"optimizer":
    {read, write}, "params": {read, write}}} of one rank of `cfg` on `world` ranks whose buckets are
    `buckets` ((elements, is root) each), at the engine's measured step."""
    dp = cfg.placement(world).dp
    s = cfg.sharding
    shards = [(shard_numel(n, dp), root) for n, root, *_ in buckets]
    updated = optimizer_shards(cfg, world, buckets)
    wb, count = cfg.value_bytes, cfg.zero.offload_buffers
    opt, params = OffloadDevice(cfg.zero.offload_optimizer), OffloadDevice(cfg.zero.offload_params)
    offloaded = params is not OffloadDevice.NONE and s.shard_params
    return {
        "optimizer": plan.placement(opt, updated, wb, count, DEFAULT_BUFFER_NUMEL).as_dict(),
        "params": (plan.param_placement(params, [n for n, _ in shards], wb, count) if offloaded
                   else plan.Placement()).as_dict(),
        "disk_io": {
            "optimizer": plan.io_per_step(opt, updated, DEFAULT_BUFFER_NUMEL),
            "params": plan.param_io_per_step(params if offloaded else OffloadDevice.NONE, shards, wb,
                                             cfg.training.grad_accum, secondary="hpz" in cfg.zero.zeropp),
        },
    }


def optimizer_shards(cfg: TrainConfig, world: int, buckets: Sequence[tuple[int, bool]]) -> list[int]:
    """Elements the optimizer updates per bucket: its shard, ⌈n / dp⌉, under ZeRO-1/2/3; the whole
    bucket under DP."""
    dp = cfg.placement(world).dp
    s = cfg.sharding
    return [shard_numel(n, dp) if s.shard_optimizer else n for n, *_ in buckets]


def offload_needs(cfg, world: int) -> tuple[int, int]:
    """(host bytes, disk bytes) the offloaded states of all `world` ranks will allocate, this host's
    and this drive's (every rank is local), from the planner's shard of each rank (one bucket: the
    buckets' 4 KiB record rounding adds at most 12 KiB each)."""
    host = disk = 0
    for rank in range(world):
        local = predict.local_params(cfg, world, rank)
        dp = cfg.placement(world).dp
        shard = shard_numel(local, dp)
        if cfg.zero.offload_optimizer != "none":
            p = plan.placement(plan.OffloadDevice(cfg.zero.offload_optimizer), [shard], cfg.value_bytes,
                               cfg.zero.offload_buffers, plan.DEFAULT_BUFFER_NUMEL)
            host, disk = host + p.host, disk + (p.disk + 12 * plan.ALIGN_BYTES if p.disk else 0)
        if cfg.zero.offload_params != "none":
            p = plan.param_placement(plan.OffloadDevice(cfg.zero.offload_params), [shard], cfg.value_bytes,
                                     cfg.zero.offload_buffers)
            host, disk = host + p.host, disk + p.disk
    return host, disk


def predicted_update_seconds(device: str, shards: list[int], weight_bytes: int, buffer_count: int,
                             buffer_numel: int, rates: dict, s_per_param: float) -> float:
    """The offloaded update of `shards` at the measured `rates` and the probe's s/param of the kernel."""
    r = OffloadRates(adam_per_s=1 / s_per_param, transfer_bw=rates["copy_bps"],
                     read_bw=rates.get("read_bps", float("inf")), write_bw=rates.get("write_bps", float("inf")),
                     io_slowdown=rates.get("io_slowdown", 1.0), update_slowdown=rates.get("update_slowdown", 1.0))
    return update_seconds(OffloadDevice(device), shards, weight_bytes, buffer_count, buffer_numel, r)
