"""ZeRO-Offload and ZeRO-Infinity for the optimizer: AdamW whose states live in host memory or in a
file on NVMe (Ren et al. 2021 §4; Rajbhandari et al. 2021 §5).

ZeRO-Offload keeps the fp32 master weights, m and v of a rank's shard in host memory and runs the
update on the host: the gradients come down, the updated weights go back up. ZeRO-Infinity moves
the same states to NVMe and streams them through a few host buffers (`nvme_swap.SwapFile`): while
the host updates chunk i, the I/O thread writes chunk i-1 back and reads chunk i+1 ahead, so only
the buffers stay resident.

The arithmetic is `ShardedAdam`'s, chunk by chunk: the same norm, clip coefficient and fused AdamW
kernel (`optimizer.adamw_`), on chunks that start at multiples of 1024 elements, where the
elementwise kernel gives the bits of one call over the shard (`plan.strategies.offload`). So an offloaded run
is bit for bit the run without offload, in fp32 and with 16-bit weights. The master is always a
separate fp32 copy, even for fp32 weights on the host, where the shard itself could serve: one rule
for every device (on a GPU the host needs its own copy to update), and the device shard is only
written. The cost of that choice: 4 bytes per element more off the device with fp32 weights than
`ShardedAdam`'s 8, and one copy back per step.

The code is device-generic: gradients are copied into a host buffer (upcast to fp32 on the way),
updated weights copied back into the device shard (cast to its dtype). On a CUDA machine these move
bytes over PCIe into pinned memory; on a CPU-only machine the "device" is host memory and the same
copies are memcpys. Everything the optimizer allocates is reported as host (or disk) bytes, and
`placement_bytes` / `io_bytes` count the real tensors and file, twinned by `plan.strategies.offload`.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from ringzero.plan.strategies import offload as plan
from ringzero.plan.strategies.offload import Chunk, OffloadDevice, Placement
from ringzero.parallel.offload.config import OffloadConfig
from ringzero.parallel.offload.nvme_swap import SwapFile
from ringzero.parallel.optimizer import AdamConfig, ShardedAdam, adamw_

class CpuOffloadAdam(ShardedAdam):
    """`ShardedAdam` with its fp32 master, m and v in host memory and the update on the host
    (ZeRO-Offload; see the module doc). Same `step`; nothing stays on the device."""

    def __init__(self, weights: list[torch.Tensor], config: AdamConfig, offload: OffloadConfig,
                 sum_over_owners: Callable[[torch.Tensor], None] | None = None,
                 counted: list[list[slice]] | None = None) -> None:
        self.offload = offload
        self.chunks = plan.chunks([w.numel() for w in weights], offload.buffer_numel)
        self.chunk_numel = plan.chunk_numel([w.numel() for w in weights], offload.buffer_numel)
        # Pinned host memory only helps DMA with another device.
        self.pin = offload.pin_memory and weights[0].device.type != "cpu"
        super().__init__(weights, config, sum_over_owners, counted)

    def _host_zeros(self, n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.float32, pin_memory=self.pin)

    def _allocate_state(self) -> None:
        self.master = [self._host_zeros(s.numel()).copy_(s.detach()) for s in self.shards]
        self.exp_avg = [self._host_zeros(s.numel()) for s in self.shards]
        self.exp_avg_sq = [self._host_zeros(s.numel()) for s in self.shards]
        self.staging = self._host_zeros(self.chunk_numel)

    def _update(self, k: Chunk, grads: list[torch.Tensor], w: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                g: torch.Tensor, adam: Callable) -> None:
        """Chunk `k`: gradient down into host buffer `g` (fp32), `adam` on the host `w`, `m`, `v`
        (each of the chunk's length), weights back up into the device shard."""
        part = slice(k.lo, k.lo + k.numel)
        adam(w, g.copy_(grads[k.bucket][part]), m, v)
        self.shards[k.bucket][part].copy_(w)

    def _adam_for(self, divide: float | None, coef: float | None) -> Callable:
        """`adamw_` with this step's arguments bound: (w, g, m, v) -> None."""
        step, kw = self._kernel_args()
        return functools.partial(adamw_, step=step, kw=kw, divide=divide, coef=coef)

    @torch.no_grad()
    def _adam(self, grads: list[torch.Tensor], divide: float | None, coef: float | None) -> None:
        adam = self._adam_for(divide, coef)
        for k in self.chunks:
            part = slice(k.lo, k.lo + k.numel)
            self._update(k, grads, self.master[k.bucket][part], self.exp_avg[k.bucket][part],
                         self.exp_avg_sq[k.bucket][part], self.staging[:k.numel], adam)

    def state_bytes(self) -> int:
        """Optimizer bytes on the device (what `plan.strategies.memory` calls `optimizer`): none."""
        return 0

    def placement_bytes(self) -> dict[str, int]:
        """{"device", "host", "disk"}: bytes of the tensors this optimizer allocated (states and
        staging buffer), all on the host."""
        host = sum(t.nbytes for t in self.master + self.exp_avg + self.exp_avg_sq + [self.staging])
        return Placement(host=host).as_dict()


class NvmeOffloadAdam(CpuOffloadAdam):
    """`ShardedAdam` with its fp32 master, m and v in a swap file under `offload.nvme_path`, streamed
    through `offload.buffer_count` host buffers (ZeRO-Infinity; see the module doc). `rank` names
    the file. `close()` removes it."""

    def __init__(self, weights: list[torch.Tensor], config: AdamConfig, offload: OffloadConfig,
                 sum_over_owners: Callable[[torch.Tensor], None] | None = None,
                 counted: list[list[slice]] | None = None, rank: int = 0) -> None:
        self.rank = rank
        self._io = {"read": 0, "write": 0}
        super().__init__(weights, config, offload, sum_over_owners, counted)

    def _allocate_state(self) -> None:
        o = self.offload
        self.master, self.exp_avg, self.exp_avg_sq = [], [], []
        self.swap = SwapFile(o.nvme_path, f"rank{self.rank}", self.chunks, self.chunk_numel, o.buffer_count,
                             self.pin, o.direct_io)
        slot = self.swap.slots[0]          # the initial state: master = the shard, m = v = 0
        slot.m.zero_()
        slot.v.zero_()
        for k in self.chunks:
            slot.w[:k.numel].copy_(self.shards[k.bucket][k.lo:k.lo + k.numel].detach())
            self.swap.write(k, 0).result()

    def step(self, grads: list[torch.Tensor], divisor: float, loss_scale: float = 1.0,
             lr: float | None = None) -> dict:
        self._io = {"read": 0, "write": 0}          # a skipped step moves nothing
        return super().step(grads, divisor, loss_scale, lr)

    @torch.no_grad()
    def _adam(self, grads: list[torch.Tensor], divide: float | None, coef: float | None) -> None:
        # Chunk i uses slot i mod B. Reads of chunks 0..B-1 are queued first; once chunk i is
        # updated, its write and then the read of chunk i+B into the same slot are queued behind
        # it, so the I/O thread's FIFO order keeps a slot from being refilled before it is written.
        adam, ks, swap, b = self._adam_for(divide, coef), self.chunks, self.swap, len(self.swap.slots)
        reads = {j: swap.read(ks[j], j) for j in range(min(b, len(ks)))}
        writes = []
        for i, k in enumerate(ks):
            s = swap.slots[i % b]
            self._io["read"] += reads.pop(i).result()
            n = k.numel
            self._update(k, grads, s.w[:n], s.m[:n], s.v[:n], s.g[:n], adam)
            writes.append(swap.write(k, i % b))
            if i + b < len(ks):
                reads[i + b] = swap.read(ks[i + b], i % b)
        self._io["write"] += sum(f.result() for f in writes)

    def read_state(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """(master, m, v) of every bucket, read back from the swap file into new host tensors (for a
        checkpoint or a test; between steps, when no I/O is in flight)."""
        out = tuple([torch.empty(s.numel(), dtype=torch.float32) for s in self.shards] for _ in range(3))
        slot = self.swap.slots[0]
        for k in self.chunks:
            self.swap.read(k, 0).result()
            for dst, src in zip(out, (slot.w, slot.m, slot.v)):
                dst[k.bucket][k.lo:k.lo + k.numel].copy_(src[:k.numel])
        return out

    def write_state(self, master: list[torch.Tensor], m: list[torch.Tensor], v: list[torch.Tensor]) -> None:
        """Replace the swap file's (master, m, v) of every bucket (a checkpoint being loaded;
        between steps)."""
        slot = self.swap.slots[0]
        for k in self.chunks:
            for dst, src in zip((slot.w, slot.m, slot.v), (master, m, v)):
                dst[:k.numel].copy_(src[k.bucket][k.lo:k.lo + k.numel])
            self.swap.write(k, 0).result()

    def probe_disk(self, nbytes: int | None = None, load=None) -> dict[str, float]:
        """{"write_gbps", "read_gbps"} of this optimizer's own swap file (`SwapFile.measure`: its
        records, at most `nbytes` of them, read and written back unchanged; between steps). The
        file the steps use: a new file's extents may sit elsewhere and move at other rates. With
        `load`, measured while this thread runs it (and "load_s" is its time per call)."""
        ks = self.chunks if nbytes is None else [k for k in self.chunks if k.offset < nbytes]
        return self.swap.measure(ks, load)

    def placement_bytes(self) -> dict[str, int]:
        """{"device", "host", "disk"}: the swap buffers' allocation, and the swap file's size."""
        return Placement(host=self.swap.host_bytes(), disk=self.swap.disk_bytes()).as_dict()

    def io_bytes(self) -> dict[str, int]:
        """Bytes the latest step read from and wrote to the swap file."""
        return dict(self._io)

    def close(self) -> None:
        """Wait for queued I/O, close and remove the swap file."""
        self.swap.close()


def offloaded_adam(weights: list[torch.Tensor], config: AdamConfig, offload: OffloadConfig,
                   sum_over_owners: Callable[[torch.Tensor], None] | None = None,
                   counted: list[list[slice]] | None = None, rank: int = 0) -> ShardedAdam:
    """The optimizer `offload.device` asks for, over this rank's shards `weights` (the arguments of
    `ShardedAdam`; `rank`: the global rank, naming the nvme swap file)."""
    if offload.device is OffloadDevice.CPU:
        return CpuOffloadAdam(weights, config, offload, sum_over_owners, counted)
    if offload.device is OffloadDevice.NVME:
        return NvmeOffloadAdam(weights, config, offload, sum_over_owners, counted, rank)
    return ShardedAdam(weights, config, sum_over_owners, counted)
