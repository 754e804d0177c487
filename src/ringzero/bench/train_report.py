"""The tables `ringzero bench train` prints: step times and model-state bytes of each variant beside
its torch peer, the pipeline comparisons, recomputation, and the performance targets."""

from __future__ import annotations

from ringzero.bench.train_job import PP_SCHEDULES


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def print_report(result: dict, console=None) -> None:
    from rich import box
    from rich.table import Table

    from ringzero.bench.comm_report import make_console
    console = console or make_console()
    s = result["settings"]
    m = s["model"]
    console.print(f"{result['nproc']} ranks, GPT {m['layers']} x {m['hidden']} (heads {m['heads']}, seq {m['seq']}), "
                  f"global batch {s['global_batch']}, fp32, {s['steps']} steps ({s['skip']} skipped); buckets: "
                  f"ringzero bucket_mb={s['ringzero_bucket_mb']:g}, DDP bucket_cap_mb={s['ddp_bucket_cap_mb']:g}; "
                  f"ringzero algorithm {s['algorithm']}; torch peers: {s['torch_optimizer']}")
    t = Table(title="step time (ms, median of the max over ranks) and model-state bytes per rank (MiB)",
              title_justify="left", box=box.SIMPLE_HEAD, caption_justify="left",
              caption="torch's peers communicate inside backward; 'comm wait' is ringzero's wait after backward "
                      "(and after the step). held: weights + gradients + optimizer state after backward; peak: held + "
                      "the most gathered weights and unreduced gradients alive while a layer computes")
    for col in ("variant", "step", "forward", "backward", "comm wait", "optimizer", "held", "peak", "max |Δloss|"):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for suite in ("dp", "zero3", "tp", "compress"):
        r = result.get(suite)
        if r is None:
            continue
        if "errors" in r:
            for name, err in r["errors"].items():
                t.add_row(name, f"[red]not possible: {err}[/red]")
            continue
        for i, (name, v) in enumerate(r["variants"].items()):
            ph, st = v["phases"], v["states"]
            ms = [v["step_s"]] + [ph[k] for k in ("forward", "backward", "comm", "optimizer")]
            t.add_row(name, *(f"{x * 1e3:.1f}" for x in ms), _mib(st["steady"]), _mib(st["peak"]),
                      f"{r['max_loss_diff']:.1e}" if i else "")
    console.print(t)
    _print_compression(result, console)
    _print_pipelines(result, console)
    if "recompute" in result:
        r = result["recompute"]
        sh = r["shape"]
        console.print(f"recomputation on 1 rank: GPT {sh['layers']} x {sh['hidden']}, heads {sh['heads']}, "
                      f"seq {sh['seq']}, batch {r['batch']}; a·s² terms are {r['attention_share']:.0%} of a block's "
                      "activations")
        t = Table(box=box.SIMPLE_HEAD)
        for col in ("recompute", "step (ms)", "forward", "backward", "activations (MiB)", "planner (MiB)", "saved",
                    "extra time", "max |Δloss|"):
            t.add_column(col, justify="left" if col == "recompute" else "right")
        for mode, v in r["modes"].items():
            t.add_row(mode, f"{v['step_s'] * 1e3:.1f}", f"{v['phases']['forward'] * 1e3:.1f}",
                      f"{v['phases']['backward'] * 1e3:.1f}", _mib(v["activations"]), _mib(v["predicted_activations"]),
                      f"{v['saved']:.1%}" if "saved" in v else "", f"{v['extra_time']:+.1%}" if "saved" in v else "",
                      f"{v['max_loss_diff']:.1e}" if "saved" in v else "")
        console.print(t)
    t = Table(title="performance targets", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("target", "measured", "bound", "met"):
        t.add_column(col, justify="left" if col == "target" else "right")
    for row in result["targets"]:
        fmt = "{:.1%}" if "saved" in row["key"] or "extra" in row["key"] else "{:.2f}"
        met = {True: "[green]met[/green]", False: "[red]not met[/red]", None: "[red]not possible[/red]"}
        t.add_row(row["what"], "-" if row["value"] is None else fmt.format(row["value"]),
                  f"{row['op']} {fmt.format(row['bound'])}", met[row["met"]])
    console.print(t)


def _print_compression(result: dict, console) -> None:
    """The compress suite's pairing, start steps and both losses after the N steps."""
    r = result.get("compress")
    if r is None or "errors" in r:
        return
    ours, peer = r["variants"]
    opt = f" rank {r['powersgd_rank']}" if r["powersgd_rank"] else f" fraction {r['topk_fraction']:g}" if r["topk_fraction"] else ""
    torch_side = f"DDP + {r['torch_hook']} (from step {r['torch_start']})" if r["torch_hook"] else \
        f"plain DDP (torch has no {r['scheme']} hook: the losses differ by what it drops)"
    la = r["loss_after"]
    console.print(f"compression {r['scheme']}{opt}: ringzero dp (from step {r['start']}) against {torch_side}; "
                  f"loss after {result['settings']['steps']} steps {la[ours]:.4f} ({ours}) vs {la[peer]:.4f} ({peer}); "
                  f"step time ratio {r['time_ratio']:.2f} (paired {r['paired_time_ratio']:.2f}). ringzero's hook "
                  "sums, torch's averages; ringzero's optimizer divides by the ranks")


def _print_pipelines(result: dict, console) -> None:
    """One row per pipeline variant: torch's schedules run a whole step in one call, so only the
    step time, and ringzero's wait for messages, are shown."""
    from rich import box
    from rich.table import Table
    suites = [s for s in PP_SCHEDULES if f"pp_{s}" in result]
    if not suites:
        return
    s = result["settings"]["pipeline"]
    t = Table(title=f"pipeline parallelism over {result['nproc']} stages: GPT {s['layers']} x "
                    f"{result['settings']['model']['hidden']}, m = {s['micro_batches']} micro-batches of "
                    f"{s['micro_batch']}, interleaved with v = 2 (ms, median of the max over ranks)",
              title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("variant", "step", "pipeline wait", "max |Δloss|"):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for name in suites:
        r = result[f"pp_{name}"]
        if "errors" in r:
            for variant, err in r["errors"].items():
                t.add_row(variant, f"[red]not possible: {err}[/red]")
            continue
        for i, (variant, v) in enumerate(r["variants"].items()):
            wait = v["phases"].get("pipeline_wait")
            t.add_row(variant, f"{v['step_s'] * 1e3:.1f}", "" if wait is None else f"{wait * 1e3:.1f}",
                      f"{r['max_loss_diff']:.1e}" if i else "")
    console.print(t)
