"""The options of a parameter-server run (`--strategy ps`): `ServerConfig`, its own fields checked as
it is built.

`check` validates what they need of the rest of the run as `TrainConfig` is built (one line naming
the field and what it allows);
`roles` says which ranks of a run are workers and which servers. A ps run has `servers` ranks on
top of its workers: `--nproc 4 --servers 2` starts 6 processes, workers 0-3 and servers 4-5.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.plan.strategies.param_server import MODES, PSConfig, check_servers  # noqa: F401 (MODES: the choices of ps_mode)
from ringzero.run.fields import FieldError
from ringzero.run.kind import RunKind


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    servers: int = 0
    """strategy ps: server ranks, on top of the workers."""
    ps_mode: str = "sync"
    """strategy ps: sync (BSP), async, or ssp (bounded staleness)."""
    staleness: int = 0
    """ps_mode ssp: steps the fastest worker may run ahead of the slowest."""

    def __post_init__(self) -> None:
        s = self.servers
        if not isinstance(s, int) or isinstance(s, bool) or s < 0:
            raise FieldError("servers", f"servers must be an integer >= 0, got {s!r}")
        if self.ps_mode not in MODES:
            raise FieldError("ps_mode", f"ps_mode {self.ps_mode!r} is not supported; allowed: {', '.join(MODES)}")
        st = self.staleness
        if not isinstance(st, int) or isinstance(st, bool) or st < 0:
            raise FieldError("staleness", f"staleness must be an integer >= 0 (steps the fastest worker may lead "
                                          f"the slowest), got {st!r}")


def check(cfg) -> None:
    """Raise a `FieldError` for the first parameter-server option the rest of the run cannot take."""
    ps = cfg.ps
    if cfg.kind is not RunKind.PARAMETER_SERVER:
        for name, default in (("servers", 0), ("ps_mode", "sync"), ("staleness", 0)):
            if getattr(ps, name) != default:
                raise FieldError(name, f"{name} sets up a parameter server: it needs strategy 'ps', not "
                                       f"{cfg.parallel.strategy!r}")
        return
    if ps.servers < 1:
        raise FieldError("servers", "strategy 'ps' needs servers >= 1 (ranks that hold the parameters, on top "
                                    "of the workers)")
    if ps.staleness and ps.ps_mode != "ssp":
        raise FieldError("staleness", f"staleness bounds SSP: it needs ps_mode 'ssp', not {ps.ps_mode!r}")
    p, z = cfg.parallel, cfg.zero
    wrong = [f"{k}={v!r}" for k, v, ok in (
        ("tp", p.tp, p.tp == 1), ("pp", p.pp, p.pp == 1), ("precision", cfg.optim.precision, cfg.optim.precision != "fp16"),
        ("offload_optimizer", z.offload_optimizer, z.offload_optimizer == "none"),
        ("zeropp", z.zeropp, not z.zeropp)) if not ok]
    if wrong:
        raise FieldError(wrong[0].split("=")[0], f"strategy 'ps' runs whole models on its workers in fp32 or bf16 "
                                                 f"with the optimizer on its servers; it cannot take {', '.join(wrong)}")


def workers(cfg, world: int) -> int:
    """The worker ranks of a run of `world` processes (all of them unless it is a ps run)."""
    return world - cfg.ps.servers if cfg.kind is RunKind.PARAMETER_SERVER else world


def check_world(cfg, world: int) -> None:
    """What needs the number of processes: servers below the workers, the straggler's rank in range."""
    if cfg.kind is RunKind.PARAMETER_SERVER:
        try:
            check_servers(cfg.ps.servers, workers(cfg, world), " (nproc)")
        except ValueError as exc:
            raise FieldError("servers", str(exc)) from None
    straggler = cfg.faults.straggler
    if straggler is not None and straggler[0] >= workers(cfg, world):
        raise FieldError("straggler", f"straggler rank {straggler[0]} is not a worker rank: there are "
                                  f"{workers(cfg, world)} (0-{workers(cfg, world) - 1})")


def ps_config(cfg, world: int) -> PSConfig:
    return PSConfig(workers(cfg, world), cfg.ps.servers, cfg.ps.ps_mode, cfg.ps.staleness)
