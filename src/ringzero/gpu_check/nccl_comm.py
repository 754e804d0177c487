"""ringzero's collectives against NCCL's own, on CUDA tensors, under torchrun.

    torchrun --standalone --nproc-per-node 2 -m ringzero.gpu_check.nccl_comm --out nccl.json

`ringzero bench comm` cannot be this comparison: it spawns its own local gloo ranks on CPU
tensors (`launch.spawn`), so its "torch" rows are gloo's even on a GPU machine. Here each rank
joins torchrun's job through `launch.run` (NCCL when CUDA is available, gloo otherwise, and the
rank's device set from LOCAL_RANK), builds `bench.comm_ranks.Cell`'s buffers on its device, and for
every algorithm of each collective checks one call element by element against the exact result,
then times `iters` repetitions of `inner` calls between a barrier and a device synchronisation
(NCCL's calls return before their kernels finish; without it the time is the launch's). A row's
time is the median repetition of the max over ranks, as `bench comm`'s. An algorithm that raises
is a row with its error and the run goes on. Last, one all-reduce with the metadata handshake on
(`comm.check`) says whether `--checks` can run on this backend. Rank 0 rewrites the report after
every cell ("complete" false until the end), so a run stopped by its timeout keeps what it measured.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringzero import comm, launch, outputs
from ringzero.bench.comm import bandwidths, parse_sizes
from ringzero.bench.comm_ranks import Cell, element_count
from ringzero.comm import registry
from ringzero.cli import Parser
from ringzero.errors import UsageError, usage
from ringzero.plan.comm.algorithms import spans_nodes_ok
from ringzero.rank_io import in_torchrun

SCHEMA = "ringzero.gpu-nccl-comm/1"
DEFAULT_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
PEER = "torch"
"""The algorithm name of the backend's own collective (here NCCL's)."""
WARMUP = 2
FAILED = -1.0
"""A failed algorithm's time in the max over ranks (every real time is above it)."""


@dataclass(frozen=True)
class Job:
    collectives: tuple[str, ...] = DEFAULT_COLLECTIVES
    sizes: tuple[int, ...] = (64 * 2**10, 4 * 2**20, 64 * 2**20)
    """Bytes of the whole buffer, as `bench comm`'s --sizes."""
    dtype: str = "float32"
    iters: int = 5
    inner: int = 10
    out: str | None = None

    def __post_init__(self) -> None:
        for c in self.collectives:
            registry.check_name(c, PEER)
        if not self.collectives or not self.sizes:
            raise ValueError("the job needs at least one collective and one size")
        if self.iters < 1 or self.inner < 1:
            raise ValueError(f"--iters and --inner must be >= 1, got {self.iters} and {self.inner}")
        if not isinstance(getattr(torch, self.dtype, None), torch.dtype):
            raise ValueError(f"unknown --dtype {self.dtype!r}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device(group) -> torch.device:
    """The rank's device: its CUDA device under NCCL (torchrun_job set it from LOCAL_RANK)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _time(cell: Cell, algorithm: str, job: Job, device: torch.device) -> tuple[list[float], int, str | None]:
    """(seconds per call of each repetition, this rank's wrong elements, error) of one algorithm."""
    try:
        cell.reset()
        cell.call(algorithm)
        _sync(device)
        wrong = cell.wrong()
        cell.quiesce()
        for _ in range(WARMUP):
            cell.call(algorithm)
        reps = []
        for _ in range(job.iters):
            _sync(device)
            dist.barrier(group=cell.group)
            t0 = time.perf_counter()
            for _ in range(job.inner):
                cell.call(algorithm)
            _sync(device)
            reps.append((time.perf_counter() - t0) / job.inner)
        return reps, wrong, None
    except Exception as exc:        # recorded in the row; the next algorithm still runs
        return [FAILED] * job.iters, 0, _error(exc)


def _reduced(group, values: list[float], op, device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op, group=group)
    return t.tolist()


def cell_rows(group, collective: str, size: int, job: Job, device: torch.device) -> list[dict]:
    """Every algorithm of `collective` (and the backend's own) on one buffer of `size` bytes."""
    n, dtype = dist.get_world_size(group), getattr(torch, job.dtype)
    count = element_count(collective, size, dtype.itemsize, n)
    algorithms = [a for a in registry.algorithms(collective) if spans_nodes_ok(a, n, None)] + [PEER]
    with torch.device(device):          # the cell's buffers only: ringzero's own scratch is its business
        cell = Cell(collective, group, count, dtype)
    runs = [_time(cell, a, job, device) for a in algorithms]
    reps = _reduced(group, [t for r, _, _ in runs for t in r], dist.ReduceOp.MAX, device)
    # Summed over ranks: the wrong elements, then how many ranks each algorithm failed on.
    counts = _reduced(group, [float(w) for _, w, _ in runs] + [float(e is not None) for _, _, e in runs],
                      dist.ReduceOp.SUM, device)
    rows = []
    for i, (a, (_, _, err)) in enumerate(zip(algorithms, runs)):
        times, failed_on = reps[i * job.iters:(i + 1) * job.iters], int(counts[len(runs) + i])
        if failed_on and err is None:
            err = f"failed on {failed_on} other rank{'s' if failed_on > 1 else ''}"
        row = {"collective": collective, "algorithm": a, "world": n, "count": count, "size": count * dtype.itemsize,
               "dtype": job.dtype, "time_us": None if err else statistics.median(times) * 1e6,
               "reps_us": None if err else [t * 1e6 for t in times], "inner": job.inner,
               "wrong": int(counts[i]), "error": err}
        row["algbw"], row["busbw"] = (None, None) if err else bandwidths(row)
        rows.append(row)
    return rows


def checks_handshake(group, device: torch.device) -> dict:
    """Whether one all-reduce with the metadata handshake on (`--checks`) runs on this backend."""
    t = torch.ones(8, device=device)
    try:
        with comm.configure(checks=True):
            comm.all_reduce(t, group=group, algorithm="ring")
        _sync(device)
        return {"ok": True, "error": None}
    except Exception as exc:
        return {"ok": False, "error": _error(exc)}


def measure(group, job: Job) -> dict | None:
    """Every cell of `job` on this rank of `group`; rank 0 returns (and writes to `job.out`) the report."""
    device, rank = _device(group), dist.get_rank(group)
    report = {"schema": SCHEMA, "backend": dist.get_backend(group), "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "world": dist.get_world_size(group), "complete": False, "rows": [], "checks": None}
    with comm.configure(checks=False):
        for collective in job.collectives:
            for size in job.sizes:
                report["rows"] += cell_rows(group, collective, size, job, device)
                _write(report, job.out, rank)
    report["checks"], report["complete"] = checks_handshake(group, device), True
    _write(report, job.out, rank)
    return report if rank == 0 else None


def _write(report: dict, path: str | None, rank: int) -> None:
    if path is not None and rank == 0:
        outputs.write_text(path, json.dumps(report, indent=1))


def _rank(job: Job) -> dict | None:
    return measure(None, job)


def parse(argv: list[str] | None) -> Job:
    p = Parser(prog="python -m ringzero.gpu_check.nccl_comm", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="report JSON to write (rank 0)")
    p.add_argument("--collective", default=",".join(DEFAULT_COLLECTIVES), help="comma list")
    p.add_argument("--sizes", default="64KiB,4MiB,64MiB", help="comma list of buffer sizes")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--inner", type=int, default=10, help="calls per timed repetition")
    a = p.parse_args(argv)
    with usage():
        job = Job(collectives=tuple(c.strip() for c in a.collective.split(",") if c.strip()),
                  sizes=parse_sizes(a.sizes), dtype=a.dtype, iters=a.iters, inner=a.inner, out=a.out)
        if job.out is not None:
            outputs.check(job.out, "--out")
    return job


def main(argv: list[str] | None = None) -> int:
    try:
        job = parse(argv)
        if not in_torchrun():
            raise UsageError("run this under torchrun (torchrun --nproc-per-node 2 -m ringzero.gpu_check.nccl_comm)")
    except UsageError as exc:
        print(f"nccl_comm: error: {exc}", file=sys.stderr)
        return 2
    report = launch.run(_rank, args=(job,), timeout=60.0)
    if report is None:           # ranks other than 0
        return 0
    bad = [f"{r['collective']}/{r['algorithm']}" for r in report["rows"] if r["error"] or r["wrong"]]
    print(f"nccl_comm: {len(report['rows'])} rows on {report['world']} ranks ({report['backend']}, "
          f"{report['device_name']}); {len(bad)} failed{': ' + ', '.join(bad) if bad else ''}; "
          f"metadata handshake {'ran' if report['checks']['ok'] else 'failed: ' + report['checks']['error']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
