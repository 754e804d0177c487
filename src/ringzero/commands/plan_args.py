"""The flags of a training configuration (model, training, parallelism, hardware), shared by
`ringzero plan` and `ringzero simulate step`, which read them with `plan.build_inputs`."""

from __future__ import annotations

import argparse

from ringzero.plan import config
from ringzero.plan.hardware import HARDWARE
from ringzero.plan.model.presets import MODELS
from ringzero.plan.model.shapes import NORMS, POSITIONS
from ringzero.plan.strategies.compression_plan import SCHEMES
from ringzero.plan.units import NEGATIVE_VALUE, BandwidthFlag

SHAPE_HELP = {"layers": "transformer blocks L of the model", "hidden": "model width h, the elements of a token's vector",
              "heads": "attention heads a (each of hidden / heads elements)",
              "kv-heads": "key/value heads (grouped-query attention; default: heads)",
              "vocab": "vocabulary size V, the distinct tokens", "seq": "sequence length s, in tokens",
              "ffn": "MLP width, the elements of its hidden layer (default 4h)",
              "gated": "gated MLP (SwiGLU, three matrices)", "bias": "biases on the linear layers",
              "tied": "output head shares the token embedding"}


def add_configuration(parser, default_gpu: str) -> None:
    """The model, training, parallelism and hardware flags (`build_inputs` reads them)."""
    # argparse takes only plain numbers ("-5") for values and reads "--tokens -5B" as a flag
    # missing its value; widen its test so that a negative quantity reaches our one-line check.
    if hasattr(parser, "_negative_number_matcher"):
        parser._negative_number_matcher = NEGATIVE_VALUE
    g = parser.add_argument_group("model (a preset, or every shape flag; flags override a preset)")
    a = g.add_argument
    a("--model", help=f"preset: {', '.join(MODELS)}")
    for flag, what in SHAPE_HELP.items():
        if flag in ("gated", "bias", "tied"):
            a(f"--{flag}", action=argparse.BooleanOptionalAction, default=None, help=what)
        else:
            a(f"--{flag}", type=int, metavar="N", help=what)
    a("--positions", help=f"{' or '.join(POSITIONS)}")
    a("--norm", help=f"{' or '.join(NORMS)}")

    g = parser.add_argument_group("training")
    a = g.add_argument
    a("--micro-batch", type=int, default=1, help="sequences per GPU per pass (default 1)")
    a("--global-batch", type=int, help="sequences per optimizer step (default micro-batch x dp)")
    a("--tokens", help="tokens the whole training run reads, for its days and GPUs, e.g. 300e9, 300B, 2T "
                       "(default: the preset's, else 20 per parameter)")
    a("--precision", default="bf16", help=f"{', '.join(config.PRECISIONS)} (default bf16)")
    a("--optimizer", default="adam", help=f"{', '.join(config.OPTIMIZERS)} (default adam)")
    a("--dropout", action=argparse.BooleanOptionalAction, default=None,
      help="dropout masks in activations (default: the preset's training recipe; on for a custom model)")

    g = parser.add_argument_group("parallelism (dp x tp x pp = --gpus)")
    a = g.add_argument
    a("--gpus", type=int, help="GPUs in all; without --dp, dp = gpus / (tp x pp)")
    a("--dp", type=int, help="data-parallel ranks (default: gpus / (tp x pp), else 1)")
    a("--tp", type=int, default=1, help="tensor-parallel ranks; must divide --heads and --kv-heads")
    a("--pp", type=int, default=1, help="pipeline stages, each a run of consecutive blocks")
    a("--zero", type=int, default=0, help="ZeRO stage 0-3: what the dp ranks shard (1: optimizer states, 2: and "
      "gradients, 3: and weights; default 0: nothing)")
    a("--offload", default="none", help=f"{', '.join(config.OFFLOADS)} (default none)")
    a("--sequence-parallel", action="store_true",
      help="split LayerNorm and dropout activations along the sequence over the tp ranks (Korthikanti et al. 2022)")
    a("--schedule", default="1f1b", help=f"pipeline schedule: {', '.join(config.SCHEDULES)} (default 1f1b)")
    a("--virtual-stages", type=int, default=1, metavar="V",
      help="model chunks per pipeline rank, with --schedule interleaved (default 1)")
    a("--recompute", default="none", help=f"{', '.join(config.RECOMPUTES)} (default none)")
    a("--flash-attention", action="store_true",
      help="a fused attention kernel: the s x s scores are neither stored for backward nor read from memory")
    a("--dp-algorithm", default="auto", help=f"{', '.join(config.DP_ALGORITHMS)} (default auto)")
    a("--bucket-mb", type=float, default=25.0, help="gradient bucket, MiB (default 25)")
    a("--prefetch", type=int, default=1, help="ZeRO-3: layers gathered ahead of the one computing (default 1)")
    a("--servers", type=int, metavar="S", help="also plan the dp ranks as workers of S parameter servers "
      "(each on its own network link; needs tp 1, pp 1, zero 0)")
    a("--compress", default="none", help=f"also plan the dp gradient reduction compressed: {', '.join(SCHEMES)}")
    a("--powersgd-rank", type=int, metavar="R", help="PowerSGD's rank, with --compress powersgd (default 4)")
    a("--topk-fraction", type=float, metavar="F", help="top-k's share sent, with --compress topk (default 0.01)")

    g = parser.add_argument_group("hardware")
    a = g.add_argument
    a("--gpu", default=default_gpu, help=f"{', '.join(HARDWARE)} (default {default_gpu})")
    a("--mfu", "--target-mfu", dest="mfu", type=float,
      help="target model FLOPs utilisation of the training-days and GPUs-for-days figures, e.g. 0.4 "
           "(default 0.5); the step time is modelled, not scaled by it")
    a("--gpus-per-node", type=int, metavar="N", help="GPUs in one node, joined by --intra-bw (default: the --gpu's, 8)")
    a("--intra-bw", type=BandwidthFlag("--intra-bw"), metavar="BW",
      help="per GPU per direction inside a node, e.g. 300GB/s (a plain number: GB/s)")
    a("--inter-bw", type=BandwidthFlag("--inter-bw"), metavar="BW",
      help="per GPU per direction between nodes, e.g. 25GB/s or 200Gbit/s (a plain number: GB/s)")
    a("--hbm", help="device memory, e.g. 80GiB or 80GB")
