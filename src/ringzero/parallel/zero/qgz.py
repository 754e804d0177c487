"""qgZ: ZeRO-3's gradient reduce-scatter as ZeRO++'s hierarchical all-to-all of quantized pieces
(Wang et al. 2023 §3.3).

A bucket's gradient (n,) is viewed as (N, H, s), dp rank j·H + l owning row (j, l): hop 1, an
all-to-all inside the node block, sends slice [:, l', :] (N·s values) to local rank l', quantized;
each rank sums the H pieces it receives in fp32; hop 2, an all-to-all across blocks, sends row j of
that sum (s values) to block j, quantized; the N pieces received sum to this rank's shard. Every
bucket splits this way: it is padded to a multiple of the dp ranks (`flat.FlatBucket`) and an int4
piece of odd length packs its last code alone, so no bucket falls back to the plain reduce-scatter
(DeepSpeed's does when a tensor is not a multiple of twice the ranks).
"""

from __future__ import annotations

import torch

from ringzero import comm
from ringzero.parallel.quantize import dequantize, pack, quantize, unpack
from ringzero.parallel.topology import Topology
from ringzero.plan.strategies.zeropp import ZeroPP


class QuantizedReduceScatter:
    """qgZ (see the module doc) with `zpp`'s bits and blocks over `topology`'s dp group."""

    def __init__(self, topology: Topology, zpp: ZeroPP, algorithm: str) -> None:
        self.topology, self.zpp, self.algorithm = topology, zpp, algorithm
        self.nodes = zpp.blocks(topology.dp)
        self._piece: torch.Tensor | None = None     # the reused buffer for hop 1's strided pieces

    def reduce_quantized(self, grad: torch.Tensor) -> torch.Tensor:
        """This rank's summed (n/dp,) shard of the (n,) gradient `grad`, in fp32."""
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
        comm.all_to_all(recvs, sends, group=group, algorithm=self.algorithm)
        total = torch.zeros(numel, dtype=torch.float32)
        for r in recvs:                    # summed in rank order: the same rounding on every rank
            dequantize(unpack(r, numel, self.zpp.grad_bits, self.zpp.block), out=total, add=True)
        return total
