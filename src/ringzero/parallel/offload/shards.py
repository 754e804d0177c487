"""ZeRO-3's weight shards off the device: ZeRO-Infinity's parameter offload (Rajbhandari et al. 2021
§5), in host memory (cpu) or in a swap file (nvme), held by a `ParamStore`; the shard store
`OffloadedShards` that ZeRO-3 composes in place of `zero.shards.DeviceShards`.

Where a rank's weights are at each moment (d: the device, h: host memory, n: the swap file):

    between steps        every shard in the store only (cpu: h; nvme: n, plus the store's host
                         buffers); no weight on d
    forward, layer i     its shard loaded from the store into a d buffer (nvme: through a host
                         buffer), all-gathered into the full layer on d, the buffer dropped; the
                         full layer is freed after the layer, as in ZeRO-3
    backward             the same, in reverse order (with hpZ, from the secondary copy on d instead)
    the update           `before_step` loads every shard into its staging tensor on d; the
                         optimizer updates those in place; `after_step` stores them back and frees
                         their storage

Prefetch. The gather of layer i loads layer i's shard and then starts the read of the bucket after
it (ZeRO-3 says which: `zero.layer_gathers.LayerGathers.read_ahead`), which so runs while layers
compute, before that bucket's gather loads it: reads hide behind compute as the all-gathers do.
Loads come before prefetches: the store reads in the order asked, and a shard needed now must not
queue behind one needed later.

The optimizer's tensors. The optimizer takes `owned_weights()` once, at construction, and updates
those tensors in place every step (`ShardedAdam`'s fp32 master is the shard itself; the offloaded
optimizers copy each updated chunk into it). So they are persistent staging tensors that own
storage only around the update: freed and re-allocated in place (`untyped_storage().resize_`), as
FSDP2 frees an unsharded parameter's storage while every reference to the tensor stays valid.
They also hold the weights from construction until the first forward (the optimizer copies its
master from them). The rejected alternative, handing the optimizer the store's host tensors (cpu),
would put its states beside them, off the device, unannounced; and nvme has no tensor to hand.
The price: one more read of every shard per step (the strategy cannot know an offloaded optimizer
only writes them) and Σ shards on the device during the update. Between steps `owned_weights()`
own no storage: only the optimizer, during its step, reads them (`full_params` reads the store).

Every load, prefetch and store runs on the communication thread (the gathers run there; the other
calls are submitted to it and waited for), so the store moves bytes for one thread at a time.
"""

from __future__ import annotations

import contextlib
import enum

import torch
import torch.distributed as dist

from ringzero.parallel.comm_queue import CommQueue
from ringzero.parallel.flat_group import FlatGroup, nbytes
from ringzero.parallel.offload.config import OffloadConfig
from ringzero.parallel.offload.params import ParamStore


class Staging(enum.Enum):
    """What the optimizer's shard tensors (`owned_weights`) hold."""

    BUILT = "built"
    """The initial weights, as the store does: from construction to the first forward."""
    LOADED = "loaded"
    """The weights being updated: from `before_step` to `after_step`."""
    RELEASED = "released"
    """No storage: the store alone holds the weights (between steps)."""


class OffloadedShards:
    """The shards of `groups` where `offload` says (see the module doc); `queue` is ZeRO-3's
    communication thread, on which every load and store runs."""

    reads_ahead = True

    def __init__(self, groups: list[FlatGroup], offload: OffloadConfig, queue: CommQueue) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.groups, self.queue = groups, queue
        self.store = ParamStore([g.shard for g in groups], offload, rank)
        self.staging = Staging.BUILT
        self.loading: dict[int, torch.Tensor] = {}     # shards loaded for a gather in flight
        self._step_open, self._read_mark = False, 0
        self._written = self.store.initial_io["write"]

    @contextlib.contextmanager
    def loaded(self, g: FlatGroup, ahead: FlatGroup | None = None):
        src = self.loading[g.index] = self.store.load(g.index)
        try:
            if ahead is not None:
                self.store.prefetch(ahead.index)
            yield src
        finally:
            self.loading.pop(g.index, None)

    def begin_forward(self) -> None:
        if self.staging is Staging.BUILT:
            self._release_staging()
        if torch.is_grad_enabled() and not self._step_open:    # a step's first forward
            self._read_mark = self.queue.submit(self.store.io_bytes).result()["read"]
            self._step_open = True

    # -- the update -----------------------------------------------------------------------------
    def before_step(self) -> None:
        """Load every shard into the optimizer's staging tensors (on the device)."""
        if self.staging is Staging.RELEASED:
            self.queue.submit(self._load_staging).result()

    def _load_staging(self) -> None:
        for g, ahead in zip(self.groups, self.groups[1:] + [None]):
            s = g.shard
            s.untyped_storage().resize_(s.numel() * s.element_size())
            self.store.load(g.index, s)
            if ahead is not None:
                self.store.prefetch(ahead.index)
        self.staging = Staging.LOADED

    def after_step(self) -> None:
        """Store the updated shards and free the staging tensors' storage."""
        if self.staging is not Staging.RELEASED:
            self.queue.submit(self._store_staging).result()
        self._step_open = False

    def _store_staging(self) -> None:
        before = self.store.io_bytes()["write"]
        for g in self.groups:
            self.store.store(g.index, g.shard)
        self._written = self.store.io_bytes()["write"] - before      # io_bytes waits for the writes
        self._release_staging()

    @contextlib.contextmanager
    def shards_at_hand(self, changed: bool = False):
        was = self.staging
        if was is Staging.RELEASED:
            self.queue.submit(self._load_staging).result()
        try:
            yield
        finally:
            if changed:
                self.queue.submit(lambda: [self.store.store(g.index, g.shard) for g in self.groups]).result()
                self.queue.submit(self.store.io_bytes).result()          # waits for the writes
            if was is Staging.RELEASED:
                self._release_staging()

    def _release_staging(self) -> None:
        for g in self.groups:
            g.shard.untyped_storage().resize_(0)
        self.staging = Staging.RELEASED

    # -- accounting -----------------------------------------------------------------------------
    def loading_bytes(self) -> int:
        return nbytes(list(self.loading.values()))

    def placement_bytes(self) -> dict[str, int]:
        """`plan.strategies.offload.param_placement`'s figures."""
        return self.store.placement_bytes()

    def io_bytes(self) -> dict[str, int]:
        """Disk bytes of the current step (`plan.strategies.offload.param_io_per_step`): "read" since its
        first forward (the gathers and the pre-step load; an evaluation's forward, without
        gradients, opens no step); "write" of the latest store-back, which every step does once and
        which writes every record: the previous step's when asked between the update and
        `after_step` (as the engine asks), the copy into the store before the first step."""
        read = self.queue.submit(self.store.io_bytes).result()["read"]
        return {"read": read - self._read_mark, "write": self._written}

    def close(self) -> None:
        """Wait for queued I/O and remove the swap file (nvme)."""
        self.store.close()
