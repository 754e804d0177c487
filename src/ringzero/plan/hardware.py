"""GPUs and their links: the constants every time estimate rests on, each with its source.

Bandwidths are bytes per second in one direction per GPU (what a ring step moves), latencies α
seconds per message (Hockney's α-β model: T = α + β·S with β = 1/bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One kind of GPU in nodes of `gpus_per_node`, and the target utilisation."""

    name: str = "custom"
    peak_flops: float
    """Dense FP16/BF16 tensor-core FLOP/s (no sparsity)."""
    hbm_bytes: int
    """Device memory in bytes."""
    intra_bw: float
    """Bytes/s per GPU per direction inside a node (NVLink)."""
    inter_bw: float
    """Bytes/s per GPU per direction between nodes (InfiniBand/RoCE NIC per GPU)."""
    intra_alpha: float = 5e-6
    """Seconds per message inside a node."""
    inter_alpha: float = 10e-6
    """Seconds per message between nodes."""
    gpus_per_node: int = 8
    pcie_bw: float = 25e9
    """Bytes/s per direction between the GPU and host memory (offload)."""
    nvme_bw: float = 6e9
    """Bytes/s per GPU to NVMe (ZeRO-Infinity)."""
    mfu: float = 0.5
    """Target model FLOPs utilisation (around 50 % is typical; PaLM reached 46.2 %, Chowdhery et al. 2022)."""

    def __post_init__(self) -> None:
        for k in ("peak_flops", "hbm_bytes", "intra_bw", "inter_bw", "pcie_bw", "nvme_bw"):
            if not getattr(self, k) > 0:
                raise ValueError(f"hardware {k} must be > 0, got {getattr(self, k)}")
        if self.intra_alpha < 0 or self.inter_alpha < 0:
            raise ValueError("hardware latencies must be >= 0")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"mfu must be in (0, 1], got {self.mfu}")


# Sources:
# [A100] NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOPS dense BF16/FP16; NVLink 3 600 GB/s
#        (both directions together, so 300 GB/s each way); PCIe Gen4 x16 (~25 GB/s achieved).
#        Memory as nvidia-smi reports it: 40960 MiB and 81920 MiB.
# [DGX-A100] NVIDIA DGX A100 user guide: 8 GPUs, 8 x 200 Gb/s HDR InfiniBand for compute, one NIC
#        per GPU -> 25 GB/s per GPU per direction.
# [H100] NVIDIA H100 Tensor Core GPU datasheet: SXM 989 TFLOPS dense BF16 (1,979 with sparsity),
#        NVLink 4 900 GB/s (450 GB/s each way), PCIe Gen5 (~50 GB/s achieved); nvidia-smi 81559 MiB.
# [DGX-H100] NVIDIA DGX H100 user guide: 8 x 400 Gb/s NDR ConnectX-7, one per GPU -> 50 GB/s
#        (the ~50 GB/s commonly quoted for InfiniBand).
# [H200] NVIDIA H200 Tensor Core GPU datasheet: same compute and NVLink as H100 SXM, 141 GB HBM3e;
#        nvidia-smi reports 143771 MiB.
# Latencies: nccl-tests all_reduce at 8 bytes is ~5 µs inside an NVLink node and ~10-20 µs across
#        InfiniBand; ringzero uses 5 µs and 10 µs per message as round figures.
# NVMe: a PCIe Gen4 x4 drive reads ~7 GB/s; ZeRO-Infinity (Rajbhandari et al., SC 2021) stripes
#        several drives per node. ringzero assumes 6 GB/s per GPU; override it for your storage.
HARDWARE: dict[str, Hardware] = {
    "a100-40gb": Hardware(name="a100-40gb", peak_flops=312e12, hbm_bytes=40960 * MiB, intra_bw=300e9,
                          inter_bw=25e9, pcie_bw=25e9),
    "a100-80gb": Hardware(name="a100-80gb", peak_flops=312e12, hbm_bytes=81920 * MiB, intra_bw=300e9,
                          inter_bw=25e9, pcie_bw=25e9),
    "h100-sxm": Hardware(name="h100-sxm", peak_flops=989e12, hbm_bytes=81559 * MiB, intra_bw=450e9,
                         inter_bw=50e9, pcie_bw=50e9),
    "h200": Hardware(name="h200", peak_flops=989e12, hbm_bytes=143771 * MiB, intra_bw=450e9,
                     inter_bw=50e9, pcie_bw=50e9),
}


def hardware(name: str) -> Hardware:
    """The preset called `name` (case-insensitive)."""
    key = name.lower()
    if key not in HARDWARE:
        raise ValueError(f"unknown gpu {name!r}; allowed: {', '.join(HARDWARE)}")
    return HARDWARE[key]


def whole_nodes(gpus: int, gpus_per_node: int) -> bool:
    """Whether `gpus` GPUs fill whole nodes, or fit in one: the placement `strategy_comm` prices (a
    group is inside a node when its span fits) assumes a job on more than one node fills each."""
    return gpus <= gpus_per_node or gpus % gpus_per_node == 0
