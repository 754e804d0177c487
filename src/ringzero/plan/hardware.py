"""GPUs and their links: the constants every time estimate rests on, each with its source.

Bandwidths are bytes per second in one direction per GPU (what a ring step moves), latencies α
seconds per message (Hockney's α-β model: T = α + β·S with β = 1/bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.units import cached_hash, uncached_state

MiB = 2**20


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One kind of GPU in nodes of `gpus_per_node`: its arithmetic and memory rates (what
    `plan.model.compute` times a step with), its links, and the target utilisation of the planning
    figures (training days, GPUs needed)."""

    name: str = "custom"
    peak_flops: float
    """Dense FP16/BF16 tensor-core FLOP/s (no sparsity): the peak of 16-bit matrix multiplications."""
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
    fp32_flops: float = 19.5e12
    """FP32 FLOP/s without tensor cores (CUDA cores): fp32 matrix multiplications run here unless
    `fp32_tensor_cores`."""
    tf32_flops: float = 156e12
    """Dense TF32 tensor-core FLOP/s: fp32 matrix multiplications with `fp32_tensor_cores`."""
    fp32_tensor_cores: bool = False
    """Whether fp32 matmuls use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32; off by
    default since PyTorch 1.12)."""
    hbm_bw: float = 2.039e12
    """Device memory bandwidth, bytes/s: the rate of memory-bound work (norms, softmax, dropout,
    activations, residual adds, the optimizer step)."""
    sms: int = 108
    """Streaming multiprocessors: a matmul runs in waves of one output tile per SM."""
    gemm_efficiency: float = 0.70
    """Fraction of the matmul peak that large, well-shaped matmuls sustain in training; smaller or
    skinnier shapes reach less (`plan.model.compute`)."""
    memory_efficiency: float = 0.85
    """Fraction of `hbm_bw` that streaming element-wise kernels reach."""
    target_mfu: float = 0.5
    """Target model FLOPs utilisation of the planning figures (training days, GPUs for a deadline):
    6N FLOPs per token over peak x GPUs (around 50 % is typical; PaLM reached 46.2 %, Chowdhery
    et al. 2022). The step time does not use it: it is modelled (`plan.model.compute`)."""

    def __post_init__(self) -> None:
        for k in ("peak_flops", "hbm_bytes", "intra_bw", "inter_bw", "pcie_bw", "nvme_bw", "fp32_flops",
                  "tf32_flops", "hbm_bw"):
            if not getattr(self, k) > 0:
                raise ValueError(f"hardware {k} must be > 0, got {getattr(self, k)}")
        if self.intra_alpha < 0 or self.inter_alpha < 0:
            raise ValueError("hardware latencies must be >= 0")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if self.sms < 1:
            raise ValueError(f"hardware sms must be >= 1, got {self.sms}")
        for k in ("gemm_efficiency", "memory_efficiency", "target_mfu"):
            if not 0 < getattr(self, k) <= 1:
                raise ValueError(f"{k} must be in (0, 1], got {getattr(self, k)}")

    def __hash__(self) -> int:
        return cached_hash(self)

    def __getstate__(self) -> dict:
        return uncached_state(self)

    def matmul_flops(self, precision: str) -> float:
        """Peak FLOP/s of a matrix multiplication in `precision` ("fp32", "bf16", "fp16")."""
        if precision == "fp32":
            return self.tf32_flops if self.fp32_tensor_cores else self.fp32_flops
        return self.peak_flops


# Sources:
# [A100] NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOPS dense BF16/FP16, 156 TFLOPS dense
#        TF32, 19.5 TFLOPS FP32; HBM2 1,555 GB/s (40GB) and HBM2e 2,039 GB/s (80GB SXM); 108 SMs
#        (NVIDIA A100 architecture whitepaper, 2020); NVLink 3 600 GB/s (both directions together,
#        so 300 GB/s each way); PCIe Gen4 x16 (~25 GB/s achieved). Memory as nvidia-smi reports it:
#        40960 MiB and 81920 MiB.
# [DGX-A100] NVIDIA DGX A100 user guide: 8 GPUs, 8 x 200 Gb/s HDR InfiniBand for compute, one NIC
#        per GPU -> 25 GB/s per GPU per direction.
# [H100] NVIDIA H100 Tensor Core GPU datasheet: SXM 989 TFLOPS dense BF16 (1,979 with sparsity),
#        495 TFLOPS dense TF32, 67 TFLOPS FP32, HBM3 3.35 TB/s, 132 SMs; NVLink 4 900 GB/s (450 GB/s
#        each way), PCIe Gen5 (~50 GB/s achieved); nvidia-smi 81559 MiB.
# [DGX-H100] NVIDIA DGX H100 user guide: 8 x 400 Gb/s NDR ConnectX-7, one per GPU -> 50 GB/s
#        (the ~50 GB/s commonly quoted for InfiniBand).
# [H200] NVIDIA H200 Tensor Core GPU datasheet: same compute and NVLink as H100 SXM, 141 GB HBM3e at
#        4.8 TB/s; nvidia-smi reports 143771 MiB.
# [GEMM] Sustained matmul efficiency. The best shapes reach 85.9 % of peak on an A100 SXM and 80.1 %
#        on an H100 SXM in a short burst (Bekman, "Machine Learning Engineering",
#        compute/accelerator/README.md, maximum achievable matmul FLOP/s, MAMF: 267.9 and 792.1
#        TFLOPS, CUDA 12.1); held at the power limit they settle about 10 % lower (the same book's
#        maximum sustainable matmul FLOP/s: H200 834 -> 755 TFLOPS); a plain large fp16 matmul
#        benchmark on an A100-80GB measures 230 TFLOPS, 74 % (transformers-benchmarks README,
#        micro_bench: github.com/fanghostt/transformers-benchmarks). ringzero uses 0.70 on the
#        A100, the one value fitted to Narayanan et al. 2021's Table 1 (`plan.published`, all ten
#        cases at once: about 4 % mean error), and the same derating of the H100's 80.1 %, 0.65.
# [STREAM] Streaming element-wise kernels reach most but not all of the datasheet bandwidth
#        (STREAM-like benchmarks such as BabelStream, Deakin et al. 2018); ringzero assumes 85 %, a
#        round figure not checked here: measure your own (a large torch copy) and set it.
# Latencies: nccl-tests all_reduce at 8 bytes is ~5 µs inside an NVLink node and ~10-20 µs across
#        InfiniBand; ringzero uses 5 µs and 10 µs per message as round figures.
# NVMe: a PCIe Gen4 x4 drive reads ~7 GB/s; ZeRO-Infinity (Rajbhandari et al., SC 2021) stripes
#        several drives per node. ringzero assumes 6 GB/s per GPU; override it for your storage.
_A100 = dict(peak_flops=312e12, tf32_flops=156e12, fp32_flops=19.5e12, sms=108, gemm_efficiency=0.70,
             intra_bw=300e9, inter_bw=25e9, pcie_bw=25e9)
_H100 = dict(peak_flops=989e12, tf32_flops=495e12, fp32_flops=67e12, sms=132, gemm_efficiency=0.65,
             intra_bw=450e9, inter_bw=50e9, pcie_bw=50e9)
HARDWARE: dict[str, Hardware] = {
    "a100-40gb": Hardware(name="a100-40gb", hbm_bytes=40960 * MiB, hbm_bw=1.555e12, **_A100),
    "a100-80gb": Hardware(name="a100-80gb", hbm_bytes=81920 * MiB, hbm_bw=2.039e12, **_A100),
    "h100-sxm": Hardware(name="h100-sxm", hbm_bytes=81559 * MiB, hbm_bw=3.35e12, **_H100),
    "h200": Hardware(name="h200", hbm_bytes=143771 * MiB, hbm_bw=4.8e12, **_H100),
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
