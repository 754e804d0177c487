"""Tables of `ringzero plan` (rich). Formatting only: every number comes from `ringzero.plan`.

Units: GB = 10⁹ bytes and GiB = 2³⁰ bytes (both are shown for memory; every other header names
its unit), seconds, FLOPs, tokens.
"""

from __future__ import annotations

import os

from rich import box
from rich.console import Console
from rich.table import Table

from ringzero.plan.strategies.compare import strategy_comparison
from ringzero.plan.estimate import Estimate
from ringzero.plan.strategies.memory import state_bytes
from ringzero.plan.strategies.sharding import by_zero
from ringzero.plan.search.why import schedule_label
from ringzero.plan.model.shapes import approx_params
from ringzero.plan.step_time import op_seconds
from ringzero.plan.units import rate_text
from ringzero.plan.words import gpus, plural

GB, GiB = 1e9, 2**30
UNITS = "GB = 10⁹ bytes, GiB = 2³⁰ bytes; bytes on the wire are what the busiest GPU sends"


def num(v: float) -> str:
    """A readable number: thousands separators when large, significant digits when small."""
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}" if a >= 0.01 else f"{v:.2e}"


def gb(v: float) -> str:
    return num(v / GB)


def gib(v: float) -> str:
    return num(v / GiB)


def seconds(v: float) -> str:
    return "0" if v == 0 else f"{v:.4g}"


def short(n: float) -> str:
    """2e12 -> '2 T', 6738415616 -> '6.74 B' (powers of 1000)."""
    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g} {suffix}"
    return f"{n:.3g}"


def count(n: float) -> str:
    """6738415616 -> '6,738,415,616 (6.74 B)'."""
    return f"{n:,.0f} ({short(n)})" if n >= 1000 else f"{n:,.0f}"


def _table(title: str, *columns: str, right: tuple[int, ...] = ()) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, title_style="bold")
    for i, c in enumerate(columns):
        t.add_column(c, justify="right" if i in right else "left")
    return t


def _console() -> Console:
    """The terminal's width; 160 columns when piped (rich's 80 would wrap every table) unless
    COLUMNS says otherwise."""
    c = Console(highlight=False)
    return c if c.is_terminal or "COLUMNS" in os.environ else Console(highlight=False, width=160)


def inputs(e: Estimate, tokens_from: str, units: dict[str, str] | None = None) -> Table:
    """The inputs; `units`: hardware field -> the bandwidth unit its flag was given in."""
    m, tr, p, hw = e.model, e.training, e.parallel, e.hardware
    t = _table("Inputs", "", "")
    t.show_header = False
    shape = (f"L={m.layers} h={m.hidden} heads={m.heads} kv_heads={m.kv} V={m.vocab} s={m.seq} "
             f"ffn={m.ffn_dim} gated={m.gated} bias={m.bias} tied={m.tied} {m.positions} {m.norm}")
    t.add_row("model", f"{m.name}: {shape}")
    micro = plural(tr.accumulation(p.dp), "micro-batch", "micro-batches")
    t.add_row("training", f"micro-batch {tr.micro_batch}, global batch "
              f"{plural(tr.sequences_per_step(p.dp), 'sequence')} ({micro} per rank), {short(e.tokens)} tokens "
              f"({tokens_from}), {tr.precision}, {tr.optimizer}, dropout {tr.dropout}")
    t.add_row("parallel", f"{gpus(p.gpus)} = dp {p.dp} x tp {p.tp} x pp {p.pp}; ZeRO-{p.zero}, offload "
              f"{p.offload}, sequence-parallel {p.sequence_parallel}, schedule {schedule_label(p)}, "
              f"recompute {p.recompute}, flash-attention {p.flash_attention}, dp-algorithm "
              f"{p.dp_algorithm}, buckets {p.bucket_mb:g} MiB")
    t.add_row("hardware", f"{hw.name}: {hw.peak_flops / 1e12:g} TFLOP/s peak, HBM {gb(hw.hbm_bytes)} GB "
              f"({gib(hw.hbm_bytes)} GiB), NVLink {rate_text(hw.intra_bw, (units or {}).get('intra_bw', 'GB/s'))}, "
              f"network {rate_text(hw.inter_bw, (units or {}).get('inter_bw', 'GB/s'))} per GPU per direction, "
              f"{gpus(hw.gpus_per_node)} per node, "
              f"target MFU {hw.target_mfu:.0%}")
    return t


def size_and_compute(e: Estimate) -> Table:
    pc, hw, p = e.params, e.hardware, e.parallel
    t = _table("Size and compute", "quantity", "value", "note", right=(1,))
    for k in ("embedding", "positions", "attention", "mlp", "norms", "head"):
        t.add_row(f"params: {k}", f"{getattr(pc, k):,}", f"{getattr(pc, k) / pc.total:.1%}")
    t.add_row("params (exact)", count(pc.total), f"{pc.per_layer:,} per layer")
    approx = approx_params(e.model.layers, e.model.hidden)
    t.add_row("approximation: N ≈ L(12h²+5h)", count(approx), f"{approx / pc.total:.3f} x exact")
    per_token = {"full": "8N (full recompute)", "selective": "6N + 4Lsh (selective recompute)"}
    t.add_row("FLOPs per step", f"{e.flops_per_step:.3e}",
              f"{per_token.get(p.recompute, '6N')} x {plural(e.tokens_per_step, 'token', spec=',')}")
    formula = {"full": "8ND", "selective": "(6N + 4Lsh)·D"}.get(p.recompute, "6ND")
    t.add_row("FLOPs total", f"{e.flops_total:.3e}", f"{formula}, D = {short(e.tokens)} tokens")
    t.add_row("training days", num(e.days_at_target_mfu),
              f"{gpus(p.gpus)} at the target MFU {hw.target_mfu:.0%} (6ND model FLOPs)")
    t.add_row("training days (modelled step)", num(e.tokens / e.tokens_per_s / 86400),
              f"at {num(e.tokens_per_s)} tokens/s")
    if e.days is not None:
        t.add_row(f"GPUs for {e.days:g} days", f"{e.gpus_for(e.days):,}",
                  f"{hw.name} at {hw.target_mfu:.0%} MFU")
    return t


def memory(e: Estimate) -> Table:
    mem, hw, tr, p = e.memory, e.hardware, e.training, e.parallel
    sb = state_bytes(tr.precision, tr.optimizer)
    t = _table("Memory per GPU", "", "GB (10⁹ B)", "GiB (2³⁰ B)", "note", right=(1, 2))
    share, s = (f" / dp {p.dp}" if p.dp > 1 else ""), by_zero(p.zero)
    notes = {"params": f"{sb.weights} B/param / (tp·pp){share if s.shard_params else ''}",
             "grads": f"{sb.grads} B/param / (tp·pp){share if s.shard_grads else ''}",
             "optimizer": f"{sb.optimizer} B/param / (tp·pp){share if s.shard_optimizer else ''}"
                          + (f", offloaded to {p.offload}" if p.offload != "none" else ""),
             "activations": f"micro-batch {tr.micro_batch}, recompute {p.recompute}",
             "buffers": "gradient buckets / ZeRO-3 layers / pipeline send-receive"}
    for k, note in notes.items():
        t.add_row(k, gb(getattr(mem, k)), gib(getattr(mem, k)), note)
    t.add_row("total", gb(mem.total), gib(mem.total), f"{mem.total / hw.hbm_bytes:.0%} of HBM",
              style="bold")
    if mem.offloaded:
        t.add_row("(offloaded)", gb(mem.offloaded), gib(mem.offloaded), f"in {p.offload}, not in total")
    t.add_row("HBM", gb(hw.hbm_bytes), gib(hw.hbm_bytes), hw.name)
    t.add_row("fits", "yes" if e.fits else "NO", "", "" if e.fits else
              f"short by {gb(mem.total - hw.hbm_bytes)} GB", style="green" if e.fits else "red")
    return t


def comm_ops(e: Estimate) -> Table:
    t = _table("Communication per GPU per step", "kind", "what", "collective", "algorithm", "group",
               "link", "calls", "GB/call", "GB/step", "GiB/step", "seconds", "overlaps",
               right=tuple(range(4, 11)))
    t.columns[1].no_wrap = t.columns[2].no_wrap = True
    for o in e.ops:
        per_call = o.volume().bytes_sent
        t.add_row(o.kind, o.what, o.collective, o.algorithm, str(o.group),
                  "network" if o.spans_nodes else "nvlink", f"{o.calls:,}", gb(per_call),
                  gb(o.bytes_sent), gib(o.bytes_sent), seconds(op_seconds(o, e.hardware)), o.overlap)
    if not e.ops:
        t.add_row("-", "no communication (one GPU)", *[""] * 10)
    return t


def comparison(e: Estimate) -> Table:
    t = _table("Per strategy: the textbook formula vs the exact bytes (Φ = gradient bytes per "
               "model-parallel rank)", "strategy", "group", "scope", "formula", "formula GB", "exact",
               "exact GB", "exact / formula", right=(1, 4, 6, 7))
    for r in strategy_comparison(e.model, e.training, e.parallel, e.hardware.gpus_per_node):
        letter = {"TP": "t", "PP": "p"}.get(r.strategy[:2], "N")
        group = f"{letter}={r.group}" + (" (what if)" if r.what_if else "")
        t.add_row(r.strategy, group, r.scope, r.seed_formula, gb(r.seed_bytes), r.exact_formula,
                  gb(r.exact_bytes), f"{r.ratio:.3f}")
    return t


def timing(e: Estimate) -> Table:
    s, hw = e.time, e.hardware
    t = _table("Time per step", "", "seconds", "note", right=(1,))
    peak = hw.matmul_flops(e.training.precision)
    t.add_row("forward", seconds(s.forward), f"matmuls at up to {hw.gemm_efficiency:.0%} of "
              f"{peak / 1e12:g} TFLOP/s, the rest at {hw.hbm_bw / 1e12:g} TB/s")
    again = "incl. recomputation" if e.parallel.recompute != "none" else ""
    t.add_row("backward", seconds(s.backward), again)
    t.add_row("compute", seconds(s.compute), "")
    kinds = ", ".join(f"{k} {seconds(v)}" for k, v in s.comm_by_kind.items())
    t.add_row("communication (all)", seconds(s.comm), kinds)
    t.add_row("communication (exposed)", seconds(s.exposed_comm), "not hidden behind compute")
    t.add_row("pipeline bubble", seconds(s.bubble), f"{s.bubble_fraction:.1%} of the pipeline "
              f"({schedule_label(e.parallel)})" if e.parallel.pp > 1 else "")
    t.add_row("optimizer", seconds(s.optimizer), "on the GPU" if s.optimizer else "")
    t.add_row("offload", seconds(s.offload), e.parallel.offload if s.offload else "")
    t.add_row("step", seconds(s.step), plural(e.tokens_per_step, "token", spec=","), style="bold")
    t.add_row("tokens/s", num(e.tokens_per_s), f"{num(e.tokens_per_s / e.parallel.gpus)} per GPU")
    t.add_row("implied MFU", f"{e.mfu:.1%}", f"target {hw.target_mfu:.0%} (6N FLOPs per token)")
    return t


def ps_table(ps) -> Table:
    t = _table(f"Parameter server: the {ps.workers} dp ranks as workers of {ps.servers} servers, per step "
               "(synchronous; each server on its own network link)", "", "value", "note", right=(1,))
    t.add_row("push per worker", gb(ps.push_bytes), "its whole gradient")
    t.add_row("pull per worker", gb(ps.pull_bytes), "the whole parameter vector")
    t.add_row("into the busiest server", gb(ps.server_ingress_bytes),
              f"workers x its range (the incast); range imbalance ε = {ps.imbalance:.2e}")
    t.add_row("held by the busiest server", gb(ps.server_state_bytes), "its range: parameters, master, optimizer")
    t.add_row("device memory per worker", gb(ps.worker_memory_bytes), "the plan's, less the optimizer states")
    t.add_row("server link", seconds(ps.server_link_s), "pushes in, pulls out (full duplex)")
    t.add_row("worker link", seconds(ps.worker_link_s), f"bottleneck: the {ps.bottleneck}")
    t.add_row("step", seconds(ps.step_s), "compute + the busier link", style="bold")
    t.add_row("step with the all-reduce", seconds(ps.allreduce_step_s),
              f"{gb(ps.allreduce_bytes)} GB sent per rank")
    return t


def compression_table(cp, e: Estimate) -> Table:
    """`plan.strategies.compression_plan`'s figures: the dp gradient reduction without and with the scheme."""
    c, hw, p, inf = cp.compression, e.hardware, e.parallel, float("inf")
    label = {"powersgd": f"PowerSGD rank {c.rank}", "topk": f"top-k {c.fraction:g}"}.get(c.scheme, f"{c.scheme} cast")
    where = f", pipeline stage {cp.stage}" if p.pp > 1 else ""
    t = _table(f"Gradient compression: {label} on the {cp.strategy} gradient reduction of {cp.ranks} dp ranks over "
               f"{cp.link}{where}, per GPU per step", "", "uncompressed", "compressed", "note", right=(1, 2))
    a, b = cp.plain, cp.wire
    t.add_row("calls", f"{a.calls:,}", f"{b.calls:,}", f"{plural(cp.buckets, 'bucket')} of up to {p.bucket_mb:g} MiB")
    t.add_row("bytes sent, GB", gb(a.bytes), gb(b.bytes), f"ratio {cp.ratio:.3g}{' (none saved)' if cp.ratio <= 1 else ''}")
    t.add_row(f"bytes over {cp.link}, GB", gb(a.link_bytes), gb(b.link_bytes), f"at {cp.link_bw / GB:g} GB/s")
    t.add_row("seconds on the wire", seconds(a.seconds), seconds(b.seconds), "α-β, before overlap with backward")
    t.add_row("of which latency", seconds(a.latency_seconds), seconds(b.latency_seconds),
              f"rounds·α: {seconds(cp.extra_latency_s)} s more with {b.calls - a.calls:+,} calls")
    peak, bw = hw.matmul_flops(e.training.precision) * hw.gemm_efficiency, hw.hbm_bw * hw.memory_efficiency
    t.add_row("compute seconds", "", seconds(cp.compute_s), f"roofline: max({cp.flops:.3g} FLOPs at {peak / 1e12:.3g} "
              f"TFLOP/s, {gb(cp.touched_bytes)} GB touched at {bw / 1e12:.3g} TB/s)")
    saved = cp.saved_s
    t.add_row("saved per step" if saved >= 0 else "lost per step", "", seconds(abs(saved)),
              "uncompressed - compressed - compute seconds", style="green" if saved > 0 else "red")
    be = cp.break_even_bw
    t.add_row(f"break-even {cp.link} bandwidth", "", "never" if be is None else "any" if be == inf else
              f"{be / GB:.3g} GB/s", f"pays below it; here {cp.link_bw / GB:g} GB/s" if be is not None and be < inf
              else "saves no bytes over it" if be is None else "pays at any bandwidth")
    size = cp.break_even_bucket_bytes
    t.add_row("break-even bucket", "", "-" if size is None else "none" if size == inf else f"{size / 2**20:.3g} MiB",
              "no extra calls to repay" if size is None else "no bucket size pays here" if size == inf else
              f"pays on buckets above it; these are up to {p.bucket_mb:g} MiB")
    if c.stateful:
        t.add_row("held between steps, GB", "", gb(sum(cp.state.values())), "error-feedback residual"
                  + (" and Q" if cp.state["q"] else ""))
    return t


def advice_table(rec) -> Table | str:
    if isinstance(rec, str):
        return f"[yellow]recommendation unavailable: {rec}[/]"
    t = _table(f"Recommendation: {rec.strategy}", "question", "answer", "because")
    for question, answer, because in rec.steps:
        t.add_row(question, answer, because)
    return t


def search_table(found) -> Table:
    batch = getattr(found, "global_batch", 0)
    on = f" on {gpus(found.best[0].parallel.gpus)}" + (f", {plural(batch, 'sequence', spec=',')} per step" if batch else "")
    t = _table(f"Search: the {len(found.best)} fastest configurations that fit{on}", "#", "dp", "tp",
               "pp", "zero", "micro-batch", "recompute", "sp", "memory GB", "step s", "tokens/s", "MFU",
               right=(0, 1, 2, 3, 4, 5, 8, 9, 10, 11))
    for i, b in enumerate(found.best, 1):
        p = b.parallel
        t.add_row(str(i), str(p.dp), str(p.tp), str(p.pp), str(p.zero), str(b.training.micro_batch),
                  p.recompute, "yes" if p.sequence_parallel else "no", gb(b.memory.total),
                  seconds(b.time.step), num(b.tokens_per_s), f"{b.mfu:.1%}")
    return t


def render(e: Estimate, *, tokens_from: str, advice=None, found=None, plot: str | None = None,
           console: Console | None = None, ps=None, compression=None, units: dict[str, str] | None = None) -> None:
    """Print every section of the plan (and the recommendation and search, when given)."""
    c = console or _console()
    c.print(f"[dim]{UNITS}[/]")
    for table in (inputs(e, tokens_from, units), size_and_compute(e), memory(e), comm_ops(e),
                  comparison(e), timing(e)):
        c.print(table)
    if ps is not None:
        c.print(ps_table(ps))
    if compression is not None:
        c.print(compression_table(compression, e))
    if advice is not None:
        c.print(advice_table(advice))
    if found is not None:
        if found.best:
            c.print(search_table(found))
        else:
            c.print("[bold]Search[/]: no configuration fits")
        for line in found.why():
            c.print(f"  {line}")
        c.print(f"evaluated {plural(found.evaluated, 'config', spec=',')} in {found.seconds:.2f} s "
                f"({found.rate:,.0f} configs/s), {found.fitting:,} fit in memory")
    if plot:
        c.print(f"wrote {plot}")
