"""A pool of live ranks that runs many multi-rank jobs without respawning (for tests and benches).

Spawning N processes and building a gloo group costs seconds; a test suite with hundreds of
multi-rank cases cannot pay that per case. `RankPool(8)` starts 8 ranks once, builds the prefix
groups {0}, {0,1}, …, {0..7} on every rank, and then runs `pool.run(fn, *args, world=k)`: ranks
0..k-1 call `fn(group_k, *args)`, the rest idle. As in DeepSpeed's DistributedTest pool, all ranks
agree on the outcome: the first error fails the call with that rank's traceback, and if any rank is
left stuck (a peer died mid-collective) the whole pool is restarted before the next job. Jobs and
results travel as copies (`ringzero.rank_ipc`): a rank never writes into another's arguments, nor
into a result the caller already holds.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback

import torch.distributed as dist

from ringzero import launch, rank_ipc
from ringzero.comm.transport import hosts, segment


def _serve(rank, nproc, port, threads, timeout_s, tasks, results, ties=None) -> None:
    try:
        launch._bootstrap(rank, nproc, port, threads, timeout_s, ties)
        groups = {k: (dist.new_group(list(range(k))) if k < nproc else dist.group.WORLD)
                  for k in range(1, nproc + 1)}
    except BaseException as exc:
        results.put(("err", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        return
    results.put(("ok", rank, "ready"))
    while True:
        job = tasks.get()
        if job is None:
            break
        fn, args, world = job
        try:
            out = fn(groups[world], *args) if rank < world else None
            results.put(("ok", rank, out))
        except BaseException as exc:
            results.put(("err", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    dist.destroy_process_group()


class RankPool:
    """`nproc` live gloo ranks; `run(fn, *args, world=k)` runs `fn(group, *args)` on ranks < k."""

    def __init__(self, nproc: int, timeout: float = 120.0, threads: int = 1) -> None:
        self.nproc, self.timeout, self.threads = nproc, timeout, threads
        self._procs: list = []

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._store, port = launch.host_store(self.nproc)
        self._results = rank_ipc.Results(ctx, self.nproc)      # nothing a SIGKILL would leak
        self._tasks = [rank_ipc.Inbox(ctx) for _ in range(self.nproc)]
        links = rank_ipc.LockedArray(ctx, self.nproc)
        self._token = hosts.new_token()
        self._procs = [ctx.Process(target=_serve, daemon=True,
                                   args=(r, self.nproc, port, self.threads, self.timeout,
                                         self._tasks[r], self._results.sender(r),
                                         launch._Ties(os.getpid(), parent_thread_lasts=launch._on_main_thread(),
                                                      links=links, shm_token=self._token)))
                       for r in range(self.nproc)]
        for p in self._procs:
            p.start()
        self._results.started()
        try:
            launch.collect(self._procs, self._results, self.nproc, self.timeout)
        except BaseException:
            self.close()
            raise

    def run(self, fn, *args, world: int | None = None, timeout: float | None = None) -> list:
        """Results of ranks 0..world-1 (world defaults to all ranks); raises RankError on failure."""
        world = self.nproc if world is None else world
        if not 1 <= world <= self.nproc:
            raise ValueError(f"world must be in 1..{self.nproc}, got {world}")
        if not self._procs:
            self._start()
        job = rank_ipc.encode((fn, args, world))      # each rank decodes its own copy of args
        for q in self._tasks:
            q.put_encoded(job)
        try:
            results = launch.collect(self._procs, self._results, self.nproc, timeout or self.timeout)
        except launch.RankError:
            self._drain_or_restart()
            raise
        return results[:world]

    def _drain_or_restart(self, grace: float = 2.0) -> None:
        """After a failure, wait briefly for the other ranks' replies; restart if any is stuck."""
        deadline, seen = time.monotonic() + grace, 1
        while seen < self.nproc and time.monotonic() < deadline:
            try:
                self._results.get(timeout=0.1)
                seen += 1
            except queue.Empty:
                pass
        if seen < self.nproc or any(not p.is_alive() for p in self._procs):
            self.close()

    def close(self) -> None:
        for q in getattr(self, "_tasks", []):
            try:
                q.put(None)
            except Exception:
                pass
        launch.stop_all(self._procs)
        if getattr(self, "_token", None):
            segment.sweep(self._token)
        for c in [getattr(self, "_results", None), *getattr(self, "_tasks", [])]:
            if c is not None:
                c.close()
        self._procs = []

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
