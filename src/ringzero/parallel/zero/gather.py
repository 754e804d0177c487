"""How ZeRO-3 turns every rank's shard of a bucket into its full weights: the gather policies.

    AllGather           the shards all-gathered as they are (ZeRO-3, Rajbhandari et al. 2020 §5.3)
    QuantizedAllGather  qwZ: each shard sent as int8 codes plus one fp32 scale per block, in one
                        packed uint8 buffer; every rank dequantizes every piece, its own included,
                        so the ranks compute with identical weights (ZeRO++, Wang et al. 2023 §3.1)
    Secondary           hpZ: the gathered forward weights leave a secondary copy sharded over the
                        node block (`dp_node` group, H ranks), from which the backward all-gather
                        runs inside the node (ZeRO++ §3.2): one persistent (padded/H,) buffer per
                        layer bucket, refreshed by each forward

A policy's `gather(g, src)` runs on the communication thread with `src`, this rank's (shard,)
weights on the device as the shard store loaded them, and returns the (padded,) bucket; the buffer
being filled is `g.landing` meanwhile, so that transient memory counts it.
"""

from __future__ import annotations

import torch

from ringzero import comm
from ringzero.parallel.flat_group import FlatGroup, nbytes
from ringzero.parallel.quantize import dequantize, pack, quantize, unpack
from ringzero.parallel.topology import Topology
from ringzero.plan.strategies.zeropp import WEIGHT_BITS


class AllGather:
    """The shards all-gathered over the dp group, exactly."""

    def __init__(self, topology: Topology, algorithm: str) -> None:
        self.topology, self.algorithm = topology, algorithm

    def gather(self, g: FlatGroup, src: torch.Tensor) -> torch.Tensor:
        b = g.bucket
        if self.topology.dp == 1:
            return src.clone()
        full = torch.empty(b.padded, dtype=b.dtype, device=b.device)    # every element is overwritten
        g.landing = full
        comm.all_gather_into_tensor(full, src, group=self.topology.group, algorithm=self.algorithm)
        return full


class QuantizedAllGather:
    """qwZ (see the module doc), blocks of `block` values."""

    def __init__(self, topology: Topology, algorithm: str, block: int) -> None:
        self.topology, self.algorithm, self.block = topology, algorithm, block

    def gather(self, g: FlatGroup, src: torch.Tensor) -> torch.Tensor:
        b, dp = g.bucket, self.topology.dp
        mine = pack(quantize(src, WEIGHT_BITS, self.block))
        got = torch.empty(dp * mine.numel(), dtype=torch.uint8)
        full = torch.empty(b.padded, dtype=b.dtype)
        g.landing = full
        comm.all_gather_into_tensor(got, mine, group=self.topology.group, algorithm=self.algorithm)
        for r, piece in enumerate(got.view(dp, -1)):
            dequantize(unpack(piece, b.shard, WEIGHT_BITS, self.block), out=full[r * b.shard:(r + 1) * b.shard])
        return full


class Secondary:
    """hpZ (see the module doc) over node blocks of `partition` dp ranks, for the layer buckets of
    `groups` (the root is kept from its forward to its reduction, so never gathered in backward)."""

    def __init__(self, groups: list[FlatGroup], topology: Topology, algorithm: str, partition: int) -> None:
        self.topology, self.algorithm, self.partition = topology, algorithm, partition
        local = topology.dp_rank % partition
        self.copies: dict[int, torch.Tensor] = {}      # bucket index -> (padded/H,)
        self.at: dict[int, slice] = {}                 # its place in the bucket
        for g in groups:
            if not g.root:
                n = g.bucket.padded // partition
                self.copies[g.index] = torch.zeros(n, dtype=g.bucket.dtype)
                self.at[g.index] = slice(local * n, (local + 1) * n)

    def serves(self, g: FlatGroup) -> bool:
        """Whether `g`'s backward gather runs from the secondary copy."""
        return g.index in self.copies

    def keep(self, g: FlatGroup, full: torch.Tensor) -> None:
        """Refresh `g`'s secondary copy from its gathered (padded,) weights."""
        if g.index in self.copies:
            self.copies[g.index].copy_(full[self.at[g.index]])

    def gather(self, g: FlatGroup) -> torch.Tensor:
        """The backward all-gather of the secondary copies, inside the node block."""
        full = torch.empty(g.bucket.padded, dtype=g.bucket.dtype)
        g.landing = full
        if self.partition == 1:
            full.copy_(self.copies[g.index])
        else:
            comm.all_gather_into_tensor(full, self.copies[g.index], group=self.topology.dp_node_group,
                                        algorithm=self.algorithm)
        return full

    def held_bytes(self) -> int:
        return nbytes(self.copies.values())
