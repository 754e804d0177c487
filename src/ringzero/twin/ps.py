"""A parameter-server run's report: its byte twins, the waiting twin, and a table of every rank.

- Push and pull bytes per worker per step: `plan.strategies.param_server.worker_bytes` (the model's gradient
  and parameter bytes in the training precision) against the meter's "ps/push" and "ps/pull" at
  the measured step.
- Bytes a server holds (`server_state_bytes`: its range, Adam's moments, a 16-bit run's fp32 master)
  against the sizes of its tensors.
- Bytes into the busiest server per step: W·r_max·itemsize (`server_ingress`, the incast) against
  what its meter received over the run divided by the steps; ε, the range split's imbalance.
- Waiting under sync: worker i waits for the slowest, max_j c_j − c_i, with c its measured compute
  (the straggler's sleep included). Measured where it happens: how long the server held the
  worker's push until the step's last push arrived (`parallel.ps.server`'s `held`), apart from
  the time its bytes and the server's update took. Medians over the steady steps.
"""

from __future__ import annotations

import statistics

from ringzero.plan.strategies.param_server import (imbalance, server_ingress, server_link_seconds, server_ranges, server_state_bytes,
                                 step_seconds, wait_seconds, worker_bytes, worker_link_seconds)
from ringzero.run.config import TrainConfig
from ringzero.run.result import RankResult
from ringzero.twin.twin import Twin

STEADY = 2
"""Warm-up steps left out of the medians (as the engine's step time)."""


def split(results: list[RankResult]) -> tuple[list[RankResult], list[RankResult]]:
    return [r for r in results if r.role == "worker"], [r for r in results if r.role == "server"]


def _op(r: RankResult, key: str, field: str) -> int:
    return r.traffic.get("ops", {}).get(key, {}).get(field, 0)


def _steady(xs: list[float]) -> list[float]:
    return xs[min(STEADY, len(xs) - 1):]


def waits(workers: list[RankResult]) -> tuple[list[float], list[float]]:
    """(predicted, measured) seconds each worker waits for the others per step (sync's model).
    Not in the model: the server answers a step's workers one after another, so a later worker
    starts its next step one reply later and the ones before it wait that much more (a few ms on
    loopback for nano: measured runs a few per cent above a small imbalance, in the wait twins of
    `ringzero train --nproc 4 --strategy ps --servers 2 --steps 60`)."""
    computes = [statistics.median(_steady(w.ps["computes"])) for w in workers]
    return wait_seconds(computes), [statistics.median(_steady(w.ps["waits"])) for w in workers]


def step_twin(cfg: TrainConfig, workers: list[RankResult], servers: list[RankResult], numel: int) -> list[Twin]:
    """Sync over an emulated network with every rank its own node (each its own link, as the
    planner assumes): the slowest worker's compute, the pulls through the busier link and the last
    worker's push (`comm_seconds` "staggered": the engine answers once a step's pushes are applied,
    one worker after another), and the server's update (measured on the server, as the all-reduce twin's optimizer is probed)."""
    if cfg.ps.ps_mode != "sync" or cfg.parallel.emulate_inter_node is None or cfg.parallel.ranks_per_node != 1:
        return []
    gbps, latency_us = cfg.parallel.emulate_inter_node
    compute = max(statistics.median(_steady(w.ps["computes"])) for w in workers)
    update = max(statistics.median(_steady(s.ps["update_s"])) for s in servers)
    args = (numel, cfg.value_bytes, len(workers), len(servers))
    link = (gbps * 1e9, latency_us * 1e-6)
    busier = "server" if server_link_seconds(*args, *link) >= worker_link_seconds(numel, cfg.value_bytes,
                                                                                    len(servers), *link) else "worker"
    step = step_seconds(*args, compute_s=compute, link_bw=link[0], link_alpha=link[1], schedule="staggered")
    measured = max(w.step_time for w in workers)
    return [Twin(f"step over {gbps:g} GB/s links (compute, {busier} link {(step - compute) * 1e3:.0f} ms, update)",
                 step + update, measured, "s")]


def twins(cfg: TrainConfig, world: int, results: list[RankResult]) -> list[Twin]:
    workers, servers = split(results)
    numel = sum(n for n, *_ in workers[0].buckets)
    push, pull = worker_bytes(numel, cfg.value_bytes)
    ingress = server_ingress(numel, cfg.value_bytes, len(workers), len(servers))
    rows = [Twin("push bytes per worker per step", push, max(_op(w, "ps/push", "bytes_sent") for w in workers), "bytes"),
            Twin("pull bytes per worker per step", pull, max(_op(w, "ps/pull", "bytes_recv") for w in workers), "bytes"),
            Twin("bytes into the busiest server per step", max(ingress),
                 max(_op(s, "ps/push", "bytes_recv") for s in servers) / cfg.training.steps, "bytes"),
            Twin("parameters and optimizer states held by the busiest server",
                 max(server_state_bytes(numel, cfg.value_bytes, len(servers))),
                 max(s.held["params"] + s.held["optimizer"] for s in servers), "bytes")]
    rows += step_twin(cfg, workers, servers, numel)
    if cfg.ps.ps_mode == "sync" and cfg.faults.straggler is not None and len(workers) > 1:
        predicted, measured = waits(workers)
        i = max(range(len(workers)), key=lambda k: predicted[k])      # the most waiting worker
        rows.append(Twin(f"waiting for the straggler (worker {i}, per step)", predicted[i], measured[i], "s"))
    return rows


def rank_rows(cfg: TrainConfig, results: list[RankResult]) -> list[dict]:
    """Per rank: role, compute, waiting, communication and staleness (servers: of their updates)."""
    workers, servers = split(results)
    rows = []
    if workers:
        predicted, measured = waits(workers) if len(workers) > 1 else ([0.0], [0.0])
        for w, p, m in zip(workers, predicted, measured):
            rows.append({"rank": w.rank, "role": "worker", "compute_s": statistics.median(_steady(w.ps["computes"])),
                         "waiting_s": m, "predicted_waiting_s": p,
                         "comm_s": statistics.median(_steady(w.ps["comms"]))})
    for s in servers:
        st = s.ps["staleness"]
        rows.append({"rank": s.rank, "role": "server", "updates": s.ps["updates"], "waiting_s": s.ps["wait_s"],
                     "busy_s": s.ps["busy_s"], "staleness_mean": statistics.fmean(st) if st else 0.0,
                     "staleness_max": max(st, default=0)})
    return rows


def render(cfg: TrainConfig, world: int, results: list[RankResult], console) -> dict:
    """Print the twins and the per-rank table; return both as plain data."""
    from rich.table import Table

    from ringzero.twin.report import render as render_twins
    rows = twins(cfg, world, results)
    render_twins(rows, console)
    workers, servers = split(results)
    numel = sum(n for n, *_ in workers[0].buckets)
    eps = imbalance(server_ranges(numel, len(servers)))
    table = Table(title=f"parameter server, {cfg.ps.ps_mode}"
                        + (f" S={cfg.ps.staleness}" if cfg.ps.ps_mode == "ssp" else "")
                        + f": {len(workers)} workers, {len(servers)} servers (range imbalance ε = {eps:.2e}); "
                          "medians of steady steps, servers over the run")
    for col in ("rank", "role", "compute", "waiting (predicted)", "communication", "staleness mean / max"):
        table.add_column(col, justify="left" if col == "role" else "right")
    per_rank = rank_rows(cfg, results)
    for r in per_rank:
        if r["role"] == "worker":
            table.add_row(str(r["rank"]), "worker", f"{r['compute_s'] * 1e3:.1f} ms",
                          f"{r['waiting_s'] * 1e3:.1f} ms ({r['predicted_waiting_s'] * 1e3:.1f})",
                          f"{r['comm_s'] * 1e3:.1f} ms", "")
        else:
            table.add_row(str(r["rank"]), "server", f"{r['busy_s']:.2f} s busy", f"{r['waiting_s']:.2f} s", "",
                          f"{r['staleness_mean']:.2f} / {r['staleness_max']}")
    console.print(table)
    return {"twins": {t.name: t.to_json() for t in rows}, "ranks": per_rank, "imbalance": eps}


def report(cfg: TrainConfig, world: int, results: list[RankResult], path: str | None, console, tables=None) -> None:
    """`ringzero train --strategy ps`'s output: the validation losses, `render` (on `tables`, when
    another console: --quiet's, which shows nothing), and the JSON report (`report.header`'s keys,
    as every run's, then the twins, the ranks and the imbalance)."""
    import json

    from ringzero import outputs
    from ringzero.twin.report import header, validation_line
    console.print(validation_line(cfg, results[0].val))
    data = render(cfg, world, results, console if tables is None else tables)
    if path:
        outputs.write_text(path, json.dumps({**header(cfg, world, results), **data}, indent=1))
        console.print(f"wrote {path}")
