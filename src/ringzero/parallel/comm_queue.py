"""One background thread that runs a rank's collectives in the order they were issued.

Gradient buckets are reduced while backward still computes (as DDP does), and ZeRO-3 gathers the
next layer while the current one runs. ringzero's collectives are blocking calls, so they run on a
worker thread; torch kernels release the GIL, so compute and communication overlap. A single
worker keeps the order of collectives identical on every rank (hooks fire in the same order
everywhere), which is what makes it safe: two threads using one process group at once could pair
different collectives across ranks and hang. Every data-parallel collective of a training step goes
through here; tensor parallelism's run on the compute thread, on their own process group.
The worker is marked `comm.config.mark_beside_compute`: its collectives post receives early.
A queued function runs under the `comm.kinds` kind of the code that queued it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from ringzero.comm.config import mark_beside_compute
from ringzero.comm.kinds import carried


class CommQueue:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringzero-comm",
                                        initializer=mark_beside_compute)
        self._pending: list[Future] = []

    def submit(self, fn, *args, **kwargs) -> Future:
        """Queue `fn(*args, **kwargs)` after every collective queued before it."""
        fut = self._pool.submit(carried(fn), *args, **kwargs)
        self._pending.append(fut)
        return fut

    def drain(self) -> None:
        """Wait for everything queued; re-raise the first error."""
        pending, self._pending = self._pending, []
        for fut in pending:
            fut.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
