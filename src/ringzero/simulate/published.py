"""Published nccl-tests runs the simulator is held against: all_reduce_perf's busbw by size.

Each run is the table as printed by its source (sizes in bytes, busbw in GB/s = 1e9 bytes/s, the
in-place column where the source gives one), with where it came from, so that a reader can open it.
"""

from __future__ import annotations

from dataclasses import dataclass

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclass(frozen=True)
class NcclRun:
    name: str
    source: str
    """Where the table is published (a repository, its path and commit)."""
    topology: str
    """The `simulate.topology` preset whose hardware the run was on."""
    gpus: int
    gpus_per_node: int
    busbw: tuple[tuple[int, float], ...]
    """(size in bytes, busbw in GB/s), ascending sizes."""
    note: str = ""

    def at(self, nbytes: int) -> float:
        return dict(self.busbw)[nbytes]

    def sizes(self, lo: int = 0, hi: int = 1 << 62) -> list[int]:
        return [s for s, _ in self.busbw if lo <= s <= hi]


def _pow2(first: int, values: tuple[float, ...]) -> tuple[tuple[int, float], ...]:
    return tuple((first << i, v) for i, v in enumerate(values))


AZURE_ND_A100_V4 = NcclRun(
    name="Azure ND A100 v4, 8 x A100-SXM4-80GB (one node, NVSwitch)",
    source="github.com/Azure/AI-benchmarking-guide, Azure_Results/ND_A100_v4_results.md "
           "(commit 3bb66ca), table 'NCCL Bandwidth': all_reduce_perf -b 8 -e 8G -f 2 -g 8, in place, "
           "NCCL 2.18.5",
    topology="dgx-a100", gpus=8, gpus_per_node=8,
    busbw=_pow2(KiB, (0.04, 0.08, 0.17, 0.33, 0.67, 1.37, 2.70, 5.15, 10.11, 19.24, 36.22, 53.54, 71.43,
                      89.99, 109.22, 132.77, 166.63, 174.18, 213.87, 221.58, 228.10, 230.22, 230.48, 231.58)),
    note="the source sets NCCL_ALGO=NVLS, which A100 (no NVLink SHARP) cannot run: NCCL runs its own "
         "choice (the ring at these sizes on one node), so the figures are compared with the ring")

GCP_A3_MEGA_16 = NcclRun(
    name="GCP a3-megagpu-8g, 2 nodes x 8 H100 (NVSwitch, 8 x 200 Gb/s GPUDirect-TCPXO NICs)",
    source="github.com/lessizzmore/create-a3mega-ztan-fork, ztan-NCCL-test-result (commit 02dd8f4): "
           "all_reduce_perf -b 8 -e 8G -f 2 -g 1 over 16 ranks, in place",
    topology="dgx-h100", gpus=16, gpus_per_node=8,
    busbw=_pow2(MiB, (9.49, 15.55, 22.05, 27.91, 33.06, 59.69, 99.06, 153.76, 213.28, 262.97, 298.82,
                      318.52, 330.51, 337.35)),
    note="NCCL pipelines its intra-node and inter-node phases (and splits the data over 8 NICs with many "
         "channels); ringzero's hierarchical all-reduce runs its three phases one after another")

RUNS = {"azure-nd-a100-v4": AZURE_ND_A100_V4, "gcp-a3-mega-16": GCP_A3_MEGA_16}
