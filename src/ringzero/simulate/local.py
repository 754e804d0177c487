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
  emulator). The caller prices it and passes it in (the simulator imports no `comm`, which needs
  torch).

`link_seconds` plays the links alone, step after step (what the planner's `emulated_seconds`
prices); `seconds` plays the call rank by rank with the host price on each message's path
(`dataflow`), so that one rank's transfer overlaps another's host work, as on the real ranks. Simply
adding the host price to `link_seconds` overstates the pipelined algorithms (the ring at 4 ranks
by 14-36 % in `benchmarks/bench_simulate_engine.py`).
"""

from __future__ import annotations

from ringzero.plan.comm.schedule.build import schedule_for
from ringzero.simulate.collective import play_schedule
from ringzero.simulate.dataflow import dataflow_seconds
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



def seconds(collective: str, algorithm: str, n: int, count: int, itemsize: int, ranks_per_node: int,
            gbps: float, latency_us: float, host_seconds: float) -> float:
    """The call on the emulated machine: its schedule played rank by rank (`dataflow`), each rank's
    share of `host_seconds` (the calibrated price with no link emulated) overlapping the links of
    the others."""
    sched = schedule_for(collective, algorithm, n, count, itemsize, 0, ranks_per_node)
    return dataflow_seconds(sched, ranks_per_node, gbps * 1e9, latency_us * 1e-6, host_seconds)
