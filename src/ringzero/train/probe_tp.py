"""A tensor-parallel layer as a step runs it, for the probe (`train.probe`): one block of the run's
shape split over the tp group with its collectives (`parallel.tp.tensor_parallel.split_block`).

The probe times the block's arithmetic without them and each collective alone, after a barrier, as
if a layer's collectives cost inside a step what they cost on their own. With more ranks than cores
they do not: a tp collective is a rendezvous of its group, in forward and backward of every layer,
and while one member waits for a peer the scheduler has given its core to, the pair stands still
(ranks block in gloo's receive; gang scheduling, Ousterhout 1982, is what a rendezvous needs). The
tp groups' passes, timed with every rank running its own at once, hold those waits; what they take
beyond the block's arithmetic is what a layer's collectives cost in the step (measured with tp 2 x
dp 2 and sequence parallelism, 4 ranks on 2 cores: waits in the tp collectives alone were 60-86 ms
of a 570 ms step, none of them in the collectives timed alone; `ringzero train --nproc 4 --tp 2
--sequence-parallel --steps 40 --json-report out/tp.json`, whose `probe` holds `tp_layer_comm_s`
beside each collective's seconds alone).
"""

from __future__ import annotations

import torch
from torch import nn

from ringzero.parallel.recompute import apply_recompute
from ringzero.parallel.tp.tensor_parallel import split_block
from ringzero.run.config import TrainConfig


class TPLayerPass:
    """Forward and backward of one tensor-parallel block on one micro-batch, collectives included."""

    def __init__(self, cfg: TrainConfig, topology, dtype: torch.dtype) -> None:
        from ringzero.train.model import AttentionCore, Block
        m = cfg.shape
        torch.manual_seed(0)
        block = Block(m, cfg.model.attention, cfg.model.dropout)
        split_block(block, topology, sequence_parallel=cfg.parallel.sequence_parallel, algorithm=cfg.parallel.tp_algorithm)
        holder = nn.ModuleList([block.to(dtype)])
        apply_recompute(holder, cfg.training.recompute, (AttentionCore,))
        self.block = holder[0]
        seq = m.seq // topology.tp if cfg.parallel.sequence_parallel else m.seq
        self.x = torch.randn(cfg.training.micro_batch, seq, m.hidden).to(dtype).requires_grad_()
        self.grad = torch.randn_like(self.x)           # (b, s or s/t, h), dense as a layer's is

    def __call__(self) -> None:
        self.block.zero_grad(set_to_none=True)
        self.x.grad = None
        self.block(self.x).backward(self.grad)
