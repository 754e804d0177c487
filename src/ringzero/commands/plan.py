"""`ringzero plan`: size, compute, memory, communication and time of one training configuration.

    ringzero plan --model llama-2-7b --gpus 8 --gpu a100-80gb --zero 3
    ringzero plan --layers 24 --hidden 2048 --heads 16 --vocab 50257 --seq 2048 --gpus 16 --tp 2
    ringzero plan --model gpt3-175b --gpus 1024 --tp 8 --pp 8 --days 30 --json

Parsing and checking only; the numbers come from `ringzero.plan.estimate` (and `.search`,
`.recommend`), the tables from `plan_render`, the figure from `plan_plot`. Every flag is checked
before anything is computed (`errors.usage`): a bad value is one line naming the flag and what is
allowed, exit code 2; an error after that is a failure of the computation, exit code 1.
"""

from __future__ import annotations

import dataclasses
import json
import re

from ringzero.errors import usage
from ringzero.commands.plan_args import add_configuration
from ringzero.plan import config
from ringzero.plan.search import limits
from ringzero.plan.config import Parallel, Training
from ringzero.plan.estimate import check, estimate, to_dict
from ringzero.plan.hardware import Hardware, hardware, whole_nodes
from ringzero.plan.model.presets import MODELS, TRAINED_TOKENS, model
from ringzero.plan.strategies.compression_plan import Compression, compression_for, compression_plan
from ringzero.plan.strategies.ps_plan import ps_plan
from ringzero.plan.search.recommend import recommend
from ringzero.plan.search.space import search
from ringzero.plan.model.shapes import ModelShape
from ringzero.plan.strategies.param_server import check_servers
from ringzero.plan.units import parse_bytes, parse_count  # noqa: F401  (parse_* are this module's API)

SHAPE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "vocab", "seq", "ffn", "gated", "bias", "tied",
               "positions", "norm")
REQUIRED_SHAPE = ("layers", "hidden", "heads", "vocab", "seq")
HW_FLAGS = {"mfu": "target_mfu", "gpus_per_node": "gpus_per_node", "intra_bw": "intra_bw",
            "inter_bw": "inter_bw", "hbm": "hbm_bytes"}
DEFAULT_GPU = "a100-80gb"

def add_arguments(parser) -> None:
    parser.description = __doc__.splitlines()[0].split(": ", 1)[1]
    add_configuration(parser, DEFAULT_GPU)
    g = parser.add_argument_group("output")
    a = g.add_argument
    a("--days", type=float, help="also print the GPUs needed to train in this many days")
    a("--search", action="store_true", help="search dp/tp/pp/zero/micro-batch/recompute/sp")
    a("--top", type=int, default=10, help="configurations the search shows (default 10)")
    a("--json", action="store_true", help="print the JSON plan (schema ringzero.plan/1) only")
    a("--plot", metavar="FILE.png", help="write memory per GPU for DP and ZeRO-1/2/3 to this PNG")


def build_model(args) -> ModelShape:
    """The preset (if any) with every given shape flag applied."""
    given = {k: getattr(args, k) for k in SHAPE_FLAGS if getattr(args, k) is not None}
    if args.model is None:
        missing = [f"--{k}" for k in REQUIRED_SHAPE if k not in given]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}: give every one of --layers, --hidden, "
                             f"--heads, --vocab, --seq, or --model NAME ({', '.join(MODELS)})")
        return ModelShape(name="custom", **given)
    base = model(args.model)
    if not given:
        return base
    return dataclasses.replace(base, name=f"{base.name} (modified)", **given)


def build_training(args) -> Training:
    tokens = parse_count(args.tokens) if args.tokens is not None else None
    if tokens is None and args.model is not None:
        tokens = TRAINED_TOKENS.get(model(args.model).name)
    dropout = args.dropout
    if dropout is None:
        dropout = config.default_dropout(args.model or "custom")     # the one default, as Training's
    return Training(micro_batch=args.micro_batch, global_batch=args.global_batch, tokens=tokens,
                    precision=args.precision, optimizer=args.optimizer, dropout=dropout)


def build_parallel(args, m: ModelShape) -> Parallel:
    tp, pp = args.tp, args.pp
    for flag, v in (("--tp", tp), ("--pp", pp), ("--dp", args.dp), ("--gpus", args.gpus)):
        if v is not None and v < 1:
            raise ValueError(f"{flag} must be >= 1, got {v}")
    if m.heads % tp or m.kv % tp:
        ok = [d for d in range(1, m.kv + 1) if m.kv % d == 0 and m.heads % d == 0]
        kv = f" and the {m.kv} kv heads" if m.kv != m.heads else ""
        raise ValueError(f"--tp {tp} must divide the {m.heads} attention heads{kv}; allowed: "
                         f"{', '.join(map(str, ok))}")
    if pp > m.layers:
        raise ValueError(f"--pp {pp} is more stages than the {m.layers} layers; allowed: 1-{m.layers}")
    dp = args.dp
    if args.gpus is not None:
        if dp is None:
            if args.gpus % (tp * pp):
                raise ValueError(f"--gpus {args.gpus} is not divisible by tp x pp = {tp} x {pp}")
            dp = args.gpus // (tp * pp)
        elif dp * tp * pp != args.gpus:
            raise ValueError(f"--dp x --tp x --pp = {dp} x {tp} x {pp} = {dp * tp * pp} must equal "
                             f"--gpus {args.gpus} (or leave out --dp)")
    return Parallel(dp=dp or 1, tp=tp, pp=pp, zero=args.zero, offload=args.offload,
                    sequence_parallel=args.sequence_parallel, schedule=args.schedule,
                    virtual_stages=args.virtual_stages, recompute=args.recompute, flash_attention=args.flash_attention,
                    dp_algorithm=args.dp_algorithm, bucket_mb=args.bucket_mb, prefetch=args.prefetch)


def build_hardware(args) -> Hardware:
    hw = hardware(args.gpu)
    changes = {}
    for flag, field in HW_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        name = "--" + flag.replace("_", "-")
        if flag in ("intra_bw", "inter_bw"):
            value = value.bytes_per_s          # a `Bandwidth`: parsed with the command line
        elif flag == "hbm":
            value = int(parse_bytes(value, name))
        changes[field] = value
    return dataclasses.replace(hw, name=f"{hw.name} (modified)", **changes) if changes else hw


def given_units(args) -> dict[str, str]:
    """Hardware field -> the unit its bandwidth flag was given in: the plan echoes it so."""
    return {f: getattr(args, f).unit for f in ("intra_bw", "inter_bw") if getattr(args, f, None) is not None}


def check_output(args) -> None:
    if args.days is not None and not args.days > 0:
        raise ValueError(f"--days must be > 0, got {args.days}")
    if args.top < 1:
        raise ValueError(f"--top must be >= 1, got {args.top}")
    if args.plot is not None:
        from ringzero.commands.plan_plot import check_path
        check_path(args.plot)


def search_dict(r) -> dict:
    """The "search" object of `--search --json`."""
    return {"evaluated": r.evaluated, "fitting": r.fitting, "seconds": r.seconds, "rate": r.rate,
            "best": [to_dict(b) for b in r.best], "why": list(r.why())}


def tokens_source(args, tr: Training) -> str:
    """Where the training tokens D come from, for the inputs table."""
    if args.tokens is not None:
        return "--tokens"
    if tr.tokens is not None:
        return f"{model(args.model).name}'s training run"
    return "20 per parameter, Chinchilla"


def run_recommend(e):
    """The decision flow of `ringzero.plan.search.recommend`, or the reason it has none."""
    try:
        # The plan's own memory settings, so that its "fits" agrees with the memory table.
        return recommend(e.model, e.training, e.hardware, e.parallel.gpus,
                         recompute=e.parallel.recompute, flash_attention=e.parallel.flash_attention)
    except ValueError as exc:
        return str(exc)


_FIELD_FLAGS = {"hbm_bytes": "--hbm", "target_mfu": "--mfu", **{f: "--" + f.replace("_", "-") for f in (
    "micro_batch", "global_batch", "tokens", "precision", "optimizer", "zero", "offload", "tp", "pp",
    "sequence_parallel", "schedule", "virtual_stages", "recompute", "dp_algorithm", "bucket_mb", "prefetch", "gpus_per_node",
    "intra_bw", "inter_bw", "compress", "powersgd_rank", "topk_fraction")}}


def as_flag(exc: ValueError) -> ValueError:
    """'zero=5 is not supported' -> '--zero=5 is not supported' (the config's field as its flag)."""
    text = str(exc)
    m = re.match(r"(?:hardware )?([a-z_]+)", text)
    if m and m.group(1) in _FIELD_FLAGS:
        return ValueError(_FIELD_FLAGS[m.group(1)] + text[m.end():])
    return exc


def _check_interleaved(tr: Training, par: Parallel) -> None:
    """The interleaved schedule's groups of pp micro-batches, as flags: the planner's message counts
    micro-batches, which the command line sets through --global-batch."""
    if par.schedule == "interleaved" and par.pp > 1 and tr.accumulation(par.dp) % par.pp:
        need = tr.micro_batch * par.dp * par.pp
        raise ValueError(f"--schedule interleaved runs the micro-batches in groups of pp: --global-batch "
                         f"({tr.sequences_per_step(par.dp)}) must be a multiple of micro-batch x dp x pp = {need}")


def _check_servers(servers: int, par: Parallel) -> None:
    if servers < 1:
        raise ValueError(f"--servers must be >= 1, got {servers}")
    if par.tp != 1 or par.pp != 1 or par.zero != 0 or par.offload != "none":
        raise ValueError(f"--servers plans plain data parallelism: it needs --tp 1 --pp 1 --zero 0 and no "
                         f"--offload, got --tp {par.tp} --pp {par.pp} --zero {par.zero} --offload {par.offload}")
    try:
        check_servers(servers, par.dp, " (the dp ranks)")        # the rule `ringzero train` applies
    except ValueError as exc:
        raise ValueError(f"--{exc}") from None                 # servers=4 -> --servers=4, as the other flags


def build_inputs(args) -> tuple[ModelShape, Training, Parallel, Hardware, Compression | None]:
    """The checked model, training, split, hardware and gradient compression the flags describe
    (ValueError naming the flag otherwise)."""
    m = build_model(args)
    try:
        tr = build_training(args)
        par, hw = build_parallel(args, m), build_hardware(args)
        _check_interleaved(tr, par)
        check(m, tr, par)                # the global batch against micro-batch x dp; the schedule
        comp = compression_for(args.compress, args.powersgd_rank, args.topk_fraction, m, par)
    except ValueError as exc:
        raise as_flag(exc) from None
    if args.servers is not None:
        _check_servers(args.servers, par)
    limits.check(m.layers, par.gpus, tr.accumulation(par.dp) if par.pp > 1 else None, flags=True)
    n, k = par.gpus, hw.gpus_per_node
    if not whole_nodes(n, k):
        raise ValueError(f"--gpus {n} does not fill whole nodes of --gpus-per-node {k}; allowed: a multiple "
                         f"of {k} GPUs, or a node size that divides {n} (or {n} or more: one node)")
    return m, tr, par, hw, comp


def run(args) -> int:
    with usage():
        check_output(args)
        m, tr, par, hw, comp = build_inputs(args)
    e = estimate(m, tr, par, hw, days=args.days)
    found = search(e.model, e.training, e.hardware, e.parallel.gpus, top=args.top) if args.search else None
    ps = ps_plan(e, args.servers) if args.servers is not None else None
    compressed = compression_plan(e, comp) if comp is not None else None
    if args.plot is not None:
        from ringzero.commands.plan_plot import plot
        plot(e, args.plot)
    if args.json:
        plan = to_dict(e)
        if ps is not None:
            plan["parameter_server"] = {**dataclasses.asdict(ps), "bottleneck": ps.bottleneck}
        plan.update({"compression": compressed.to_dict()} if compressed is not None else {})
        print(json.dumps(plan if found is None else {"plan": plan, "search": search_dict(found)}))
        return 0
    from ringzero.commands import plan_render
    plan_render.render(e, tokens_from=tokens_source(args, e.training), advice=run_recommend(e), found=found,
                       plot=args.plot, ps=ps, compression=compressed, units=given_units(args))
    return 0
