"""Where ZeRO-3 keeps a rank's weight shards between uses: the shard store.

ZeRO-3 gathers a bucket from every rank's (shard,) weights. Where those shards live is a policy of
its own, composed into the one `ZeRO3`: `DeviceShards` keeps each on the device, in the group's
`shard` tensor (ZeRO-3 as Rajbhandari et al. 2020 §5.3 describe it); `parallel.offload.shards`'
`OffloadedShards` keeps them in host memory or a swap file (ZeRO-Infinity, Rajbhandari et al. 2021
§5) and brings each to the device only for its gather and around the update. `ShardStore` is what
ZeRO-3 asks of either.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager, Protocol

import torch

from ringzero.parallel.flat_group import FlatGroup


class ShardStore(Protocol):
    """What ZeRO-3 asks of the place its weight shards live."""

    reads_ahead: bool
    """Whether a gather should start the next bucket's read (a store that reads from disk)."""

    def loaded(self, g: FlatGroup, ahead: FlatGroup | None = None) -> ContextManager[torch.Tensor]:
        """A block holding `g`'s (shard,) weights on the device, for its gather (on the
        communication thread); `ahead`'s read starts once `g`'s is done."""

    def begin_forward(self) -> None:
        """A forward starts (after ZeRO-3 dropped whatever was gathered before it)."""

    def before_step(self) -> None:
        """Make the optimizer's shard tensors (`owned_weights`) hold the weights."""

    def after_step(self) -> None:
        """The optimizer updated them: keep the new values."""

    def shards_at_hand(self, changed: bool = False) -> ContextManager[None]:
        """A block in which the shard tensors hold this rank's weights (a checkpoint reads them; with
        `changed` it wrote them)."""

    def loading_bytes(self) -> int:
        """Bytes of shards loaded for gathers in flight, beyond what is held between steps."""

    def placement_bytes(self) -> dict[str, int]:
        """The store's bytes by location: {"device", "host", "disk"}."""

    def io_bytes(self) -> dict[str, int]:
        """Disk bytes moved in the current step: {"read", "write"}."""

    def close(self) -> None:
        """Free what the store made (its swap file)."""


class DeviceShards:
    """Every shard on the device, in its group's `shard` tensor, which the optimizer updates in place."""

    reads_ahead = False

    def loaded(self, g: FlatGroup, ahead: FlatGroup | None = None) -> ContextManager[torch.Tensor]:
        return contextlib.nullcontext(g.shard)

    def begin_forward(self) -> None:
        pass

    def before_step(self) -> None:
        pass

    def after_step(self) -> None:
        pass

    def shards_at_hand(self, changed: bool = False) -> ContextManager[None]:
        return contextlib.nullcontext()

    def loading_bytes(self) -> int:
        return 0

    def placement_bytes(self) -> dict[str, int]:
        return {"device": 0, "host": 0, "disk": 0}       # offloaded bytes only: none

    def io_bytes(self) -> dict[str, int]:
        return {"read": 0, "write": 0}

    def close(self) -> None:
        pass
