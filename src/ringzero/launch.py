"""Run a function on N ranks: local processes over gloo, or the ranks of a torchrun job.

`spawn(fn, nproc)` starts `nproc` processes, gives each a gloo process group rendezvoused through a
`TCPStore` that the parent hosts on an ephemeral loopback port (so concurrent runs never clash on a
fixed port), calls `fn(*args)` on every rank and returns the per-rank results. If any rank raises or
dies, the others are stopped at once and `RankError` names the rank and its error; past `timeout`
every rank is stopped and the error says which ranks had not finished; with a watchdog, a job whose
ranks stop completing steps is stopped too (`ringzero.watchdog`). Ranks die with the parent and
leave Ctrl-C to it (`ringzero.rank_io`). Nothing hangs and nothing is orphaned, and what the parent
shares with its ranks has no name that a parent killed with SIGKILL would leave behind; each rank
gets its own copy of `args` and the parent a copy of each result (`ringzero.rank_ipc`).

Under torchrun (`RANK` and `WORLD_SIZE` in the environment) `run` joins that job instead: NCCL when
CUDA is available, gloo otherwise, and calls `fn` once on this rank (`ringzero.torchrun_job`).
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import queue
import signal
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringzero import allocator, rank_io, rank_ipc, torchrun_job, watchdog
from ringzero.comm import flight_watch, link_emulator
from ringzero.comm.transport import hosts, segment
from ringzero.rank_io import in_torchrun  # noqa: F401  (part of this module's API)
from ringzero.watchdog import Watchdog, WatchdogPolicy

DEFAULT_TIMEOUT_S = 600.0


class RankError(RuntimeError):
    """A rank raised, died, stalled or timed out.

    `summary` is one line naming the rank and its error; `details` the rank's traceback;
    `stderr_tail` the last lines the rank wrote to its standard error (spawned ranks only);
    `rank` the rank to blame (None when several are). `str()` is the summary and the details.
    """

    def __init__(self, summary: str, rank: int | None = None, details: str = "",
                 stderr_tail: tuple[str, ...] = ()) -> None:
        super().__init__(summary + (f"\n{details}" if details else ""))
        self.summary, self.rank, self.details, self.stderr_tail = summary, rank, details, stderr_tail


def init_process_group(rank: int, world: int, store, backend: str = "gloo",
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Initialise the default group; the gloo timeout bounds any collective that lost a peer."""
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


@dataclass(frozen=True)
class _Ties:
    """What a spawned rank gets from its parent besides the job: whom to die with, where to write
    its stderr, its watchdog slots."""

    parent_pid: int
    stderr_path: str | None = None
    beacons: object = None
    parent_thread_lasts: bool = True
    """Whether the thread that starts the rank lives as long as the parent (the kernel's
    parent-death signal follows the thread, not the process); else the rank polls the parent."""
    links: object = None
    """The ranks' incoming-link clocks for the link emulator (`comm.link_emulator.share_ingress`)."""
    shm_token: str | None = None
    """The job's shared-memory token (`comm.transport.hosts`): the parent sweeps its names at the end."""


def _bootstrap(rank: int, world: int, port: int, threads: int, timeout_s: float,
               ties: _Ties | None = None) -> None:
    if ties is not None:
        rank_io.die_with_parent(ties.parent_pid, ties.parent_thread_lasts)
        if ties.stderr_path:
            rank_io.redirect_stderr(ties.stderr_path)
        if ties.beacons is not None:
            watchdog.install(ties.beacons, rank)
    if ties is not None and ties.links is not None:
        link_emulator.share_ingress(ties.links)
    if ties is not None and ties.shm_token:
        os.environ[hosts.ENV_TOKEN] = ties.shm_token
    allocator.tune()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"] = str(rank), str(world), str(rank)
    torch.set_num_threads(threads)
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    init_process_group(rank, world, store, "gloo", timeout_s)
    flight_watch.start(store, rank)              # what this rank waits in, for the parent's stall report


def _worker(rank, world, port, threads, timeout_s, job: bytes, results, ties=None) -> None:
    try:
        _bootstrap(rank, world, port, threads, timeout_s, ties)
        fn, args = rank_ipc.decode(job)
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
            _continue(p.pid)          # a stopped (SIGSTOP) rank only acts on SIGTERM once resumed
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _continue(pid: int | None) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except (OSError, TypeError):
        pass


@contextlib.contextmanager
def _children_ignore_sigint():
    """Start processes with SIGINT ignored (the disposition survives exec): Ctrl-C reaches every
    process of the terminal's group, and the ranks must leave it to the parent, which stops them,
    rather than each printing its own KeyboardInterrupt."""
    if not _on_main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _first_line(msg: str) -> str:
    return msg.splitlines()[0] if msg else msg


def spawn(fn, nproc: int, args: tuple = (), timeout: float = DEFAULT_TIMEOUT_S,
          threads: int | None = None, watch: WatchdogPolicy | None = None) -> list:
    """Run `fn(*args)` on `nproc` fresh local gloo ranks; return the results in rank order.

    Each rank dies with this process, its stderr is copied to ours as `[rank r] ...`, and with
    `watch` a rank that stops completing steps (see `ringzero.watchdog`) stops the job.
    """
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    job = rank_ipc.encode((fn, args))          # before anything starts: an unpicklable fn raises here
    ctx = mp.get_context("spawn")
    store, port = host_store(nproc)
    results = rank_ipc.Results(ctx, nproc)
    threads = threads or default_threads(nproc)
    dog = Watchdog(ctx, nproc, watch) if watch is not None else None
    with tempfile.TemporaryDirectory(prefix="ringzero-ranks-") as logs:
        paths = [os.path.join(logs, f"rank{r}.stderr") for r in range(nproc)]
        links = rank_ipc.LockedArray(ctx, nproc)
        token = hosts.new_token()
        ties = [_Ties(os.getpid(), paths[r], dog.array if dog else None, _on_main_thread(), links, token)
                for r in range(nproc)]
        procs = [ctx.Process(target=_worker, daemon=True,
                             args=(r, nproc, port, threads, timeout, job, results.sender(r), ties[r]))
                 for r in range(nproc)]
        forwarder = rank_io.StderrForwarder(paths)
        try:
            with _children_ignore_sigint():
                for p in procs:
                    p.start()
            results.started()
            return collect(procs, results, nproc, timeout, watchdog=dog, tails=forwarder.tail, store=store)
        finally:
            stop_all(procs)
            segment.sweep(token)          # names a rank made but no peer opened before the end
            results.close()
            forwarder.close()
            del store


def collect(procs, results, nproc: int, timeout: float, ranks=None, watchdog: Watchdog | None = None,
            tails=None, store=None) -> list:
    """Wait for one result per rank; fail fast on the first error, death, stall or the timeout.

    `tails(rank)` (optional) gives a rank's last stderr lines for the error; `store` (optional,
    the job's) the ranks' flight recorders, to name the collective a stalled job hangs in.
    """
    ranks = list(range(nproc)) if ranks is None else list(ranks)
    out: dict[int, object] = {}
    deadline = time.monotonic() + timeout

    def fail(summary: str, rank: int | None, details: str = "") -> RankError:
        tail = tails(rank) if tails is not None and rank is not None else ()
        return RankError(summary, rank=rank, details=details, stderr_tail=tail)

    while len(out) < len(ranks):
        try:
            status, rank, value = results.get(timeout=0.2)
        except queue.Empty:
            pending = [r for r in ranks if r not in out]
            dead = [r for r in pending if not procs[r].is_alive()]
            if dead:
                r = dead[0]
                raise fail(f"rank {r} died (exit code {procs[r].exitcode}) without a result", r)
            if time.monotonic() > deadline:
                raise fail(f"timed out after {timeout:.0f}s; ranks {pending} had not finished", None)
            stalled = watchdog.check(procs, pending) if watchdog is not None else None
            if stalled:
                where = flight_watch.diagnose(store, ranks) if store is not None else ""
                raise fail(stalled[0] + (f"; {where}" if where else ""), stalled[1])
            continue
        if status == "err":
            summary, r, details = _root_cause(procs, results, ranks, out, rank, value)
            raise fail(summary, r, details)
        out[rank] = value
    return [out[r] for r in ranks]


_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "exited during a shared-memory transfer", "exited before its shared-memory channel")
"""What a rank says when a peer is gone: gloo's lost connections, the shared-memory transport's."""


def _root_cause(procs, results, ranks, out, rank, value, grace: float = 1.0):
    """(summary, rank, details) of the error to report: a rank that died outranks its peers'
    lost-connection errors, and a lost connection to a rank that had already returned blames the
    rank that returned early (it skipped a collective its peers made)."""
    errors = {rank: value}
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            status, r, v = results.get(timeout=0.05)
            if status == "err":
                errors.setdefault(r, v)
            else:
                out[r] = v
        except queue.Empty:
            pass
    dead = [r for r in ranks if r not in out and r not in errors and not procs[r].is_alive()
            and procs[r].exitcode not in (0, None)]
    if dead:
        r = dead[0]
        return f"rank {r} died (exit code {procs[r].exitcode}) without a result", r, ""
    own = [r for r, v in sorted(errors.items()) if not any(p in v for p in _PEER_LOST)]
    if not own and out:
        early = sorted(out)
        r = min(errors)
        return (f"ranks {early} returned while ranks {sorted(errors)} still waited for them in a "
                f"collective (rank {r}: {_first_line(errors[r])}): ranks {early} skipped a "
                f"collective the others made", early[0], errors[r])
    r = own[0] if own else min(errors)
    return f"rank {r} failed: {_first_line(errors[r])}", r, errors[r]


def run(fn, nproc: int | None = None, args: tuple = (), timeout: float = DEFAULT_TIMEOUT_S,
        watch: WatchdogPolicy | None = None, backend: str = "auto"):
    """Under torchrun, join the job and return this rank's `fn(*args)`; otherwise `spawn` locally.

    Returns a list of per-rank results when spawning and a single result under torchrun (whose
    agent watches its workers; with `watch`, a collective in flight past `watch.floor_s` ends its
    rank with the flight recorder's diagnosis). `backend` under torchrun:
    "auto" is NCCL when CUDA is available and gloo otherwise; code whose tensors live on the CPU
    asks for "gloo".
    """
    if in_torchrun():
        return torchrun_job.join(fn, args, timeout, watch, backend)
    return spawn(fn, nproc or 1, args, timeout, watch=watch)
