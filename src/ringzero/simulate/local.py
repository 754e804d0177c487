"""This machine as a simulated cluster: the link emulator's NICs, and the host's calibrated cost.

ringzero's own collectives run here on local ranks, with `comm.link_emulator` slowing every message
between "nodes" of `ranks_per_node` ranks to a network's pace. To check the simulator against them
the emulated machine becomes a `Topology`:

- every rank owns one NIC (`nics_per_node = ranks_per_node`), `gbps` GB/s each way and
  `latency_us` per message, as the emulator gives each rank one outgoing and one incoming link (a
  message holds both: the fluid model's sender and receiver NIC links);
- within a node nothing is emulated, so the NVSwitch is taken as free (its bandwidth effectively
  infinite, no latency), and no fabric above the NICs binds (one leaf of 32 nodes, 1:1);
- what the ranks themselves spend (copies, reductions, Python steps, the real transport) is not a
  link: it is the calibration's α-β-γ price of the same call (`comm.select.price`, the model fitted
  by `ringzero bench comm --calibrate` on this machine, per algorithm where it has one, without the
  emulator). The caller adds it (the simulator imports no `comm`, which needs torch).

Adding the two takes each step's transfer and its host work as one after the other. That is right
where an algorithm does not pipeline (the tree) and high where it does: the emulator's NIC thread
sleeps out a transfer while the rank's own thread reduces the chunk before it.
"""

from __future__ import annotations

from ringzero.plan.comm.schedule.build import schedule_for
from ringzero.simulate.collective import play_schedule
from ringzero.simulate.topology import Topology

FREE_BW = 1e15
"""Bytes/s of the links nothing emulates (a petabyte per second: never what binds)."""


def emulated_topology(n: int, ranks_per_node: int, gbps: float, latency_us: float) -> Topology:
    """`n` local ranks in nodes of `ranks_per_node`, each with the emulator's NIC."""
    if n % ranks_per_node:
        raise ValueError(f"{n} ranks are not whole nodes of {ranks_per_node}")
    return Topology(name="emulated", gpus=n, gpus_per_node=ranks_per_node, nvlink_bw=FREE_BW, nvlink_latency=0.0,
                    nics_per_node=ranks_per_node, nic_bw=gbps * 1e9, nic_latency=latency_us * 1e-6,
                    nodes_per_leaf=32, oversubscription=1.0)


def link_seconds(collective: str, algorithm: str, n: int, count: int, itemsize: int, ranks_per_node: int,
                 gbps: float, latency_us: float) -> float:
    """The call's schedule played on the emulated links alone."""
    sched = schedule_for(collective, algorithm, n, count, itemsize, 0, ranks_per_node)
    return play_schedule(sched, emulated_topology(n, ranks_per_node, gbps, latency_us)).seconds

