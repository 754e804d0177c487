"""A rank of a torchrun job: join its process group, run the job's function, leave cleanly.

torchrun's agent starts the ranks, watches them and restarts them all together (`--max-restarts`);
what a rank does itself: make the process group (NCCL when CUDA is available, gloo otherwise) in a
store of this attempt's own, publish its flight recorder and, with a watchdog policy, end itself
when one of its collectives is in flight past the deadline (as NCCL's watchdog thread does), and
destroy the group it made before the interpreter exits.
"""

from __future__ import annotations

import datetime
import os
import threading

import torch
import torch.distributed as dist

from ringzero import allocator
from ringzero.comm import flight_watch
from ringzero.watchdog import WatchdogPolicy


def attempt_store(timeout: datetime.timedelta):
    """torchrun's store (env://) under a prefix of this attempt; returns (store, rank, world).
    torchrun's agent keeps one store across its restarts (shared with its rendezvous unless
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), so without the prefix a restarted rank can read a peer's
    gloo address, or NCCL id, left by the attempt before and fail to connect or hang
    (pytorch/pytorch#135712; here 4 of 6 restarted 2-rank jobs failed so, 0 of 10 with it). The
    agent restarts every worker at once, so they all agree on the count."""
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"ringzero/attempt-{attempt}", store), rank, world


def _watch_collectives(watch: WatchdogPolicy | None) -> threading.Event | None:
    """Publish this rank's flight recorder to the job's store and, with `watch`, end this rank
    once a collective is in flight past `watch.floor_s` (`comm.flight_watch`)."""
    try:
        store = dist.distributed_c10d._get_default_store()
    except (RuntimeError, AttributeError):      # a group made without a store (or another torch)
        return None
    return flight_watch.start(store, dist.get_rank(), None if watch is None else watch.floor_s,
                              dist.get_world_size())


def join(fn, args: tuple, timeout: float, watch: WatchdogPolicy | None, backend: str):
    """This rank's `fn(*args)`, in the job's process group (made here unless one exists).
    `backend` "auto" is NCCL when CUDA is available and gloo otherwise."""
    allocator.tune()
    ours = not dist.is_initialized()
    if ours:
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        limit = datetime.timedelta(seconds=timeout)
        store, rank, world = attempt_store(limit)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=limit)
    stop = _watch_collectives(watch)
    try:
        return fn(*args)
    finally:
        if stop is not None:
            stop.set()
        # A process group left to the interpreter's exit can abort the process ("terminate
        # called without an active exception") while its threads are torn down.
        if ours and dist.is_initialized():
            dist.destroy_process_group()
