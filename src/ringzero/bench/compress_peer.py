"""The `compress` suite of `ringzero bench train`: ringzero's data parallelism with a gradient
compression hook (`parallel.compression`) against torch DDP with the matching comm hook, same
model, ranks, seed and steps, interleaved as every suite is.

    ringzero bench train --nproc 2 --suites compress --compress powersgd --powersgd-rank 4

The peers, per `--compress`:

- fp16 / bf16: `default_hooks.fp16_compress_hook` / `bf16_compress_hook` (the bucket cast to 16
  bits, divided by the ranks, all-reduced);
- powersgd: `powerSGD_hook.powerSGD_hook` with `PowerSGDState(matrix_approximation_rank=R,
  start_powerSGD_iter=max(2, start), use_error_feedback=True, warm_start=True, random_seed=seed)`
  (Vogels et al. 2019, Algorithm 1; torch refuses to start before step 2 with error feedback or
  warm start: DDP rebuilds its buckets after the first step);
- topk: torch has no top-k hook, so the peer is plain DDP (fp32 all-reduce): the ratio says what
  top-k costs or saves against no compression at all, and the losses differ by what it drops.

ringzero's hooks leave the SUM over the ranks and its optimizer divides by dp; torch's hooks leave
the MEAN: both optimizers step on the same averaged gradient, so the loss curves are comparable.
Each torch hook runs on the peer's own gloo group (`process_group`), as every variant has its own.
No torch at import: `bench.train` checks these flags before any rank starts.
"""

from __future__ import annotations

import dataclasses

from ringzero.run import compress_options

SCHEMES = ("fp16", "bf16", "powersgd", "topk")
"""What `--compress` takes (compression "none" is the `dp` suite)."""
TORCH_HOOKS = {"fp16": "default_hooks.fp16_compress_hook", "bf16": "default_hooks.bf16_compress_hook",
               "powersgd": "powerSGD_hook.powerSGD_hook", "topk": None}
"""torch's comm hook each scheme is compared with (None: none exists, plain DDP)."""
POWERSGD_LEAST_START = 2
"""torch's `PowerSGDState` asserts start_powerSGD_iter > 1 with error feedback or warm start."""


def target_key(scheme: str) -> str:
    return f"compress_{scheme}_time_vs_ddp" + ("_hook" if TORCH_HOOKS[scheme] else "")


TARGETS = {target_key(s): (f"ringzero dp + {s} step time / DDP + {TORCH_HOOKS[s].split('.')[1]}" if TORCH_HOOKS[s]
                           else f"ringzero dp + {s} step time / plain DDP (torch has no {s} hook)", 1.00, "<=")
           for s in SCHEMES}
"""Added when `--compress` asks for the compression comparison."""


def add_arguments(a) -> None:
    a("--compress", metavar="SCHEME",
      help="also compare ringzero dp with this gradient compression (fp16, bf16, powersgd, topk) against torch DDP "
           "with the matching comm hook (topk: plain DDP, torch has none); adds the compress suite")
    a("--powersgd-rank", type=int, help="--compress powersgd: the rank R of both (default 4)")
    a("--topk-fraction", type=float, help="--compress topk: the share of each bucket a rank sends (default 0.01)")
    a("--compress-start", type=int,
      help="--compress: the first compressed step, plain all-reduce before it (default 2 for powersgd, torch's "
           "least; 0 otherwise, as torch's fp16/bf16 hooks)")


def config(args, cfg, suites: tuple[str, ...]):
    """ringzero's dp run with the asked compression (a `TrainConfig`; its own checks give the one-line
    errors), or None without `--compress`."""
    if args.compress is None:
        if "compress" in suites:
            raise ValueError(f"--suites compress needs --compress: allowed {', '.join(SCHEMES)}")
        for flag in ("powersgd_rank", "topk_fraction", "compress_start"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} is the compress suite's option: it needs --compress")
        return None
    if args.compress not in SCHEMES:
        raise ValueError(f"--compress {args.compress!r}: allowed {', '.join(SCHEMES)}")
    start = args.compress_start if args.compress_start is not None else \
        POWERSGD_LEAST_START if args.compress == "powersgd" else 0
    return dataclasses.replace(cfg, strategy="dp", compress=args.compress, powersgd_rank=args.powersgd_rank,
                               topk_fraction=args.topk_fraction, compress_start=start)


def variants(cfg) -> tuple[str, str]:
    """(ringzero's variant, torch's) of the compress suite of run `cfg`."""
    s = cfg.compress.compress
    return f"rz_dp_{s}", f"ddp_{s}_hook" if TORCH_HOOKS[s] else "ddp"


def torch_start(cfg) -> int:
    """The first step torch's hook compresses (PowerSGD: not before `POWERSGD_LEAST_START`)."""
    at = compress_options.start(cfg)
    return max(POWERSGD_LEAST_START, at) if cfg.compress.compress == "powersgd" else at


def settings(cfg) -> dict:
    c = compress_options.compression(cfg)
    return {"scheme": c.scheme, "powersgd_rank": c.rank if c.scheme == "powersgd" else None,
            "topk_fraction": c.fraction if c.scheme == "topk" else None, "start": compress_options.start(cfg),
            "torch_hook": TORCH_HOOKS[c.scheme], "torch_start": torch_start(cfg) if TORCH_HOOKS[c.scheme] else None}


def summarize(pair: dict, ranks: list[dict], cfg) -> dict:
    """`bench.train.summarize_pair`'s result with the scheme, both hooks and both losses after the
    N steps (the measuring step's forward, after N updates; rank 0's micro-batches)."""
    out = {**pair, **settings(cfg)}
    if "errors" not in pair:
        out["loss_after"] = {name: ranks[0]["compress"][name]["loss_after"] for name in variants(cfg)}
    return out


def register_torch_hook(ddp, cfg, group) -> None:
    """Register on `ddp` (a DistributedDataParallel on `group`) torch's hook matching `cfg`'s scheme;
    nothing for top-k (plain DDP)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    c, start = compress_options.compression(cfg), torch_start(cfg)
    if c.scheme == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group, matrix_approximation_rank=c.rank, start_powerSGD_iter=start,
            use_error_feedback=True, warm_start=True, random_seed=cfg.training.seed)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif c.scheme in ("fp16", "bf16"):
        hook = getattr(default_hooks, f"{c.scheme}_compress_hook")
        # DDP refuses a hook named bf16_compress_hook without CUDA and NCCL >= 2.10 (NCCL's bf16 sum);
        # gloo sums bf16, so the same function runs here, registered under the wrapper's name.
        wrap = start > 0 or c.scheme == "bf16"
        ddp.register_comm_hook(group, _from_step(hook, start, default_hooks.allreduce_hook) if wrap else hook)


def _from_step(hook, start: int, plain):
    """torch's `hook` from step `start` on and DDP's `plain` all-reduce before it (ringzero's
    `Starting`); DDP hands the last bucket of a step last (`bucket.is_last()`). DDP reads the
    parameter names: (state, bucket)."""
    step = [0]

    def starting(state, bucket):
        now = step[0]
        if bucket.is_last():
            step[0] += 1
        return (hook if now >= start else plain)(state, bucket)
    return starting


def target_values(result: dict) -> dict:
    """The compress suite's target: {key: ratio}, or {key: None} where a variant could not be built."""
    r = result.get("compress")
    if r is None:
        return {}
    return {target_key(r["scheme"]): r.get("time_ratio")}
