"""What offloading the optimizer costs per step, measured and predicted by `plan.strategies.offload`.

One fp32 shard of `--numel` elements (32M by default) is stepped by `ShardedAdam` (none), by the
host-memory optimizer (cpu, ZeRO-Offload) and by the NVMe one (nvme, ZeRO-Infinity, its swap file
under `--path`). Every round also measures the rates the planner needs, each alone: the disk's
read and write bandwidth in the swap loop's records and order, twice (`NvmeOffloadAdam.probe_disk`
on the optimizer's own swap file, and `probe_disk` on a new file: on a virtual disk two files can
move at rates 3x apart), how much the I/O and the update slow each other down when run together
(`train.offload_probe.interference`: the probe again with a chunk's update looping beside it), the
fused AdamW rate (one call over the shard, as `ShardedAdam` runs it)
and the host copies of the gradient down and the weights back (`transfer_bw`). The modes and the
probes are interleaved round by round, so that a shared machine's drift hits all alike; each
figure is the median over the rounds.

Printed: the median step of each mode, the measured overhead of cpu and nvme over none beside
`plan.strategies.offload.update_seconds`' prediction from the median rates (nvme: with each disk probe), and
the relative error (measured - predicted) / predicted. With direct I/O (the default) the swap file
bypasses this machine's page cache, so the drive itself is measured; a virtual disk's host may
still cache.

    python benchmarks/bench_offload.py
    python benchmarks/bench_offload.py --numel 8e6 --rounds 3 --path /mnt/nvme
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from ringzero import outputs
from ringzero.errors import UsageError
from ringzero.parallel.offload.nvme_swap import probe_disk
from ringzero.parallel.offload.optimizer import OffloadConfig, check_offload, offloaded_adam
from ringzero.parallel.optimizer import AdamConfig, adamw_
from ringzero.plan.strategies import offload as plan
from ringzero.plan.strategies.offload import DEFAULT_BUFFER_NUMEL, OffloadDevice, OffloadRates
from ringzero.train.offload_probe import interference

MODES = [d.value for d in OffloadDevice]
ADAM = AdamConfig(lr=1e-3, weight_decay=0.1)


class Rates:
    """The planner's rates, measured alone on tensors of the benchmark's size (allocated and
    touched once, so no call pays for first-touch page faults)."""

    def __init__(self, n: int, path: str, offload: OffloadConfig, probe_bytes: int) -> None:
        self.n, self.path, self.offload, self.probe_bytes = n, path, offload, probe_bytes
        self.w, self.g, self.m, self.v = (torch.zeros(n) for _ in range(4))
        self.stage = torch.zeros(plan.chunk_numel([n], offload.buffer_numel))
        self.kw = dict(lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)

    def __call__(self, swapper) -> dict[str, float]:
        """Disk (the optimizer's own swap file, and a new file), fused AdamW, host copies."""
        n, o = self.n, self.offload
        own = swapper.probe_disk(self.probe_bytes)
        shared = interference(swapper, own, self.probe_bytes)
        new = probe_disk(self.path, self.probe_bytes, o.buffer_numel, o.buffer_count, o.direct_io)
        t0 = time.perf_counter()
        adamw_(self.w, self.g, self.m, self.v, torch.tensor(1.0), self.kw, None, None)
        adam_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for k in plan.chunks([n], o.buffer_numel):
            part = slice(k.lo, k.lo + k.numel)
            self.stage[:k.numel].copy_(self.g[part])          # the gradient down
            self.w[part].copy_(self.m[part])                  # the weights back, from memory as cold
                                                              # as the master after an update
        copy_s = time.perf_counter() - t0
        return {"read_bw": own["read_gbps"] * 1e9, "write_bw": own["write_gbps"] * 1e9,
                "new_read_bw": new["read_gbps"] * 1e9, "new_write_bw": new["write_gbps"] * 1e9,
                "adam_per_s": n / adam_s, "transfer_bw": 2 * 4 * n / copy_s, **shared}


def run_rounds(n: int, configs: dict[str, OffloadConfig], rounds: int, probe_bytes: int) -> dict:
    """Step every mode once per round (the order alternating), measuring the rates before each
    round; round 0 warms every path up and is dropped."""
    nvme = configs["nvme"]
    grad = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 1e-2
    opts = {m: offloaded_adam([torch.randn(n)], ADAM, configs[m]) for m in MODES}
    times: dict[str, list[float]] = {m: [] for m in MODES}
    rates, measure = [], Rates(n, nvme.nvme_path, nvme, probe_bytes)
    try:
        for r in range(rounds + 1):
            rates.append(measure(opts["nvme"]))
            for m in (MODES if r % 2 else MODES[::-1]):
                g = [grad.clone()]
                t0 = time.perf_counter()
                opts[m].step(g, divisor=1.0)
                times[m].append(time.perf_counter() - t0)
        placed, io = {m: o.placement_bytes() for m, o in opts.items()}, opts["nvme"].io_bytes()
    finally:
        for o in opts.values():
            o.close()
    assert placed["nvme"] == nvme.needs([n], 4).as_dict()
    assert io == plan.io_per_step(nvme.device, [n], nvme.buffer_numel)
    return {"times": {m: t[1:] for m, t in times.items()}, "rates": rates[1:], "placement": placed, "io": io}


def report(n: int, configs: dict[str, OffloadConfig], run: dict) -> dict:
    """Print the medians, the measured overheads over none and the planner's, and their errors."""
    med = {m: statistics.median(t) for m, t in run["times"].items()}
    rate = {k: statistics.median(r[k] for r in run["rates"]) for k in run["rates"][0]}
    host = dict(adam_per_s=rate["adam_per_s"], transfer_bw=rate["transfer_bw"])
    shared = dict(io_slowdown=rate["io_slowdown"], update_slowdown=rate["update_slowdown"])
    disks = {"own file, shared cores": OffloadRates(read_bw=rate["read_bw"], write_bw=rate["write_bw"], **host, **shared),
             "own file": OffloadRates(read_bw=rate["read_bw"], write_bw=rate["write_bw"], **host),
             "new file": OffloadRates(read_bw=rate["new_read_bw"], write_bw=rate["new_write_bw"], **host)}
    nvme, io, placed = configs["nvme"], run["io"], run["placement"]["nvme"]
    print(f"shard {n:,} fp32 elements; chunks of {plan.chunk_numel([n], nvme.buffer_numel):,}, {nvme.buffer_count} "
          f"buffers, direct I/O {'on' if nvme.direct_io else 'off'}; medians of {len(run['rates'])} rounds")
    print(f"rates: disk read / write {rate['read_bw'] / 1e9:.2f} / {rate['write_bw'] / 1e9:.2f} GB/s (own swap file), "
          f"{rate['new_read_bw'] / 1e9:.2f} / {rate['new_write_bw'] / 1e9:.2f} GB/s (new file); fused AdamW "
          f"{rate['adam_per_s'] / 1e6:.0f} M elements/s; host copies {rate['transfer_bw'] / 1e9:.2f} GB/s; "
          f"beside each other the I/O takes {rate['io_slowdown']:.2f}x, the update {rate['update_slowdown']:.2f}x")
    print(f"nvme: host {placed['host'] / 2**20:.0f} MiB, disk {placed['disk'] / 2**20:.0f} MiB; "
          f"read {io['read'] / 2**20:.0f} + write {io['write'] / 2**20:.0f} MiB per step (= plan.offload)")
    print(f"{'mode':6} {'step s':>7} {'overhead s':>11} {'predicted s':>12} {'error':>7}  disk rates from")
    print(f"{'none':6} {med['none']:7.3f}")
    rows = []
    for m, disk in (("cpu", "own file"), ("nvme", "own file, shared cores"), ("nvme", "own file"), ("nvme", "new file")):
        def seconds(mode: str) -> float:
            c = configs[mode]
            return plan.update_seconds(c.device, [n], 4, c.buffer_count, c.buffer_numel, disks[disk])
        over, pred = med[m] - med["none"], seconds(m) - seconds("none")
        rows.append({"mode": m, "disk_rates": disk, "step_s": med[m], "overhead_s": over,
                     "predicted_overhead_s": pred, "error": (over - pred) / pred})
        print(f"{m:6} {med[m]:7.3f} {over:11.3f} {pred:12.3f} {rows[-1]['error']:+7.1%}  "
              f"{disk if m == 'nvme' else ''}")
    return {"numel": n, "rates": rate, "rows": rows, **run}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=float, default=32e6, help="elements of the fp32 shard")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds (one step of each mode each)")
    p.add_argument("--path", default=None, help="directory of the swap file (default: a temporary one)")
    p.add_argument("--buffer-numel", type=int, default=DEFAULT_BUFFER_NUMEL)
    p.add_argument("--buffer-count", type=int, default=4)
    p.add_argument("--no-direct-io", action="store_true", help="go through the page cache")
    p.add_argument("--probe-mb", type=float, default=None,
                   help="MiB each disk probe moves each way (default: as many as a step, in the same records)")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args(argv)
    if a.json:                      # before the measurement, not after it
        try:
            outputs.check(a.json, "--json")
        except UsageError as e:
            p.error(str(e))
    n = int(a.numel)
    with tempfile.TemporaryDirectory(prefix="bench-offload-", dir=a.path) as path:
        configs = {"none": OffloadConfig(), "cpu": OffloadConfig(device="cpu", buffer_numel=a.buffer_numel),
                   "nvme": OffloadConfig(device="nvme", nvme_path=path, buffer_numel=a.buffer_numel,
                                         buffer_count=a.buffer_count, direct_io=not a.no_direct_io)}
        for c in configs.values():
            need = c.needs([n], 4)
            check_offload(c, need.host, need.disk)
        probe = int(a.probe_mb * 2**20) if a.probe_mb else configs["nvme"].needs([n], 4).disk
        out = report(n, configs, run_rounds(n, configs, a.rounds, probe))
    if a.json:
        outputs.write_text(a.json, json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
