"""The options a training run adds to ZeRO: ZeRO++ (`plan.strategies.zeropp`), ZeRO-3's prefetch and
offloading (`ZeroConfig`, its own fields checked as it is built).

`check` validates what they need of the rest of the run as `TrainConfig` is built (one line naming
the field and what it allows); `zeropp` and `comm_settings` turn them into what the engine runs
with on `world` ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.config import OFFLOADS
from ringzero.plan.strategies.quantization import BITS
from ringzero.plan.strategies.zeropp import OPTIONS, ZeroPP
from ringzero.run.fields import FieldError, check as check_field, choice
from ringzero.run.kind import RunKind


@dataclass(frozen=True, kw_only=True)
class ZeroConfig:
    zeropp: tuple[str, ...] = ()
    """ZeRO++ options on ZeRO-3, any of qwz, hpz, qgz (`plan.strategies.zeropp`)."""
    hpz_partition: int | None = None
    """dp ranks per ZeRO++ block (None: the dp ranks in one node; DeepSpeed's zero_hpz_partition_size)."""
    qgz_bits: int = 4
    """qgZ's gradient bits: 4 or 8."""
    prefetch: int = 1
    """ZeRO-3: layers gathered ahead of the one computing (0: none)."""
    offload_optimizer: str = "none"
    """Where the optimizer states and fp32 masters live: none, cpu (ZeRO-Offload) or nvme (ZeRO-Infinity)."""
    offload_params: str = "none"
    """ZeRO-3 only: where the weight shards live between uses: none, cpu or nvme."""
    nvme_path: str | None = None
    """Folder of the swap files for nvme offload."""
    offload_buffers: int = 4
    """Swap buffers streaming NVMe-offloaded states through the update."""
    offload_pin_memory: bool = True
    """Page-lock the host copies when a GPU is present (faster copies; no effect on a CPU)."""

    def __post_init__(self) -> None:
        wrong = [o for o in self.zeropp if o not in OPTIONS]
        if wrong or len(set(self.zeropp)) != len(self.zeropp):
            raise FieldError("zeropp", f"zeropp {','.join(self.zeropp)!r}: allowed any of {', '.join(OPTIONS)}, each once")
        hp = self.hpz_partition
        if hp is not None and (not isinstance(hp, int) or isinstance(hp, bool) or hp < 1):
            raise FieldError("hpz_partition", f"hpz_partition must be an integer >= 1, got {hp!r}")
        if self.hpz_partition is not None and not self.zeropp:
            raise FieldError("hpz_partition", "hpz_partition sets ZeRO++'s node blocks: it needs zeropp")
        if self.qgz_bits not in BITS:
            raise FieldError("qgz_bits", f"qgz_bits must be one of {', '.join(map(str, BITS))}, got {self.qgz_bits!r}")
        check_field(self, "prefetch", lambda v: v >= 0, "must be an integer >= 0 (layers gathered ahead)",
                    integer=True)
        for name in ("offload_optimizer", "offload_params"):
            choice(self, name, OFFLOADS)
        nvme = "nvme" in (self.offload_optimizer, self.offload_params)
        if nvme and not self.nvme_path:
            raise FieldError("nvme_path", "nvme offload needs nvme_path, a folder for the swap files")
        if self.nvme_path and not nvme:
            raise FieldError("nvme_path", "nvme_path is used by nvme offload only: set offload_optimizer or "
                                          "offload_params to nvme")
        b = self.offload_buffers
        if not isinstance(b, int) or isinstance(b, bool) or b < 2:
            raise FieldError("offload_buffers", f"offload_buffers must be an integer >= 2 (one read ahead, one "
                                                f"updated), got {b!r}")


def check(cfg) -> None:
    """Raise a `FieldError` for the first ZeRO++, prefetch or offload option the run's strategy
    cannot take."""
    z, strategy, s = cfg.zero, cfg.parallel.strategy, cfg.sharding
    if z.zeropp and not s.shard_params:
        raise FieldError("zeropp", f"ZeRO++ ({','.join(z.zeropp)}) runs on ZeRO-3 only (it changes ZeRO-3's weight "
                                   f"gathers and gradient reduce-scatter), not strategy {strategy!r}")
    if z.offload_params != "none" and not s.shard_params:
        raise FieldError("offload_params", f"offload_params={z.offload_params!r} needs strategy zero3 (only ZeRO-3 "
                                           f"keeps weight shards between uses), not {strategy!r}")
    if z.offload_optimizer != "none" and not s.shard_optimizer and \
            cfg.kind is not RunKind.PARAMETER_SERVER:      # refused there with its own reason
        raise FieldError("offload_optimizer", f"offload_optimizer={z.offload_optimizer!r} needs ZeRO (zero1, zero2 "
                                              f"or zero3): ZeRO-Offload moves a rank's optimizer shard")
    if z.prefetch != 1 and not s.shard_params:
        raise FieldError("prefetch", f"prefetch sets how far ZeRO-3 gathers ahead: it needs strategy zero3, "
                                     f"not {strategy!r}")


def zeropp(cfg, world: int) -> ZeroPP | None:
    """The run's ZeRO++ on `world` ranks (None without it); blocks default to the dp ranks of a node."""
    z = cfg.zero
    if not z.zeropp:
        return None
    placement = cfg.placement(world)
    partition = z.hpz_partition or placement.node_size("dp")
    out = ZeroPP(**{o: True for o in z.zeropp}, partition=partition, grad_bits=z.qgz_bits)
    try:
        out.blocks(placement.dp)
    except ValueError as e:
        raise FieldError("hpz_partition", str(e).replace("ZeRO++ partition", "hpz_partition")) from None
    return out


def comm_settings(cfg) -> dict:
    """`ringzero.comm.configure` keywords for the run's nodes, emulated link and transport."""
    p = cfg.parallel
    out = {"ranks_per_node": p.ranks_per_node} if p.ranks_per_node is not None else {}
    out["transport"] = p.transport
    if p.emulate_inter_node is not None:
        out.update(inter_node_gbps=p.emulate_inter_node[0], inter_node_latency_us=p.emulate_inter_node[1])
    return out
