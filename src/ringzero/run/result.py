"""What one rank of a training run measured: plain data, gathered by the launcher."""

from __future__ import annotations

from dataclasses import dataclass, field

from ringzero.comm import timeline


@dataclass
class RankResult:
    """What one rank measured (plain data: it crosses process boundaries)."""

    rank: int
    losses: list[float] = field(default_factory=list)
    val: list[tuple[int, float]] = field(default_factory=list)
    val_at_s: list[float] = field(default_factory=list)
    """Seconds since the run began when each validation loss was taken (its wall-clock axis)."""
    held: dict[str, int] = field(default_factory=dict)
    activations: int = 0
    traffic: dict = field(default_factory=dict)
    calls: list[timeline.Timeline] = field(default_factory=list)
    """Every collective of each step (`comm.timeline`, recorded by `comm.flight`; the steady steps once the run ends)."""
    phases: dict[str, float] = field(default_factory=dict)
    step_time: float = 0.0
    step_times: list[float] = field(default_factory=list)
    """Seconds of every steady step (warm-up excluded); `step_time` is their median."""
    rest: float = 0.0
    """The median over the steady steps of each step's seconds outside its `phases` (`steps.summarise`)."""
    skipped: int = 0
    """Steps skipped so far for an fp16 overflow."""
    loss_scale: float = 1.0
    """The fp16 loss scale after the latest step (1 otherwise)."""
    params: dict[str, list[float]] | None = None
    buckets: list[tuple[int, bool]] = field(default_factory=list)
    sp_elements: int | None = None
    """Sequence parallelism: this rank's share of the LayerNorm and bias gradients it sums over tp
    (from the bucket layout, as `buckets`); None otherwise."""
    probe: dict = field(default_factory=dict)
    """The rates the step-time prediction uses: the median over `probes` (`twin.rates.median_rates`)."""
    probes: list[dict] = field(default_factory=list)
    """Every probe point: {"step", "at_s" (seconds since the run began), rates, "cost_s",
    "warmup_s"} (`probe.Prober.__call__`)."""
    stage: int = 0
    """This rank's pipeline stage."""
    timelines: list[list[tuple]] = field(default_factory=list)
    """A pipeline stage's steady steps: per step its (kind, micro, local chunk, start, end)."""
    inflight: int = 0
    """A pipeline stage: the most chunk micro-batches it held at once (measured step)."""
    nonfinite: list[tuple[int, list[int]]] = field(default_factory=list)
    """Every skipped non-finite step: (step, the ranks whose own gradient held an inf or NaN)."""
    checkpoint: dict = field(default_factory=dict)
    """Saves of the run (`checkpointing.Saver.summary`): seconds each blocked the step, and wrote."""
    role: str = "worker"
    """"worker" (every rank of a data-parallel run) or "server" (a parameter server's)."""
    ps: dict = field(default_factory=dict)
    """A parameter-server run: a worker's per-step "waits" and "computes"; a server's key "range",
    "staleness" of every update, "updates", "pushes", "wait_s", "busy_s" (`ps_engine`)."""
    gathered: dict[str, int] = field(default_factory=dict)
    """ZeRO-3: the most layers it held gathered (or being gathered) at once, {"forward", "backward"}
    (`parallel.zero.zero3.ZeRO3.peak_gathered`); empty otherwise."""
    compress: dict[str, int] = field(default_factory=dict)
    """Gradient compression: the bytes its hook keeps between steps, {"residual", "q"} (measured
    step); empty without it."""
    traffic_plain: dict = field(default_factory=dict)
    """Gradient compression: the traffic of the last step before it starts (when the run has one)."""
    compress_s: list[float | None] = field(default_factory=list)
    """Gradient compression: seconds its hook computed (not communicated) in each step (None: a
    step before it started)."""
    offload: dict = field(default_factory=dict)
    """Offloaded bytes at the measured step: {"optimizer", "params"} each {"device", "host", "disk"},
    and "disk_io" {"optimizer", "params"} each {"read", "write"} of that step (the rates offloading
    is predicted from are `probe["offload"]`, `offload_probe.measure`)."""
    trace: dict | None = None
    """The traced steps' plain data (`train.tracing.Tracer.data`; `ringzero.trace` writes it as
    Chrome trace-event files), or None when the run traced nothing."""
    kinds: dict[str, dict] = field(default_factory=dict)
    """The measured step's traffic by what it was for (`comm.kinds`): kind -> `Volume` fields."""
    memory: dict = field(default_factory=dict)
    """The rank's peak memory and its device's capacity (`train.memory_use.peak`), at the run's end."""
