"""How a run lays its ranks out: the strategy over the data-parallel group, the dp x tp x pp grid,
the pipeline's schedule, gradient buckets, the collectives' algorithm, and emulated nodes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ringzero.comm import registry
from ringzero.comm.config import TRANSPORTS
from ringzero.plan.pipeline import schedule as pipeline
from ringzero.plan.placement import Placement
from ringzero.plan.strategies import sharding
from ringzero.plan.strategies.sharding import Strategy
from ringzero.run.fields import FieldError, check, choice
from ringzero.run.kind import RunKind, kind_of, sharding_of

STRATEGIES = ("single", *sharding.STRATEGIES, "ps")
"""`plan.strategies.sharding`'s data-parallel strategies, "single": DP on one rank, and "ps": a parameter
server (`ps_options`)."""

ALGORITHMS = registry.SPECIAL + registry.algorithms("all_reduce")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    strategy: str = "dp"
    """single, dp, zero1, zero2, zero3 or ps."""
    tp: int = 1
    """Tensor-parallel ranks (Megatron-LM's column/row split; must divide the heads and the MLP width)."""
    dp: int | None = None
    """Data-parallel ranks (None: the ranks / tp)."""
    sequence_parallel: bool = False
    """Split LayerNorm and dropout along the sequence over the tp ranks (Korthikanti et al. 2022)."""
    pp: int = 1
    """Pipeline stages (the micro-batches of a step are the pipeline's m = grad_accum)."""
    schedule: str = "1f1b"
    """Pipeline schedule: gpipe, 1f1b or interleaved (`plan.pipeline.schedule`)."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (the interleaved schedule's v)."""
    pipeline_cost: tuple[float, float] | None = None
    """Synthetic costs: a stage's forward and backward of one micro-batch last at least these
    seconds (padded by a sleep), so the schedule, not the shared cores, sets the timing."""
    bucket_mb: float = 1.0
    """MiB of gradients reduced by one collective (DDP's bucket_cap_mb): buckets overlap backward."""
    comm_algorithm: str = "auto"
    """The gradients' all-reduce algorithm (`comm.registry`): auto, the fastest the cost model
    predicts for each bucket; torch, the backend's own."""
    ranks_per_node: int | None = None
    """Emulated nodes of this many consecutive ranks (None: one node): where ZeRO++'s blocks fall,
    which bytes the meter calls cross-node, and which messages `emulate_inter_node` delays."""
    emulate_inter_node: tuple[float, float] | None = None
    """(GB/s, latency µs) of an emulated inter-node link: every cross-node message is delayed so
    (`comm.link_emulator`); None: no delay."""
    transport: str = "auto"
    """How ringzero's messages travel between ranks: auto (shared memory on one host, the backend
    between hosts), shm or gloo (`comm.transport`)."""

    def __post_init__(self) -> None:
        choice(self, "strategy", STRATEGIES)
        choice(self, "schedule", pipeline.SCHEDULES)
        choice(self, "comm_algorithm", ALGORITHMS)
        choice(self, "transport", TRANSPORTS)
        check(self, "bucket_mb", lambda v: math.isfinite(v) and v > 0, "must be > 0")
        for name in ("tp", "pp", "virtual_stages"):
            check(self, name, lambda v: v >= 1, "must be >= 1", integer=True)
        check(self, "dp", lambda v: v >= 1, "must be >= 1", integer=True, optional=True)
        if not isinstance(self.sequence_parallel, bool):
            raise FieldError("sequence_parallel", f"sequence_parallel must be true or false, got "
                                                  f"{self.sequence_parallel!r}")
        check(self, "pipeline_cost", lambda v: len(v) == 2 and all(math.isfinite(c) and c >= 0 for c in v),
              "must be two seconds >= 0 (forward, backward)", optional=True)
        self._check_nodes()

    def _check_nodes(self) -> None:
        rpn = self.ranks_per_node
        if rpn is not None and (not isinstance(rpn, int) or isinstance(rpn, bool) or rpn < 1):
            raise FieldError("ranks_per_node", f"ranks_per_node must be an integer >= 1, got {rpn!r}")
        link = self.emulate_inter_node
        if link is not None:
            ok = len(link) == 2 and math.isfinite(link[0]) and link[0] > 0 and math.isfinite(link[1]) and link[1] >= 0
            if not ok:
                raise FieldError("emulate_inter_node", f"emulate_inter_node must be (GB/s > 0, latency µs >= 0), "
                                                       f"got {link!r}")
            if rpn is None:
                raise FieldError("emulate_inter_node", "an emulated inter-node link needs nodes: set ranks_per_node")

    @property
    def kind(self) -> RunKind:
        """One rank, a grid, or a parameter server (`run.kind`)."""
        return kind_of(self.strategy)

    @property
    def sharding(self) -> Strategy:
        """The data-parallel strategy's table (`plan.strategies.sharding`; DP's outside a grid)."""
        return sharding_of(self.strategy)

    @property
    def tp_algorithm(self) -> str:
        """The algorithm of the tensor-parallel collectives: the run's, unless sequence parallelism
        needs an all-gather or reduce-scatter it does not implement (then the ring)."""
        algo = self.comm_algorithm
        if not self.sequence_parallel or algo in registry.SPECIAL:
            return algo
        ok = all(algo in registry.algorithms(c) for c in ("all_gather", "reduce_scatter"))
        return algo if ok else "ring"

    def placement(self, world: int) -> Placement:
        """The dp x tp x pp grid of this run on `world` ranks, or a one-line FieldError."""
        model_parallel = self.tp * self.pp
        what = "tp" if self.pp == 1 else "pp" if self.tp == 1 else "tp x pp"
        if model_parallel > world:
            raise FieldError(what.split()[-1], f"{what}={model_parallel} is larger than the {world} ranks")
        if self.dp is None and world % model_parallel:
            raise FieldError(what.split()[-1], f"{what}={model_parallel} does not divide the {world} ranks")
        dp = self.dp if self.dp is not None else world // model_parallel
        if dp * model_parallel != world:
            grid = f"dp x tp = {dp} x {self.tp}" if self.pp == 1 else f"dp x tp x pp = {dp} x {self.tp} x {self.pp}"
            raise FieldError("dp" if self.dp is not None else "tp",
                             f"{grid} = {dp * model_parallel} must equal the {world} ranks")
        if self.ranks_per_node is not None and world % self.ranks_per_node:
            raise FieldError("ranks_per_node", f"ranks_per_node={self.ranks_per_node} does not divide the "
                                               f"{world} ranks; nodes hold equal numbers of ranks")
        return Placement(dp=dp, tp=self.tp, pp=self.pp, ranks_per_node=self.ranks_per_node)
