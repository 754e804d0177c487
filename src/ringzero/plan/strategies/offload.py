"""The offloaded optimizer's twin: where its bytes live, what it moves per step, how long it takes
(ZeRO-Offload, Ren et al. 2021 §4; ZeRO-Infinity, Rajbhandari et al. 2021 §5).

Each bucket's shard (n_b elements) is updated in chunks of C elements,

    C = min(buffer_numel, ⌈max_b n_b⌉_A)        ⌈x⌉_A: x rounded up to A = ALIGN_NUMEL = 1024

and a chunk starts at a multiple of C inside its shard. A = 1024 fp32 = 4 KiB, the block size that
direct I/O needs for file offsets, lengths and buffer addresses. It also keeps the update exact:
torch's CPU fused AdamW runs a vector loop and then a scalar loop over the remainder, and the two
round differently, so a chunk boundary off the vector width (8 or 16 floats) changes the last bits;
at multiples of A every chunk but a shard's last is all vector loop, as in one call over the shard.

The optimizer always keeps its own fp32 master, whatever the weights' precision (as ZeRO-Offload
keeps the fp32 parameters with the optimizer states on the host): 12 bytes per element (master, m,
v; Kingma & Ba 2015) off the device, and the device shard is only written, by the copy back of each
updated chunk. The optimizer holds nothing on the device.

    none   device = 12 Σ n_b with 16-bit weights, 8 Σ n_b with fp32 (the shard is the master)
    cpu    host   = 12 Σ n_b + 4C                   (states; one fp32 gradient staging buffer)
    nvme   host   = B · 16C + ALIGN_BYTES           (B swap buffers of master, m, v and gradient in
                                                     fp32, in one arena aligned for direct I/O)
           disk   = 12 Σ_b ⌈n_b⌉_A                  (one record per chunk: master, m, v, each of
                                                     ⌈length⌉_A elements)
           read per step = write per step = disk    (every record read once and written once)

Time. The host does, for each chunk, in order: copy the gradient to a host buffer (fp32), run the
fused update, copy the weights back (the device↔host "transfer", over PCIe on a GPU machine):

    compute_i = L_i / adam_rate + L_i · 2·weight_bytes / transfer_bw

With cpu the step is Σ compute_i. With nvme one I/O thread runs a FIFO queue: reads of chunks
0..B-1 first, then after compute i ends, the write of chunk i and the read of chunk i+B into the
buffer just written (one queue: a drive is one shared resource; measured on a virtio disk, a read
and a write in flight together move about as many bytes per second as either alone: the nvme
step of `python benchmarks/bench_offload.py`, I/O-bound, against its read and write rates). Chunk i's
compute starts when compute i-1 ends and read i has; the step ends with the last write. That
recurrence (`plan.strategies.swap_pipeline.swap_seconds`) is the three-stage pipeline read i+1 ∥ update i ∥
write i-1 with its fill (the first read) and drain (the last write); in steady state a chunk costs
max(compute_i, read_i + write_i) when the I/O and the update do not compete for cores, and each runs
`io_slowdown` / `update_slowdown` times longer while the other runs when they do.

The rates are measured apart: the disk's by `parallel.offload.nvme_swap.probe_disk` (a new file, moved in
the swap loop's order and records) or `NvmeOffloadAdam.probe_disk` (the optimizer's own file: on a
virtual disk two files can move at rates 3x apart, so only the file the steps use predicts them);
adam_rate by one fused call over a shard; transfer_bw by the two copies; the two slowdowns by running
the disk probe and the update together (on a 2-core VM the I/O ran about 1.8x slower while the
update used both cores; without them the model predicted an I/O-bound step 10-25 % short there;
`python benchmarks/bench_offload.py` prints both files' rates, the two slowdowns and the nvme
prediction with and without them).
Not modelled: a page cache (without direct I/O the "disk" is a memcpy that competes with the update
for the cores).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence

from ringzero.plan.hardware import Hardware
from ringzero.plan.step_time import CPU_ADAM_PARAMS_PER_S
from ringzero.plan.strategies.swap_pipeline import swap_seconds

ALIGN_NUMEL = 1024
"""Chunk boundaries, buffer sizes and file records are multiples of this many fp32 elements."""
ALIGN_BYTES = 4 * ALIGN_NUMEL
STATE_KINDS = 3
"""fp32 tensors of optimizer state per element: master, m, v."""
SLOT_KINDS = 4
"""fp32 tensors per swap buffer: master, m, v and the gradient chunk."""
FP32 = 4
DEFAULT_BUFFER_NUMEL = 1 << 22
"""4M elements per chunk: 16 MiB per state kind, a 48 MiB record per read or write (large requests
keep a drive near its streaming bandwidth: measured on a virtio disk with direct I/O, 4 MiB requests
moved 0.7-0.9 GB/s, 16 MiB ones 1.6-1.8 GB/s: the disk rates of `python benchmarks/bench_offload.py
--buffer-numel 1048576` and of `--buffer-numel 4194304`)."""


class OffloadDevice(enum.Enum):
    """Where the optimizer's states live (the one list of choices)."""

    NONE = "none"
    """On the device, beside the weights (`ShardedAdam`)."""
    CPU = "cpu"
    """In host memory; the host runs the update (ZeRO-Offload)."""
    NVME = "nvme"
    """In a file; streamed through host buffers chunk by chunk (ZeRO-Infinity)."""


def round_up(n: int, a: int = ALIGN_NUMEL) -> int:
    return -(-n // a) * a


@dataclass(frozen=True)
class Chunk:
    """One piece of the update: elements [lo, lo + numel) of bucket `bucket`'s shard, whose state
    is the file record at byte `offset`, of `record_numel` elements per kind."""

    bucket: int
    lo: int
    numel: int
    offset: int

    @property
    def record_numel(self) -> int:
        return round_up(self.numel)

    @property
    def record_bytes(self) -> int:
        return STATE_KINDS * FP32 * self.record_numel


def chunk_numel(shards: Sequence[int], buffer_numel: int) -> int:
    """C of the module doc: elements per chunk (and per buffer kind)."""
    return min(buffer_numel, round_up(max(shards, default=0)))


def chunks(shards: Sequence[int], buffer_numel: int) -> list[Chunk]:
    """Every chunk of a step, in update order (bucket by bucket), with its file record."""
    c, out, offset = chunk_numel(shards, buffer_numel), [], 0
    for b, n in enumerate(shards):
        for lo in range(0, n, c):
            out.append(Chunk(b, lo, min(c, n - lo), offset))
            offset += out[-1].record_bytes
    return out


@dataclass(frozen=True)
class Placement:
    """Optimizer bytes by location."""

    device: int = 0
    host: int = 0
    disk: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"device": self.device, "host": self.host, "disk": self.disk}


def placement(device: OffloadDevice, shards: Sequence[int], weight_bytes: int, buffer_count: int,
              buffer_numel: int) -> Placement:
    """The module doc's bytes for shards of `shards` elements and weights of `weight_bytes` each."""
    n, c = sum(shards), chunk_numel(shards, buffer_numel)
    if device is OffloadDevice.NONE:
        return Placement(device=(STATE_KINDS if weight_bytes != FP32 else STATE_KINDS - 1) * FP32 * n)
    if device is OffloadDevice.CPU:
        return Placement(host=STATE_KINDS * FP32 * n + FP32 * c)
    return Placement(host=buffer_count * SLOT_KINDS * FP32 * c + ALIGN_BYTES,
                     disk=sum(k.record_bytes for k in chunks(shards, buffer_numel)))


def io_per_step(device: OffloadDevice, shards: Sequence[int], buffer_numel: int) -> dict[str, int]:
    """Disk bytes read and written by one optimizer step (a skipped step moves none)."""
    moved = sum(k.record_bytes for k in chunks(shards, buffer_numel)) if device is OffloadDevice.NVME else 0
    return {"read": moved, "write": moved}


@dataclass(frozen=True, kw_only=True)
class OffloadRates:
    """The rates the time model needs, each measurable alone."""

    adam_per_s: float
    """Elements per second of the fused AdamW update on the host."""
    transfer_bw: float
    """Bytes/s of the device↔host copies of gradients and weights (PCIe on a GPU machine)."""
    read_bw: float = math.inf
    """Bytes/s read from the swap file."""
    write_bw: float = math.inf
    """Bytes/s written to the swap file."""
    io_slowdown: float = 1.0
    """How many times longer a swap file transfer takes while the host update runs (cores shared
    by the I/O thread and the update; 1: none shared, the planner's assumption)."""
    update_slowdown: float = 1.0
    """How many times longer the host update takes while the swap file I/O runs."""

    def __post_init__(self) -> None:
        for k in ("adam_per_s", "transfer_bw", "read_bw", "write_bw", "io_slowdown", "update_slowdown"):
            if not getattr(self, k) > 0:
                raise ValueError(f"offload rate {k} must be > 0, got {getattr(self, k)}")

    @classmethod
    def for_hardware(cls, hw: Hardware) -> OffloadRates:
        """The coarse planner's assumptions: `CPU_ADAM_PARAMS_PER_S`, PCIe and NVMe bandwidths."""
        return cls(adam_per_s=CPU_ADAM_PARAMS_PER_S, transfer_bw=hw.pcie_bw, read_bw=hw.nvme_bw,
                   write_bw=hw.nvme_bw)


def update_seconds(device: OffloadDevice, shards: Sequence[int], weight_bytes: int, buffer_count: int,
                   buffer_numel: int, rates: OffloadRates) -> float:
    """Predicted seconds of the update part of an optimizer step (after the norm): the fused
    update alone without offload, the serial chunk loop with cpu, the swap pipeline with nvme."""
    if device is OffloadDevice.NONE:
        return sum(shards) / rates.adam_per_s
    ks = chunks(shards, buffer_numel)
    compute = [k.numel / rates.adam_per_s + 2 * weight_bytes * k.numel / rates.transfer_bw for k in ks]
    if device is OffloadDevice.CPU:
        return sum(compute)
    return swap_seconds([k.record_bytes / rates.read_bw for k in ks], compute,
                        [k.record_bytes / rates.write_bw for k in ks], buffer_count, rates.io_slowdown,
                        rates.update_slowdown)


# -- ZeRO-3 weight shards off the device (`parallel.offload.params.ParamStore`) ------------------
def param_record_bytes(numel: int, weight_bytes: int) -> int:
    """Bytes of one bucket's weight shard in the parameter swap file: ⌈numel · weight_bytes⌉ to 4 KiB."""
    return round_up(numel * weight_bytes, ALIGN_BYTES)


def param_placement(device: OffloadDevice, shards: Sequence[int], weight_bytes: int,
                    buffer_count: int) -> Placement:
    """Bytes by location of a parameter store over shards of `shards` elements: cpu keeps every
    shard in host memory (Σ n_b · weight_bytes); nvme keeps them in one file of 4 KiB-aligned
    records and moves them through `buffer_count` host buffers of the largest record."""
    if device is OffloadDevice.NONE:
        return Placement(device=sum(shards) * weight_bytes)
    if device is OffloadDevice.CPU:
        return Placement(host=sum(shards) * weight_bytes)
    records = [param_record_bytes(n, weight_bytes) for n in shards]
    return Placement(host=buffer_count * max(records, default=0) + ALIGN_BYTES, disk=sum(records))


def param_io_per_step(device: OffloadDevice, buckets: Sequence[tuple[int, bool]], weight_bytes: int,
                      micro_batches: int, secondary: bool = False) -> dict[str, int]:
    """Disk bytes one step of ZeRO-3 with its weight shards on NVMe moves (none with cpu or none).
    `buckets`: (shard elements, is the root bucket) of each bucket. Per micro-batch a layer's record
    is read before its forward all-gather and again before its backward one (ZeRO-3 frees a layer
    after its forward) unless a `secondary` copy on the device serves the backward gathers (ZeRO++'s
    hpZ, Wang et al. 2023 §3.2), the root's once (it is kept from its forward to its gradients'
    reduction); then every record is read once before the update (the optimizer updates a device
    copy of each shard) and written once after it:

        read  = m · (Σ_root r_b + k Σ_layers r_b) + Σ_b r_b        r_b = param_record_bytes(n_b)
        write = Σ_b r_b                                             m: micro-batches per step,
                                                                    k = 1 with hpZ, else 2
    """
    if device is not OffloadDevice.NVME:
        return {"read": 0, "write": 0}
    records = [(param_record_bytes(n, weight_bytes), root) for n, root, *_ in buckets]
    k = 1 if secondary else 2
    per_micro = sum(r if root else k * r for r, root in records)
    total = sum(r for r, _ in records)
    return {"read": micro_batches * per_micro + total, "write": total}
