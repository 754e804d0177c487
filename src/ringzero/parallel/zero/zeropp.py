"""ZeRO++ (Wang et al. 2023): ZeRO-3 whose collectives cross nodes less, each option a policy of the
one `plan.strategies.zeropp.ZeroPP` (the planner prices the same calls from it).

    qwZ  the forward all-gather (and the backward one, where hpZ does not replace it) sends each
         rank's shard as int8 codes plus one fp32 scale per block (one packed uint8 buffer), and every
         rank dequantizes every piece, its own included, so the ranks compute with identical weights
         (§3.1).
    hpZ  the gathered forward weights leave a secondary copy sharded over the node block (`dp_node`
         group, H ranks): the backward all-gather runs on that group, inside the node (§3.2). The
         copy is a persistent buffer of padded/H values per layer bucket, refreshed by each forward.
    qgZ  a bucket's gradient (n,) viewed as (N, H, s), dp rank j·H + l owning row (j, l): hop 1
         all-to-all inside the block sends slice [:, l', :] (N·s values) to local rank l', quantized;
         each rank sums the H pieces it receives in fp32; hop 2 all-to-all across blocks sends row j
         of that sum (s values) to block j, quantized; the N pieces received sum to this rank's shard
         (§3.3, "hierarchical all-to-all"). Every bucket splits this way: it is padded to a multiple
         of the dp ranks (`flat.FlatBucket`) and an int4 piece of odd length packs its last code
         alone, so no bucket falls back to the plain reduce-scatter (DeepSpeed's does when a
         tensor is not a multiple of twice the ranks).
"""

from __future__ import annotations

import torch

from ringzero import comm
from ringzero.plan.strategies.zeropp import WEIGHT_BITS, ZeroPP
from ringzero.parallel.flat_group import FlatGroup
from ringzero.parallel.quantize import dequantize, pack, quantize, unpack
from ringzero.parallel.zero.zero3 import ZeRO3


class ZeROPlusPlus(ZeRO3):
    """ZeRO-3 with the ZeRO++ options of `config.zeropp` over `topology`'s node blocks."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.zpp: ZeroPP = self.config.zeropp
        self.nodes = self.zpp.blocks(self.topology.dp)
        self._piece: torch.Tensor | None = None     # qgZ's reused buffer for hop 1's strided pieces
        h, local = self.zpp.partition, self.topology.dp_rank % self.zpp.partition
        for g in self.groups:           # hpZ's secondary shard of each layer bucket, (padded/H,)
            n = g.bucket.padded // h
            g.secondary = torch.zeros(n, dtype=g.bucket.dtype) if self.zpp.hpz and not g.root else None
            g.secondary_at = slice(local * n, (local + 1) * n)

    # -- weights --------------------------------------------------------------------------------
    def _gather_for(self, g: FlatGroup, backward: bool):
        if backward and g.secondary is not None:
            return self._gather_secondary
        return self._gather_quantized if self.zpp.qwz else self._gather_keep_secondary

    def _gather_keep_secondary(self, g: FlatGroup) -> torch.Tensor:
        full = self._gather(g)
        self._keep_secondary(g, full)
        return full

    def _keep_secondary(self, g: FlatGroup, full: torch.Tensor) -> None:
        if g.secondary is not None:
            g.secondary.copy_(full[g.secondary_at])

    def _gather_quantized(self, g: FlatGroup) -> torch.Tensor:
        """qwZ: all-gather int8 shards, dequantize every piece into the full bucket."""
        b, dp = g.bucket, self.topology.dp
        mine = pack(quantize(g.shard, WEIGHT_BITS, self.zpp.block))
        got = torch.empty(dp * mine.numel(), dtype=torch.uint8)
        full = torch.empty(b.padded, dtype=b.dtype)
        g.landing = full
        comm.all_gather_into_tensor(got, mine, group=self.group, algorithm=self._algorithm("all_gather"))
        for r, piece in enumerate(got.view(dp, -1)):
            dequantize(unpack(piece, b.shard, WEIGHT_BITS, self.zpp.block), out=full[r * b.shard:(r + 1) * b.shard])
        self._keep_secondary(g, full)
        return full

    def _gather_secondary(self, g: FlatGroup) -> torch.Tensor:
        """hpZ: the backward all-gather of the secondary shards, inside the node block."""
        full = torch.empty(g.bucket.padded, dtype=g.bucket.dtype)
        g.landing = full
        if self.zpp.partition == 1:
            full.copy_(g.secondary)
        else:
            comm.all_gather_into_tensor(full, g.secondary, group=self.topology.dp_node_group,
                                        algorithm=self._algorithm("all_gather"))
        return full

    # -- gradients ------------------------------------------------------------------------------
    def _reduce(self, g: FlatGroup) -> None:
        if not self.zpp.qgz or self.topology.dp == 1:
            return super()._reduce(g)
        g.add_reduced_shard(self.reduce_quantized(g.grad_flat).to(g.bucket.dtype))
        g.grad_flat = None
        if g.root:
            g.release()

    def reduce_quantized(self, grad: torch.Tensor) -> torch.Tensor:
        """qgZ's two hops (see the module doc) of a (n,) gradient: this rank's summed (n/dp,) shard, fp32."""
        h, nodes = self.zpp.partition, self.nodes
        rows = grad.view(nodes, h, -1)                                       # (N, H, s)
        s = rows.shape[-1]
        if h > 1:                                                            # (N·s,) summed over the block
            partial = self._hop([self._packed(rows[:, k]) for k in range(h)], nodes * s, self.topology.dp_node_group)
        else:
            partial = rows[:, 0].float().reshape(-1)
        if nodes > 1:
            return self._hop([self._packed(row) for row in partial.view(nodes, s)], s, self.topology.dp_cross_group)
        return partial

    def _packed(self, piece: torch.Tensor) -> torch.Tensor:
        """`piece` quantized and packed. A strided piece (hop 1's (N, s) slice) is first copied into
        one reused contiguous buffer: a fresh one would page-fault on every call, costing more than
        the copy."""
        if not piece.is_contiguous():
            buf = self._piece
            if buf is None or buf.dtype != piece.dtype or buf.numel() < piece.numel():
                buf = self._piece = torch.empty(piece.numel(), dtype=piece.dtype)
            piece = buf[:piece.numel()].view(piece.shape).copy_(piece)
        return pack(quantize(piece, self.zpp.grad_bits, self.zpp.block))

    def _hop(self, sends: list[torch.Tensor], numel: int, group) -> torch.Tensor:
        """All-to-all of packed pieces `sends` (one per group rank, `numel` values each); the fp32
        sum of the pieces that arrive."""
        recvs = [torch.empty_like(sends[0]) for _ in sends]
        comm.all_to_all(recvs, sends, group=group, algorithm=self._algorithm("all_to_all"))
        total = torch.zeros(numel, dtype=torch.float32)
        for r in recvs:                    # summed in rank order: the same rounding on every rank
            dequantize(unpack(r, numel, self.zpp.grad_bits, self.zpp.block), out=total, add=True)
        return total

    # -- accounting -----------------------------------------------------------------------------
    def held_bytes(self) -> dict[str, int]:
        held = super().held_bytes()
        held["secondary"] = sum(g.secondary.numel() * g.secondary.element_size()
                                for g in self.groups if g.secondary is not None)
        return held
