"""The options a training run adds to ZeRO: ZeRO++ (`plan.strategies.zeropp`), offloading, emulated nodes.

`check` validates them as `TrainConfig` is built (one line naming the field and what it allows);
`zeropp` and `comm_settings` turn them into what the engine runs with on `world` ranks.
"""

from __future__ import annotations

import math

from ringzero.plan.config import OFFLOADS
from ringzero.plan.strategies.quantization import BITS
from ringzero.plan.strategies.zeropp import OPTIONS, ZeroPP
from ringzero.run.fields import FieldError
from ringzero.run.kind import RunKind


def _error(field: str, message: str):
    return FieldError(field, message)


def check(cfg) -> None:
    """Raise a `FieldError` for the first ZeRO++, offload or node option `cfg` cannot take."""
    _check_nodes(cfg)
    _check_zeropp(cfg)
    _check_offload(cfg)


def _check_nodes(cfg) -> None:
    rpn = cfg.ranks_per_node
    if rpn is not None and (not isinstance(rpn, int) or isinstance(rpn, bool) or rpn < 1):
        raise _error("ranks_per_node", f"ranks_per_node must be an integer >= 1, got {rpn!r}")
    link = cfg.emulate_inter_node
    if link is not None:
        ok = len(link) == 2 and math.isfinite(link[0]) and link[0] > 0 and math.isfinite(link[1]) and link[1] >= 0
        if not ok:
            raise _error("emulate_inter_node", f"emulate_inter_node must be (GB/s > 0, latency µs >= 0), got {link!r}")
        if rpn is None:
            raise _error("emulate_inter_node", "an emulated inter-node link needs nodes: set ranks_per_node")


def _check_zeropp(cfg) -> None:
    wrong = [o for o in cfg.zeropp if o not in OPTIONS]
    if wrong or len(set(cfg.zeropp)) != len(cfg.zeropp):
        raise _error("zeropp", f"zeropp {','.join(cfg.zeropp)!r}: allowed any of {', '.join(OPTIONS)}, each once")
    if cfg.zeropp and not cfg.sharding.shard_params:
        raise _error("zeropp", f"ZeRO++ ({','.join(cfg.zeropp)}) runs on ZeRO-3 only (it changes ZeRO-3's weight "
                               f"gathers and gradient reduce-scatter), not strategy {cfg.strategy!r}")
    hp = cfg.hpz_partition
    if hp is not None and (not isinstance(hp, int) or isinstance(hp, bool) or hp < 1):
        raise _error("hpz_partition", f"hpz_partition must be an integer >= 1, got {hp!r}")
    if hp is not None and not cfg.zeropp:
        raise _error("hpz_partition", "hpz_partition sets ZeRO++'s node blocks: it needs zeropp")
    if cfg.qgz_bits not in BITS:
        raise _error("qgz_bits", f"qgz_bits must be one of {', '.join(map(str, BITS))}, got {cfg.qgz_bits!r}")


def _check_offload(cfg) -> None:
    for name in ("offload_optimizer", "offload_params"):
        if getattr(cfg, name) not in OFFLOADS:
            raise _error(name, f"{name} {getattr(cfg, name)!r} is not supported; allowed: {', '.join(OFFLOADS)}")
    if cfg.offload_params != "none" and not cfg.sharding.shard_params:
        raise _error("offload_params", f"offload_params={cfg.offload_params!r} needs strategy zero3 (only ZeRO-3 "
                                       f"keeps weight shards between uses), not {cfg.strategy!r}")
    if cfg.offload_optimizer != "none" and not cfg.sharding.shard_optimizer and \
            cfg.kind is not RunKind.PARAMETER_SERVER:      # refused there with its own reason
        raise _error("offload_optimizer", f"offload_optimizer={cfg.offload_optimizer!r} needs ZeRO (zero1, zero2 "
                                          f"or zero3): ZeRO-Offload moves a rank's optimizer shard")
    if cfg.offload_params != "none" and cfg.zeropp:
        raise _error("offload_params", "offload_params and zeropp do not run together: ZeRO++'s gathers "
                                       "read device shards")
    nvme = "nvme" in (cfg.offload_optimizer, cfg.offload_params)
    if nvme and not cfg.nvme_path:
        raise _error("nvme_path", "nvme offload needs nvme_path, a folder for the swap files")
    if cfg.nvme_path and not nvme:
        raise _error("nvme_path", "nvme_path is used by nvme offload only: set offload_optimizer or offload_params to nvme")
    if not isinstance(cfg.offload_buffers, int) or isinstance(cfg.offload_buffers, bool) or cfg.offload_buffers < 2:
        raise _error("offload_buffers", f"offload_buffers must be an integer >= 2 (one read ahead, one "
                                        f"updated), got {cfg.offload_buffers!r}")


def zeropp(cfg, world: int) -> ZeroPP | None:
    """The run's ZeRO++ on `world` ranks (None without it); blocks default to the dp ranks of a node."""
    if not cfg.zeropp:
        return None
    placement = cfg.placement(world)
    partition = cfg.hpz_partition or placement.node_size("dp")
    out = ZeroPP(**{o: True for o in cfg.zeropp}, partition=partition, grad_bits=cfg.qgz_bits)
    try:
        out.blocks(placement.dp)
    except ValueError as e:
        raise _error("hpz_partition", str(e).replace("ZeRO++ partition", "hpz_partition")) from None
    return out


def comm_settings(cfg) -> dict:
    """`ringzero.comm.configure` keywords for the run's nodes and emulated link."""
    out = {"ranks_per_node": cfg.ranks_per_node} if cfg.ranks_per_node is not None else {}
    if cfg.emulate_inter_node is not None:
        out.update(inter_node_gbps=cfg.emulate_inter_node[0], inter_node_latency_us=cfg.emulate_inter_node[1])
    return out
