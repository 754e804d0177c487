"""ZeRO++ (Wang et al. 2023): ZeRO-3 with less traffic across nodes, written once as data.

Three independent options on top of ZeRO-3's schedule (`plan.strategies.sharding.ZERO3`), each removing part of
its 3Φ of traffic per step (forward all-gather, backward all-gather, gradient reduce-scatter):

    qwZ  (§3.1) the forward all-gather moves each rank's weight shard quantized blockwise to int8
         (one fp32 scale per block): Φ·(1/2 + 4/(2·block)) in units of 16-bit Φ; so does the backward
         all-gather where hpZ does not replace it (every gather of the primary partition).
    hpZ  (§3.2) the forward all-gather also leaves a secondary copy of the gathered 16-bit weights
         sharded over the `partition` ranks of a node, so the backward all-gather runs inside the
         node: no cross-node bytes, for 2Φ/partition more bytes held per rank.
    qgZ  (§3.3) the gradient reduce-scatter becomes a two-hop all-to-all of blockwise 4- (or 8-)
         bit gradients: inside the node first (each rank receives, dequantizes and sums in fp32 the
         slices that its node-local index will own on every node), then across nodes between the
         ranks of the same local index, which sum the last hop into their own shard. Cross-node:
         (N-1)/N of Φ/H at 4 bits per rank.

The dp group of D ranks is cut into D/H blocks of H consecutive dp ranks, H = `partition` (one node's
share of the group): "dp_node" is a rank's block, "dp_cross" the ranks with its index in every block.
A bucket of n (padded: a multiple of D) elements has shards of s = n/D; dp rank d = j·H + l is the
l-th rank of block j.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.strategies.quantization import BITS, DEFAULT_BLOCK, levels, quantized_bytes
from ringzero.plan.comm.kinds import Call
from ringzero.plan.strategies.sharding import NORM_CALL, ZERO3, padded_numel, shard_numel

OPTIONS = ("qwz", "hpz", "qgz")
WEIGHT_BITS = 8
"""qwZ's weights: int8 (§3.1)."""


@dataclass(frozen=True, kw_only=True)
class ZeroPP:
    """Which ZeRO++ options run, over node blocks of `partition` dp ranks."""

    qwz: bool = False
    hpz: bool = False
    qgz: bool = False
    partition: int = 1
    """dp ranks per block (hpZ's secondary partition and qgZ's first hop): one node's share."""
    grad_bits: int = 4
    """qgZ's gradient codes: 4 (the paper's) or 8 bits."""
    block: int = DEFAULT_BLOCK
    """Values per fp32 scale."""

    def __post_init__(self) -> None:
        if not isinstance(self.partition, int) or self.partition < 1:
            raise ValueError(f"ZeRO++ partition must be an integer >= 1, got {self.partition!r}")
        if self.grad_bits not in BITS:
            raise ValueError(f"qgZ gradient bits {self.grad_bits!r}; allowed: {', '.join(map(str, BITS))}")
        levels(self.grad_bits)
        if not isinstance(self.block, int) or self.block < 2 or self.block % 2:
            raise ValueError(f"quantization block {self.block!r}; allowed: an even number of values >= 2")

    @classmethod
    def parse(cls, text: str, **fields) -> "ZeroPP":
        """'qwz,hpz,qgz' (any subset, any order) -> ZeroPP; one-line error otherwise."""
        names = [t.strip() for t in text.split(",") if t.strip()]
        wrong = [t for t in names if t not in OPTIONS]
        if wrong or not names:
            raise ValueError(f"ZeRO++ options {text!r}: allowed a comma list of {', '.join(OPTIONS)}")
        return cls(**{n: True for n in names}, **fields)

    @property
    def on(self) -> tuple[str, ...]:
        return tuple(n for n in OPTIONS if getattr(self, n))

    def blocks(self, dp: int) -> int:
        """Node blocks N of the dp group; raises when `partition` does not divide it."""
        if dp % self.partition:
            raise ValueError(f"ZeRO++ partition {self.partition} does not divide the {dp} data-parallel "
                             "ranks; it must divide them (one node's share of the dp group)")
        return dp // self.partition


def bucket_calls(cfg: ZeroPP, numel: int, root: bool, dp: int, itemsize: int,
                 micro_batches: int) -> list[tuple[str, Call]]:
    """(group, call) of one bucket of `numel` elements (padded here to a multiple of `dp`) in one
    step; group is "dp", "dp_node" or "dp_cross" (see the module doc). Each call is of the kind of
    the ZeRO-3 collective it replaces; a call on a group of one rank moves nothing and is left out."""
    h = cfg.partition
    nodes = cfg.blocks(dp)
    n, s, m = padded_numel(numel, dp), shard_numel(numel, dp), micro_batches
    grad, fwd, bwd = ZERO3.collectives

    def gather(kind: str) -> tuple[str, Call]:
        if cfg.qwz:
            return "dp", Call("all_gather", dp * quantized_bytes(s, WEIGHT_BITS, cfg.block), 1, m, kind)
        return "dp", Call("all_gather", n, itemsize, m, kind)

    out = [gather(fwd.kind)]
    if not root:                                   # the root stays gathered through backward
        out.append(("dp_node", Call("all_gather", n, itemsize, m, bwd.kind)) if cfg.hpz else gather(bwd.kind))
    if cfg.qgz:
        out.append(("dp_node", Call("all_to_all", h * quantized_bytes(nodes * s, cfg.grad_bits, cfg.block), 1, m,
                                    grad.kind)))
        out.append(("dp_cross", Call("all_to_all", nodes * quantized_bytes(s, cfg.grad_bits, cfg.block), 1, m,
                                     grad.kind)))
    else:
        out.append(("dp", Call("reduce_scatter", n, itemsize, m, grad.kind)))
    sizes = {"dp": dp, "dp_node": h, "dp_cross": nodes}
    return [c for c in out if sizes[c[0]] > 1]


def calls(cfg: ZeroPP, buckets: list[tuple[int, bool]], dp: int, itemsize: int,
          micro_batches: int) -> list[tuple[str, Call]]:
    """Every bucket's (group, call) of one step, then the norm's all-reduce of one fp32 over dp."""
    out = [c for numel, root, *_ in buckets for c in bucket_calls(cfg, numel, root, dp, itemsize, micro_batches)]
    return out + ([("dp", NORM_CALL)] if dp > 1 else [])


def secondary_bytes(cfg: ZeroPP, buckets: list[tuple[int, bool]], dp: int, itemsize: int) -> int:
    """hpZ's secondary copy held per rank: 1/partition of every layer bucket (the root never needs one)."""
    if not cfg.hpz:
        return 0
    return sum(padded_numel(numel, dp) // cfg.partition * itemsize for numel, root, *_ in buckets if not root)


def group_members(cfg: ZeroPP, group: str, dp_members: tuple[int, ...], dp_rank: int) -> tuple[int, ...]:
    """The ranks of `dp_rank`'s "dp", "dp_node" or "dp_cross" group, from its dp group's ranks in dp order."""
    h = cfg.partition
    if group == "dp":
        return dp_members
    if group == "dp_node":
        j = dp_rank // h
        return dp_members[j * h:(j + 1) * h]
    return dp_members[dp_rank % h::h]


def group_index(cfg: ZeroPP, group: str, dp_rank: int) -> int:
    """`dp_rank`'s index in its "dp", "dp_node" or "dp_cross" group."""
    return {"dp": dp_rank, "dp_node": dp_rank % cfg.partition, "dp_cross": dp_rank // cfg.partition}[group]


def phi_ratio(cfg: ZeroPP, itemsize: int = 2) -> float:
    """Cross-node bytes per element per step relative to ZeRO-3's 3Φ in `itemsize`-byte values, for
    a large bucket spread over many nodes (the paper's 0.75Φ / 3Φ = 0.25 with all three at 16 bits,
    plus the scales)."""
    scale = 4 / cfg.block
    fwd = (WEIGHT_BITS / 8 + scale) if cfg.qwz else itemsize
    bwd = 0.0 if cfg.hpz else fwd
    grad = (cfg.grad_bits / 8 + scale) if cfg.qgz else itemsize
    return (fwd + bwd + grad) / (3 * itemsize)
