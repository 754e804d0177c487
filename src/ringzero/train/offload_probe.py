"""The rates an offloaded optimizer step is predicted from, measured on this rank before the first
step (`plan.offload.OffloadRates`): the device-host copy rate of gradients and weights, and with
NVMe the swap file's own read and write rates (the file the steps use; another file on a virtual
disk can move at a very different rate). The update's rate is the in-run probe's
(`probe.Prober`: the fused AdamW kernel on a shard)."""

from __future__ import annotations

import statistics
import time

import torch

from ..plan.offload import OffloadDevice, OffloadRates, update_seconds

COPY_NUMEL = 1 << 22
"""fp32 elements per timed copy (16 MiB: large enough to stream, as one chunk of the update)."""
REPS = 5


def measure(opt) -> dict[str, float]:
    """{"copy_bps"} and, for an NVMe-offloaded optimizer, {"read_bps", "write_bps"} of its file."""
    src, dst = torch.randn(COPY_NUMEL), torch.empty(COPY_NUMEL)
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    out = {"copy_bps": src.numel() * src.element_size() / statistics.median(times)}
    if hasattr(opt, "probe_disk"):
        disk = opt.probe_disk()
        out.update(read_bps=disk["read_gbps"] * 1e9, write_bps=disk["write_gbps"] * 1e9)
    return out


def predicted_update_seconds(device: str, shards: list[int], weight_bytes: int, buffer_count: int,
                             buffer_numel: int, rates: dict, s_per_param: float) -> float:
    """The offloaded update of `shards` at the measured `rates` and the probe's s/param of the kernel."""
    r = OffloadRates(adam_per_s=1 / s_per_param, transfer_bw=rates["copy_bps"],
                     read_bw=rates.get("read_bps", float("inf")), write_bw=rates.get("write_bps", float("inf")))
    return update_seconds(OffloadDevice(device), shards, weight_bytes, buffer_count, buffer_numel, r)
