"""ZeRO++ (Wang et al. 2023): ZeRO-3 whose collectives cross nodes less. Each option is a policy
composed into the one `zero3.ZeRO3`, as the planner prices the same calls from the one
`plan.strategies.zeropp.ZeroPP`:

    qwZ  the weight all-gathers quantized (`gather.QuantizedAllGather`, §3.1)
    hpZ  the backward all-gather from a node-sharded secondary copy (`gather.Secondary`, §3.2)
    qgZ  the gradient reduce-scatter as a quantized hierarchical all-to-all (`qgz`, §3.3)

They compose with each other and with either shard store (`shards`): with the weight shards
offloaded, a gather reads its shard from the store and then quantizes it (qwZ), and hpZ's secondary
copy stays on the device, so backward reads nothing from the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.parallel.flat_group import FlatGroup
from ringzero.parallel.topology import Topology
from ringzero.parallel.zero.gather import AllGather, QuantizedAllGather, Secondary
from ringzero.parallel.zero.qgz import QuantizedReduceScatter
from ringzero.plan.strategies.zeropp import ZeroPP


@dataclass
class Policies:
    """The gathers and the reduction one ZeRO-3 runs."""

    gather: AllGather | QuantizedAllGather
    """Every gather of the weights (forward; backward where `secondary` does not serve)."""
    secondary: Secondary | None
    """hpZ: the backward gathers of the layer buckets."""
    reduce: QuantizedReduceScatter | None
    """qgZ: the gradient reduction (None: the plain reduce-scatter)."""


def policies(zpp: ZeroPP | None, groups: list[FlatGroup], topology: Topology, algorithm_for) -> Policies:
    """The policies of the options `zpp` turns on (all plain when None) over `topology`'s dp group;
    `algorithm_for(collective)` names each collective's algorithm."""
    if zpp is None:
        return Policies(AllGather(topology, algorithm_for("all_gather")), None, None)
    gather = (QuantizedAllGather(topology, algorithm_for("all_gather"), zpp.block) if zpp.qwz
              else AllGather(topology, algorithm_for("all_gather")))
    secondary = Secondary(groups, topology, algorithm_for("all_gather"), zpp.partition) if zpp.hpz else None
    reduce = (QuantizedReduceScatter(topology, zpp, algorithm_for("all_to_all"))
              if zpp.qgz and topology.dp > 1 else None)
    return Policies(gather, secondary, reduce)
