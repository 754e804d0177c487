"""The data-parallel strategies by name: one class each, the same interface (`flat_strategy`); ZeRO-3's
options (ZeRO++, parameter offload) are policies of its one class, chosen from the config."""

from __future__ import annotations

from torch import nn

from ringzero.parallel.comm_queue import CommQueue
from ringzero.parallel.data_parallel import DataParallel
from ringzero.parallel.flat_strategy import FlatStrategy
from ringzero.parallel.sharding_config import ShardingConfig
from ringzero.parallel.topology import Topology
from ringzero.parallel.zero.zero12 import ZeRO1, ZeRO2
from ringzero.parallel.zero.zero3 import ZeRO3

CLASSES: dict[str, type[FlatStrategy]] = {c.sharding.name: c for c in (DataParallel, ZeRO1, ZeRO2, ZeRO3)}


def apply_sharding(model: nn.Module, topology: Topology, config: ShardingConfig,
                   queue: CommQueue | None = None, alone: tuple[nn.Parameter, ...] = ()) -> FlatStrategy:
    """Lay out `model` for `config.sharding` over `topology`'s dp group; its collectives run on `queue`
    (a new one, owned and closed by the strategy, when None); `alone`: parameters each in a bucket
    of its own (`FlatStrategy.alone`)."""
    return CLASSES[config.sharding.name](model, topology, config, queue, alone)
