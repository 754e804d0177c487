"""`ringzero bench train`: ringzero's strategies against torch's DDP and FSDP2, in one run.

    ringzero bench train --nproc 2 --steps 14 --json out/bench_train.json

The targets, each printed with its ratio and whether it is met:

- `dp` step time <= 1.00 x DistributedDataParallel's (gradient buckets of `--bucket-mb` MiB for
  both: ringzero's `bucket_mb` and DDP's `bucket_cap_mb`);
- `zero3` step time <= 0.70 x FSDP2's (`fully_shard` per block and on the root), and its peak
  model-state bytes <= FSDP2's;
- with `--tp T`, tensor parallelism over the T ranks: step time <= 1.00 x torch's own
  (`parallelize_module` with ColwiseParallel / RowwiseParallel on the same model), losses equal;
- with `--pp P`, pipeline parallelism over the P ranks, for GPipe, 1F1B and interleaved 1F1B (v = 2):
  step time <= 1.00 x `torch.distributed.pipelining`'s ScheduleGPipe / Schedule1F1B /
  ScheduleInterleaved1F1B on the same chunks, m = `--pp-microbatches` micro-batches, losses equal;
- with `--compress SCHEME`: ringzero dp so compressed, step time <= 1.00 x DDP's with torch's hook (`compress_peer`);
- recomputation on one rank, on a shape where the 5·a·s²·b attention term is at least half the
  activations: full saves >= 80 % of the activation bytes at <= 35 % extra step time, selective
  saves >= 50 % at <= 5 %.

The default recomputation shape (2 layers, h = 1536, 96 heads of 16, s = 384, batch 1) keeps the ratios that
make selective recomputation pay at GPT-3 scale (Korthikanti et al. 2022 §4.2): the a·s² tensors are large
against the rest (a·s/h = 24, here 60 % of a block's fp32 activations) while the attention core's FLOPs are
small against the block's (s/6h = 4 %; GPT-3: a·s/h = 16, s/6h = 3 %). Recomputing the core costs memory
traffic, not FLOPs (it writes the scores and reads and writes the softmax: ~3 s x s passes), so its share of
the step falls as 1/h at a fixed a·s/h: +6 % at h = 768, +3 % at h = 1536 on this CPU (`ringzero bench train
--nproc 2 --suites recompute --rc-hidden 768 --rc-heads 48`, and the defaults). A narrow model with long
sequences (h = 64, s = 512) has the memory but not the FLOP ratio: there the core is most of the compute and
recomputing it costs +20 % (`--rc-hidden 64 --rc-heads 4 --rc-seq 512`).
"""

from __future__ import annotations

import dataclasses
import json
import statistics

from ringzero.comm.config import TRANSPORTS
from ringzero.comm.transport.preflight import transport_for
from ringzero.plan.model.activations import head_bytes, layer_bytes, layer_terms
from ringzero.plan.model.shapes import ModelShape
from ringzero.run.config import TrainConfig
from ringzero.bench import compress_peer, zeropp
from ringzero.bench.train_job import PP_SCHEDULES, Job, check_steps
from ringzero.bench.train_report import print_report

DEFAULT_SUITES = ("dp", "zero3", "recompute")
SUITE_NAMES = (*DEFAULT_SUITES, "compress")
# key -> (what, bound, "<=" or ">=")
TARGETS = {
    "dp_time_vs_ddp": ("ringzero dp step time / DDP", 1.00, "<="),
    "zero3_time_vs_fsdp2": ("ringzero zero3 step time / FSDP2", 0.70, "<="),
    "zero3_state_vs_fsdp2": ("ringzero zero3 peak model-state bytes / FSDP2", 1.00, "<="),
    "full_saved": ("full recompute: activation bytes saved", 0.80, ">="),
    "full_extra_time": ("full recompute: extra step time", 0.35, "<="),
    "selective_saved": ("selective recompute: activation bytes saved", 0.50, ">="),
    "selective_extra_time": ("selective recompute: extra step time", 0.05, "<="),
}
TP_TARGETS = {"tp_time_vs_torch_tp": ("ringzero tp step time / torch parallelize_module", 1.00, "<=")}  # with --tp
PP_TARGETS = {f"pp_{s}_time_vs_torch": (f"ringzero {s} step time / torch.distributed.pipelining", 1.00, "<=")
              for s in PP_SCHEDULES}                    # added when `--pp` asks for the pipeline comparison


def add_arguments(parser) -> None:
    a = parser.add_argument
    a("--nproc", type=int, default=2, help="local ranks every variant trains on (default 2)")
    a("--model", default="micro", help="model preset for dp/zero3 (default micro: 6 x 256, 4.8M params)")
    a("--seq", type=int, default=64, help="sequence length of the model the variants train, in tokens (the recompute suite's: --rc-seq; default 64)")
    a("--micro-batch", type=int, default=2, help="sequences per rank per step (default 2)")
    a("--steps", type=int, default=14, help="steps per variant, warm-up included (default 14, at least 2)")
    a("--skip", type=int, default=2, help="warm-up steps left out of the median (default 2)")
    a("--lr", type=float, default=1e-3, help="peak learning rate of every variant (default 1e-3)")
    a("--bucket-mb", type=float, default=25.0,
      help="gradient bucket MiB: ringzero's bucket_mb and DDP's bucket_cap_mb (default 25, DDP's)")
    a("--torch-adam", default="foreach",
      help="torch.optim.AdamW implementation of the DDP/FSDP2 peers (default foreach, torch's default; "
           "fused is their fastest here)")
    a("--algorithm", default="auto", help="ringzero collective algorithm (default auto)")
    a("--suites", default=",".join(DEFAULT_SUITES),
      help="comma list of dp, zero3, recompute, compress (default the first three; empty with --tp, --pp, --compress)")
    compress_peer.add_arguments(a)
    a("--tp", type=int, default=1,
      help="also compare tensor parallelism over the T = --nproc ranks with torch's parallelize_module (default 1: off)")
    a("--pp", type=int, default=1,
      help="also compare pipeline parallelism over the P = --nproc ranks with torch.distributed.pipelining "
           "(default 1: off)")
    a("--pp-layers", type=int, default=8, help="pipeline comparison: layers of the model (default 8)")
    a("--pp-microbatches", type=int, default=None,
      help="pipeline comparison: micro-batches per step (default 4 x --pp)")
    a("--rc-layers", type=int, default=2, help="recompute shape: layers (default 2)")
    a("--rc-hidden", type=int, default=1536, help="recompute shape: hidden (default 1536)")
    a("--rc-heads", type=int, default=96, help="recompute shape: heads (default 96, of 16)")
    a("--rc-seq", type=int, default=384, help="recompute shape: sequence length (default 384)")
    a("--rc-batch", type=int, default=1, help="recompute: sequences per step (default 1)")
    a("--rc-steps", type=int, default=12, help="recompute: steps per mode (default 12)")
    a("--strategy", default="zero3", help="with --zeropp: the base strategy, zero3 (ZeRO++'s)")
    a("--zeropp", metavar="qwz,hpz,qgz", help="compare ZeRO++ with these options against ZeRO-3 (replaces the suites; --algorithm auto "
                                       "runs ring there, whose cross-node bytes the planner models)")
    a("--ranks-per-node", type=int, help="with --zeropp: emulate nodes of this many ranks")
    zeropp.add_link(a)
    a("--transport", default="auto", choices=TRANSPORTS, help="ringzero's messages: auto (default), shm or gloo")
    a("--json", metavar="FILE", help="also write the results as JSON to FILE")
    a("--timeout", type=float, default=1800.0, help="seconds before every rank is stopped")


def build_job(args):
    """Validate every argument (ValueError with one line) and return what the ranks will run."""
    for flag in ("ranks_per_node", "emulate_inter_node"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} is for the ZeRO++ comparison: it needs --zeropp")
    if args.strategy != "zero3":
        raise ValueError("--strategy picks ZeRO++'s base: it needs --zeropp")
    suites = tuple(s.strip() for s in args.suites.split(",") if s.strip())
    bad = [s for s in suites if s not in SUITE_NAMES]
    if bad or not (suites or args.tp > 1 or args.pp > 1 or args.compress):
        raise ValueError(f"--suites {args.suites!r}: allowed {', '.join(SUITE_NAMES)} (empty with --tp, --pp, --compress)")
    suites += () if args.compress is None or "compress" in suites else ("compress",)
    if args.nproc < 2 and (need := [s for s in ("dp", "zero3", "compress") if s in suites]):
        raise ValueError(f"--nproc must be at least 2 for {' and '.join(need)}, got {args.nproc}")
    if args.tp != 1 and args.tp != args.nproc:
        raise ValueError(f"--tp {args.tp}: the comparison splits the model over every rank; give --tp equal to "
                         f"--nproc ({args.nproc}), or 1 for none")
    check_steps(args.steps, args.rc_steps, args.skip)
    cfg = TrainConfig(model=args.model, seq=args.seq, micro_batch=args.micro_batch, steps=args.steps,
                      bucket_mb=args.bucket_mb, comm_algorithm=args.algorithm, max_bytes=2**20, lr=args.lr,
                      warmup=min(10, args.steps), transport=transport_for(args.transport, [args.nproc], False)[0])
    if args.tp > 1:
        dataclasses.replace(cfg, tp=args.tp)             # the split must exist: one line if it cannot
        suites += ("tp",)
    pp_cfg = None
    if args.pp != 1:
        if args.pp != args.nproc:
            raise ValueError(f"--pp {args.pp}: the comparison pipelines the model over every rank; give --pp "
                             f"equal to --nproc ({args.nproc}), or 1 for none")
        m = args.pp_microbatches or 4 * args.pp
        pp_cfg = dataclasses.replace(cfg, pp=args.pp, layers=args.pp_layers, grad_accum=m, micro_batch=1,
                                     schedule="interleaved", virtual_stages=2)   # every schedule must run
        suites += tuple(f"pp_{s}" for s in PP_SCHEDULES)
    rc = ModelShape(name="recompute", layers=args.rc_layers, hidden=args.rc_hidden, heads=args.rc_heads,
                    vocab=256, seq=args.rc_seq)
    if args.torch_adam not in ("foreach", "fused"):
        raise ValueError(f"--torch-adam {args.torch_adam!r}: allowed foreach, fused")
    if args.rc_batch < 1:
        raise ValueError(f"--rc-batch must be >= 1, got {args.rc_batch}")
    return Job(cfg=cfg, suites=suites, rc_shape=rc, rc_batch=args.rc_batch, rc_steps=args.rc_steps,
               torch_adam=args.torch_adam, pp_cfg=pp_cfg, compress_cfg=compress_peer.config(args, cfg, suites))


def _per_step_max(ranks: list[dict], suite: str, name: str, key: str = "times") -> list:
    return [max(vals) for vals in zip(*(r[suite][name][key] for r in ranks))]


def _median(xs, skip):
    return statistics.median(xs[skip:])


def summarize_pair(ranks: list[dict], suite: str, ours: str, peer: str, skip: int, loss_rank: int = 0) -> dict:
    """Step times (the max over ranks, step by step), phases, model states and losses (of rank
    `loss_rank`: a pipeline's last) of a variant and its peer, and their ratios."""
    if "errors" in ranks[0][suite]:
        return {"errors": ranks[0][suite]["errors"]}
    out: dict = {"variants": {}}
    for name in (ours, peer):
        times = _per_step_max(ranks, suite, name)
        phases = {k: _median([max(r[suite][name]["phases"][i][k] for r in ranks) for i in range(len(times))], skip)
                  for k in ranks[0][suite][name]["phases"][0]}     # none for torch's pipelines: one call
        states = {k: max(r[suite][name]["states"][k] for r in ranks) for k in ranks[0][suite][name]["states"]}
        states["steady"] = states["params"] + states["grads"] + states["optimizer"]
        states["peak"] = max(r[suite][name]["states"]["params"] + r[suite][name]["states"]["grads"]
                             + r[suite][name]["states"]["optimizer"] + r[suite][name]["states"]["transient_peak"]
                             for r in ranks)
        out["variants"][name] = {"step_s": _median(times, skip), "times": times, "phases": phases,
                                 "states": states, "losses": ranks[loss_rank][suite][name]["losses"]}
    a, b = out["variants"][ours], out["variants"][peer]
    out["time_ratio"] = a["step_s"] / b["step_s"]
    out["paired_time_ratio"] = _median([x / y for x, y in zip(a["times"], b["times"])], skip)
    out["state_ratio"] = a["states"]["peak"] / b["states"]["peak"]
    out["steady_state_ratio"] = a["states"]["steady"] / b["states"]["steady"]
    out["max_loss_diff"] = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
    return out


def attention_share(m: ModelShape, b: int) -> float:
    """Share of one block's saved bytes in the a·s² terms (fp32 values, no dropout: this run's)."""
    terms = layer_terms(m, b, m.seq, value_bytes=4, dropout=False)
    return sum(v for k, v in terms.items() if k in ("softmax", "attention_dropout")) / sum(terms.values())


def summarize_recompute(rec: dict, job, skip: int) -> dict:
    m, b = job.rc_shape, job.rc_batch
    out: dict = {"shape": dataclasses.asdict(m), "batch": b, "attention_share": attention_share(m, b),
                 "modes": {}}
    for mode, r in rec.items():
        predicted = m.layers * layer_bytes(m, b, m.seq, value_bytes=4, dropout=False, recompute=mode) \
            + head_bytes(m, b, m.seq, value_bytes=4)
        out["modes"][mode] = {"step_s": _median(r["times"], skip), "activations": r["activations"],
                              "phases": {k: _median([p[k] for p in r["phases"]], skip) for k in r["phases"][0]},
                              "predicted_activations": predicted, "losses": r["losses"]}
    base = out["modes"]["none"]
    for mode in ("selective", "full"):
        x = out["modes"][mode]
        x["saved"] = 1 - x["activations"] / base["activations"]
        x["extra_time"] = x["step_s"] / base["step_s"] - 1
        x["paired_extra_time"] = _median([t / u - 1 for t, u in zip(rec[mode]["times"], rec["none"]["times"])], skip)
        x["max_loss_diff"] = max(abs(p - q) for p, q in zip(x["losses"], base["losses"]))
    return out


def targets(result: dict) -> list[dict]:
    vals = {}
    if "time_ratio" in result.get("dp", {}):
        vals["dp_time_vs_ddp"] = result["dp"]["time_ratio"]
    if "time_ratio" in result.get("tp", {}):
        vals["tp_time_vs_torch_tp"] = result["tp"]["time_ratio"]
    for s in PP_SCHEDULES:
        if "time_ratio" in result.get(f"pp_{s}", {}):
            vals[f"pp_{s}_time_vs_torch"] = result[f"pp_{s}"]["time_ratio"]
    if "time_ratio" in result.get("zero3", {}):
        vals["zero3_time_vs_fsdp2"] = result["zero3"]["time_ratio"]
        vals["zero3_state_vs_fsdp2"] = result["zero3"]["state_ratio"]
    if "recompute" in result:
        for mode in ("full", "selective"):
            vals[f"{mode}_saved"] = result["recompute"]["modes"][mode]["saved"]
            vals[f"{mode}_extra_time"] = result["recompute"]["modes"][mode]["extra_time"]
    impossible = {k for suite, keys in (("dp", ("dp_time_vs_ddp",)), ("tp", ("tp_time_vs_torch_tp",)),
                                        ("zero3", ("zero3_time_vs_fsdp2", "zero3_state_vs_fsdp2")),
                                        *((f"pp_{s}", (f"pp_{s}_time_vs_torch",)) for s in PP_SCHEDULES))
                  if "errors" in result.get(suite, {}) for k in keys}
    compressed = compress_peer.target_values(result)       # key -> ratio, None: the peer could not run
    vals.update({k: v for k, v in compressed.items() if v is not None})
    impossible |= {k for k, v in compressed.items() if v is None}
    rows = []
    for key, (what, bound, op) in {**TARGETS, **TP_TARGETS, **PP_TARGETS, **compress_peer.TARGETS}.items():
        if key in vals:
            v = vals[key]
            rows.append({"key": key, "what": what, "value": v, "op": op, "bound": bound,
                         "met": v <= bound if op == "<=" else v >= bound})
        elif key in impossible:      # the peer could not run here: said so, never faked
            rows.append({"key": key, "what": what, "value": None, "op": op, "bound": bound, "met": None})
    return rows


def measure(job, nproc: int, timeout: float) -> list[dict]:
    from ringzero import launch
    from ringzero.bench.train_ranks import rank_main
    return launch.spawn(rank_main, nproc, (job,), timeout=timeout)


def benchmark(args) -> dict:
    """Validate, run every rank, and return the results as plain data (what --json writes)."""
    from ringzero import outputs
    from ringzero.errors import usage
    with usage():
        job = build_job(args)
        if args.json:
            outputs.check(args.json, "--json")
    ranks = measure(job, args.nproc, args.timeout)
    c = job.cfg
    result: dict = {"nproc": args.nproc, "settings": {
        "model": dataclasses.asdict(c.shape), "micro_batch": c.training.micro_batch, "global_batch": c.global_batch(args.nproc),
        "steps": c.training.steps, "skip": args.skip, "precision": c.optim.precision, "ringzero_bucket_mb": c.parallel.bucket_mb,
        "ddp_bucket_cap_mb": c.parallel.bucket_mb, "algorithm": c.parallel.comm_algorithm, "lr": c.optim.lr, "betas": c.optim.betas,
        "clip": c.optim.clip, "torch_optimizer": f"torch.optim.AdamW({args.torch_adam}=True)"}}
    if "dp" in job.suites:
        result["dp"] = summarize_pair(ranks, "dp", "rz_dp", "ddp", args.skip)
    if "zero3" in job.suites:
        result["zero3"] = summarize_pair(ranks, "zero3", "rz_zero3", "fsdp2", args.skip)
    if "tp" in job.suites:
        result["tp"] = summarize_pair(ranks, "tp", "rz_tp", "torch_tp", args.skip)
    if (cc := job.compress_cfg) is not None:
        result["compress"] = compress_peer.summarize(summarize_pair(ranks, "compress", *compress_peer.variants(cc), args.skip), ranks, cc)
    if job.pp_cfg is not None:
        p = job.pp_cfg
        result["settings"]["pipeline"] = {"layers": p.shape.layers, "micro_batches": p.training.grad_accum,
                                          "micro_batch": p.training.micro_batch,
                                          "virtual_stages": p.parallel.virtual_stages}
        for s in PP_SCHEDULES:
            result[f"pp_{s}"] = summarize_pair(ranks, f"pp_{s}", f"rz_pp_{s}", f"torch_pp_{s}", args.skip,
                                               loss_rank=-1)
    if "recompute" in job.suites:
        result["recompute"] = summarize_recompute(ranks[0]["recompute"], job, args.skip)
    result["targets"] = targets(result)
    result["ratios"] = {t["key"]: t["value"] for t in result["targets"] if t["value"] is not None}
    return result


def run(args) -> int:
    if args.zeropp is not None:
        from ringzero.bench import zeropp
        result = zeropp.benchmark(args)
        zeropp.print_report(result)
    else:
        result = benchmark(args)
        print_report(result)
    if args.json:
        from ringzero.outputs import write_text
        write_text(args.json, json.dumps(result, indent=1) + "\n")
    return 0
