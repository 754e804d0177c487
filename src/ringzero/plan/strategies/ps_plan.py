"""A whole plan's data parallelism done by a parameter server instead of an all-reduce.

The plan's dp ranks become the workers P; `servers` more machines each own one key range of the Ψ
parameters (`plan.strategies.param_server`), every one on its own network link (`Hardware.inter_bw`,
`inter_alpha`): servers are separate hosts in Li et al. 2014 §4 and in BytePS. A worker keeps its
parameters, gradients and activations; the optimizer states (and a 16-bit run's fp32 master) move
to the servers. The step is the plan's compute, then the pushes and pulls
(`param_server.comm_seconds`, pipelined key by key as in ps-lite), with no bubble and no overlap
with backward; the all-reduce plan beside it is the same model, data and hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.estimate import Estimate
from ringzero.plan.strategies.param_server import (comm_seconds, imbalance, server_ingress, server_link_seconds, server_ranges,
                           server_state_bytes, worker_bytes, worker_link_seconds)


@dataclass(frozen=True)
class PSPlan:
    """Per step, per worker or per server; bytes and seconds."""

    workers: int
    servers: int
    push_bytes: int
    """Sent by each worker: its whole gradient in the training precision."""
    pull_bytes: int
    """Received by each worker: the whole parameter vector."""
    server_ingress_bytes: int
    """Into the busiest server: every worker's push of its range (the incast)."""
    imbalance: float
    """ε of the key-range split: the busiest range over the mean, minus 1."""
    server_state_bytes: int
    """Held by the busiest server: its range of parameters, master weights and optimizer states."""
    worker_memory_bytes: int
    """Device memory of a worker: the plan's, less the optimizer states the servers hold."""
    server_link_s: float
    worker_link_s: float
    comm_s: float
    step_s: float
    allreduce_step_s: float
    """The plan's own step, gradients all-reduced among the same workers."""
    allreduce_bytes: float
    """Bytes each rank sends per step for that all-reduce."""

    @property
    def bottleneck(self) -> str:
        return "server link" if self.server_link_s >= self.worker_link_s else "worker link"


def ps_plan(e: Estimate, servers: int) -> PSPlan:
    """`e`'s data parallelism on `servers` parameter servers (ValueError when `e` is not plain data
    parallelism: tensor or pipeline parallelism, ZeRO or offload)."""
    par = e.parallel
    if type(servers) is not int or servers < 1:
        raise ValueError(f"servers must be an integer >= 1, got {servers!r}")
    if par.tp != 1 or par.pp != 1 or par.zero != 0 or par.offload != "none":
        raise ValueError("a parameter server replaces plain data parallelism: it needs tp 1, pp 1, zero 0 "
                         f"and no offload, got tp {par.tp}, pp {par.pp}, zero {par.zero}, offload {par.offload}")
    n, b, w, hw = e.params.total, e.training.bytes_per_value, par.dp, e.hardware
    push, pull = worker_bytes(n, b)
    bw, alpha = hw.inter_bw, hw.inter_alpha
    comm = comm_seconds(n, b, w, servers, bw, alpha)
    return PSPlan(
        workers=w, servers=servers, push_bytes=push, pull_bytes=pull,
        server_ingress_bytes=max(server_ingress(n, b, w, servers)),
        imbalance=imbalance(server_ranges(n, servers)),
        server_state_bytes=max(server_state_bytes(n, b, servers)),
        worker_memory_bytes=e.memory.total - e.memory.optimizer,
        server_link_s=server_link_seconds(n, b, w, servers, bw, alpha),
        worker_link_s=worker_link_seconds(n, b, servers, bw, alpha),
        comm_s=comm, step_s=e.time.compute + comm, allreduce_step_s=e.time.step,
        allreduce_bytes=e.comm_bytes("dp"))
