"""`ringzero plan --plot FILE.png` (or .svg, .pdf: any format matplotlib writes): memory per GPU as stacked bars for DP, ZeRO-1, ZeRO-2, ZeRO-3.

The numbers are `ringzero.plan.strategies.compare.memory_by_stage` (every other setting as planned); the
dashed line is the GPU's HBM. The path is checked before the plan is computed (`outputs.check`)
and the figure written atomically (`outputs.write_with`): a failed run leaves no file behind.
"""

from __future__ import annotations

from ringzero import outputs
from ringzero.plan.strategies.compare import memory_by_stage
from ringzero.plan.estimate import Estimate

PARTS = ("params", "grads", "optimizer", "activations", "buffers")
GB = 1e9


def check_path(path: str) -> None:
    """Fail early (before any work) when `path` cannot be written, or not as a figure."""
    outputs.plot_format(path, "--plot")


def plot(e: Estimate, path: str) -> None:
    """Write the stacked bars of `e`'s model, training and parallel settings to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = memory_by_stage(e.model, e.training, e.parallel)
    labels = [label + ("\n(planned)" if i == e.parallel.zero else "") for i, (label, _) in enumerate(stages)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bottom = [0.0] * len(stages)
    for part in PARTS:
        heights = [getattr(mem, part) / GB for _, mem in stages]
        ax.bar(labels, heights, bottom=bottom, label=part)
        bottom = [b + h for b, h in zip(bottom, heights)]
    hbm = e.hardware.hbm_bytes / GB
    ax.axhline(hbm, color="black", linestyle="--", linewidth=1, label=f"HBM {hbm:.1f} GB")
    p = e.parallel
    ax.set_ylabel("GB per GPU (10⁹ bytes)")
    ax.set_title(f"{e.model.name} on {p.gpus} x {e.hardware.name} (dp {p.dp}, tp {p.tp}, pp {p.pp})")
    ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        fmt = outputs.plot_format(path, "--plot")
        outputs.write_with(path, lambda f: fig.savefig(f, format=fmt, dpi=120), binary=True)
    finally:
        plt.close(fig)
