"""The rates an offloaded optimizer step is predicted from, measured on this rank before the first
step (`plan.strategies.offload.OffloadRates`): the device-host copy rate of gradients and weights, and with
NVMe the swap file's own read and write rates (the file the steps use; another file on a virtual
disk can move at a very different rate) and how much the swap I/O and the host update slow each
other down when they share cores (`plan.strategies.swap_pipeline`). The update's rate is the in-run probe's
(`probe.Prober`: the fused AdamW kernel on a shard)."""

from __future__ import annotations

import statistics
import time

import torch

from ringzero.parallel.optimizer import adamw_

COPY_NUMEL = 1 << 22
"""fp32 elements per timed copy (16 MiB: large enough to stream, as one chunk of the update)."""
REPS = 5


def measure(opt) -> dict[str, float]:
    """{"copy_bps"} and, for an NVMe-offloaded optimizer, {"read_bps", "write_bps"} of its file and
    the `interference` of its I/O and the update."""
    src, dst = torch.randn(COPY_NUMEL), torch.empty(COPY_NUMEL)
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    out = {"copy_bps": src.numel() * src.element_size() / statistics.median(times)}
    if hasattr(opt, "probe_disk"):
        disk = opt.probe_disk()
        out.update(read_bps=disk["read_gbps"] * 1e9, write_bps=disk["write_gbps"] * 1e9,
                   **interference(opt, disk))
    return out


def update_load(numel: int):
    """The host's side of a swap step, for the interference probe: one fused AdamW call over `numel`
    fp32 elements of scratch (not the optimizer's states), touched once here."""
    w, g, m, v = (torch.zeros(numel) for _ in range(4))
    step = torch.tensor(1.0)
    kw = dict(lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)

    def load() -> None:
        adamw_(w, g, m, v, step, kw, None, None)
    load()
    return load


def interference(opt, alone: dict, nbytes: int | None = None) -> dict[str, float]:
    """{"io_slowdown", "update_slowdown"}: how many times longer the swap file's I/O takes while
    the update runs (against `alone`, its probe without load), and the update while the I/O runs,
    from one more probe of the same records with a chunk's update looping beside it."""
    load = update_load(opt.chunk_numel)
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        load()
        times.append(time.perf_counter() - t0)
    loaded = opt.probe_disk(nbytes, load)

    def io_s(d: dict) -> float:  # seconds per byte each way: the records read = the records written
        return 1 / d["read_gbps"] + 1 / d["write_gbps"]
    return {"io_slowdown": io_s(loaded) / io_s(alone), "update_slowdown": loaded["load_s"] / statistics.median(times)}
