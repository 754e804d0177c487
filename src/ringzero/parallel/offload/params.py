"""ZeRO-3's weight shards off the device (ZeRO-Infinity's parameter offload, Rajbhandari et al. 2021
§5): each bucket's flat shard lives in host memory (cpu) or in a swap file (nvme) and comes to the
device only while its layer is all-gathered.

    store = ParamStore(shards, offload, rank)     # copies the shards off; drop the device ones
    store.prefetch(i)                             # start reading bucket i (nvme; a no-op on cpu)
    w = store.load(i)                             # bucket i's shard, a new tensor on the device
    store.store(i, w)                             # its updated value back (after the optimizer)

With nvme, the file holds one record per bucket, its shard in the weights' dtype rounded up to
4 KiB (`plan.strategies.offload.param_record_bytes`), and records move through `buffer_count` host buffers of
the largest record, on the one I/O thread of `nvme_swap.SwapIO`, in the order asked: a load after a
store reads what was stored. A prefetched read holds a buffer until its load; prefetches leave one
buffer to loads and stores, so neither ever waits on a read nobody will collect. A store drops a
pending prefetch of the same bucket, whose bytes it makes stale.

ZeRO-3 uses it through `parallel.offload.shards.OffloadedShards`: gathers all-gather from `load(i)`, each
prefetching the next layer's read; the optimizer's staging shards are loaded before the step and
stored after it.
"""

from __future__ import annotations

import queue
from concurrent.futures import Future

import torch

from ringzero.plan.strategies import offload as plan
from ringzero.plan.strategies.offload import OffloadDevice, Placement
from ringzero.parallel.offload.nvme_swap import SwapIO, aligned_empty
from ringzero.parallel.offload.config import OffloadConfig


class ParamStore:
    """Weight shards `shards` (one flat tensor per bucket) held where `offload.device` says (cpu or
    nvme); `rank` names the swap file. See the module doc."""

    def __init__(self, shards: list[torch.Tensor], offload: OffloadConfig, rank: int = 0) -> None:
        if offload.device is OffloadDevice.NONE:
            raise ValueError("a parameter store needs offload device 'cpu' or 'nvme', not 'none'")
        self.offload, self.numels = offload, [s.numel() for s in shards]
        self.device, self.dtype, self.itemsize = shards[0].device, shards[0].dtype, shards[0].element_size()
        pin = offload.pin_memory and self.device.type != "cpu"
        self._io = {"read": 0, "write": 0}
        self.initial_io = {"read": 0, "write": 0}   # the copy in, before any step (nvme: every record written)
        if offload.device is OffloadDevice.CPU:
            self.host = [torch.empty(s.numel(), dtype=self.dtype, pin_memory=pin).copy_(s.detach().reshape(-1))
                         for s in shards]
            return
        self.records = [plan.param_record_bytes(n, self.itemsize) for n in self.numels]
        self.offsets = [sum(self.records[:i]) for i in range(len(self.records))]
        self.io = SwapIO(offload.nvme_path, f"params-rank{rank}", sum(self.records), offload.direct_io)
        size = max(self.records, default=0)
        self.raw, arena = aligned_empty(offload.buffer_count * size, pin)
        self.buffers = [arena[j * size:(j + 1) * size] for j in range(offload.buffer_count)]
        self.views = [memoryview(b.numpy()) for b in self.buffers]
        self.free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for j in range(offload.buffer_count):
            self.free.put(j)
        self.pending: dict[int, tuple[int, Future]] = {}
        self.writes: list[Future] = []
        for i, s in enumerate(shards):
            self.store(i, s)
        self.flush()
        self.initial_io = dict(self._io)
        self._io["write"] = 0                       # the initial copy is not a step's traffic

    def _shard_view(self, slot: int, i: int) -> torch.Tensor:
        return self.buffers[slot][:self.numels[i] * self.itemsize].view(self.dtype)

    def prefetch(self, i: int) -> None:
        """Start reading bucket `i` into a free buffer (nvme), if one is free beyond the one kept
        for loads and stores, and none is reading it already."""
        if self.offload.device is OffloadDevice.NVME and i not in self.pending and self.free.qsize() > 1:
            self._read(i, self.free.get())

    def _read(self, i: int, slot: int) -> None:
        self.pending[i] = slot, self.io.read([self.views[slot][:self.records[i]]], self.offsets[i])

    def load(self, i: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Bucket `i`'s shard, in `out` (a tensor of its size on the weights' device) or a new one."""
        if out is None:
            out = torch.empty(self.numels[i], dtype=self.dtype, device=self.device)
        if self.offload.device is OffloadDevice.CPU:
            return out.copy_(self.host[i])
        if i not in self.pending:
            self._read(i, self.free.get())
        slot, read = self.pending.pop(i)
        self._io["read"] += read.result()
        out.copy_(self._shard_view(slot, i))
        self.free.put(slot)
        return out

    def store(self, i: int, shard: torch.Tensor) -> None:
        """Keep `shard` as bucket `i`'s value (nvme: queued; `flush` waits for it)."""
        shard = shard.detach().reshape(-1)
        if self.offload.device is OffloadDevice.CPU:
            self.host[i].copy_(shard)
            return
        if i in self.pending:                       # a prefetch of the old value: stale now
            slot, read = self.pending.pop(i)
            read.result()
            self.free.put(slot)
        slot = self.free.get()
        self._shard_view(slot, i).copy_(shard)
        write = self.io.write([self.views[slot][:self.records[i]]], self.offsets[i])
        write.add_done_callback(lambda _, slot=slot: self.free.put(slot))
        self.writes.append(write)

    def flush(self) -> None:
        """Wait for every queued store (nvme)."""
        if self.offload.device is OffloadDevice.NVME:
            self._io["write"] += sum(w.result() for w in self.writes)
            self.writes = []

    def placement_bytes(self) -> dict[str, int]:
        """{"device", "host", "disk"}: the host shards (cpu), or the buffers and the file (nvme);
        a loaded shard belongs to its caller."""
        if self.offload.device is OffloadDevice.CPU:
            return Placement(host=sum(t.nbytes for t in self.host)).as_dict()
        return Placement(host=self.raw.numel(), disk=self.io.disk_bytes()).as_dict()

    def io_bytes(self) -> dict[str, int]:
        """Disk bytes read by loads and written by stores since construction (after a flush)."""
        self.flush()
        return dict(self._io)

    def close(self) -> None:
        """Wait for queued I/O and remove the swap file (nvme)."""
        if self.offload.device is OffloadDevice.NVME:
            self.io.close()
