"""Run a function on N ranks: local processes over gloo, or the ranks of a torchrun job.

`spawn(fn, nproc)` starts `nproc` processes, gives each a gloo process group rendezvoused through a
`TCPStore` that the parent hosts on an ephemeral loopback port (so concurrent runs never clash on a
fixed port), calls `fn(*args)` on every rank and returns the per-rank results. If any rank raises or
dies, the others are stopped at once and `RankError` names the rank and its error; past `timeout`
every rank is stopped and the error says which ranks had not finished. Nothing hangs.

Under torchrun (`RANK` and `WORLD_SIZE` in the environment) `run` joins that job instead: NCCL when
CUDA is available, gloo otherwise, and calls `fn` once on this rank.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import time
import traceback

import torch
import torch.distributed as dist

from . import allocator

DEFAULT_TIMEOUT_S = 600.0


class RankError(RuntimeError):
    """A rank raised, died or timed out; `.rank` says which (None for a timeout of several)."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


def in_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_process_group(rank: int, world: int, store, backend: str = "gloo",
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Initialise the default group; the gloo timeout bounds any collective that lost a peer."""
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _bootstrap(rank: int, world: int, port: int, threads: int, timeout_s: float) -> None:
    allocator.tune()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"] = str(rank), str(world), str(rank)
    torch.set_num_threads(threads)
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    init_process_group(rank, world, store, "gloo", timeout_s)


def _worker(rank, world, port, threads, timeout_s, fn, args, results) -> None:
    try:
        _bootstrap(rank, world, port, threads, timeout_s)
        out = fn(*args)
        results.put(("ok", rank, out))
    except BaseException as exc:  # report everything, including KeyboardInterrupt, to the parent
        results.put(("err", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def default_threads(nproc: int) -> int:
    """Intra-op threads per rank so that ranks do not oversubscribe the cores."""
    return max(1, (os.cpu_count() or 1) // max(1, nproc))


def host_store(world: int):
    """A TCPStore hosted by this process on an ephemeral loopback port; returns (store, port)."""
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    return store, store.port


def stop_all(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _first_line(msg: str) -> str:
    return msg.splitlines()[0] if msg else msg


def spawn(fn, nproc: int, args: tuple = (), timeout: float = DEFAULT_TIMEOUT_S,
          threads: int | None = None) -> list:
    """Run `fn(*args)` on `nproc` fresh local gloo ranks; return the results in rank order."""
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    ctx = mp.get_context("spawn")
    store, port = host_store(nproc)
    results = ctx.Queue()
    threads = threads or default_threads(nproc)
    procs = [ctx.Process(target=_worker, args=(r, nproc, port, threads, timeout, fn, args, results),
                         daemon=True) for r in range(nproc)]
    for p in procs:
        p.start()
    try:
        return collect(procs, results, nproc, timeout)
    finally:
        stop_all(procs)
        del store


def collect(procs, results, nproc: int, timeout: float, ranks=None) -> list:
    """Wait for one result per rank; fail fast on the first error, death or the timeout."""
    ranks = list(range(nproc)) if ranks is None else list(ranks)
    out: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    while len(out) < len(ranks):
        try:
            status, rank, value = results.get(timeout=0.2)
        except queue.Empty:
            dead = [r for r in ranks if r not in out and not procs[r].is_alive()]
            if dead:
                r = dead[0]
                raise RankError(f"rank {r} died (exit code {procs[r].exitcode}) without a result", rank=r)
            if time.monotonic() > deadline:
                pending = [r for r in ranks if r not in out]
                raise RankError(f"timed out after {timeout:.0f}s; ranks {pending} had not finished")
            continue
        if status == "err":
            raise _root_cause(procs, results, ranks, out, rank, value)
        out[rank] = value
    return [out[r] for r in ranks]


_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def _root_cause(procs, results, ranks, out, rank, value, grace: float = 1.0) -> RankError:
    """The error to report: a rank that died outranks its peers' lost-connection errors."""
    errors = {rank: value}
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            status, r, v = results.get(timeout=0.05)
            if status == "err":
                errors.setdefault(r, v)
        except queue.Empty:
            pass
    dead = [r for r in ranks if r not in out and r not in errors and not procs[r].is_alive()
            and procs[r].exitcode not in (0, None)]
    if dead:
        r = dead[0]
        return RankError(f"rank {r} died (exit code {procs[r].exitcode}) without a result", rank=r)
    own = [r for r, v in sorted(errors.items()) if not any(p in v for p in _PEER_LOST)]
    r = own[0] if own else min(errors)
    return RankError(f"rank {r} failed: {_first_line(errors[r])}\n{errors[r]}", rank=r)


def run(fn, nproc: int | None = None, args: tuple = (), timeout: float = DEFAULT_TIMEOUT_S):
    """Under torchrun, join the job and return this rank's `fn(*args)`; otherwise `spawn` locally.

    Returns a list of per-rank results when spawning and a single result under torchrun.
    """
    if in_torchrun():
        allocator.tune()
        if not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        return fn(*args)
    return spawn(fn, nproc or 1, args, timeout)
