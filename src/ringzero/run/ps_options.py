"""The options of a parameter-server run (`--strategy ps`) and of an injected straggler (any run).

`check` validates them as `TrainConfig` is built (one line naming the field and what it allows);
`roles` says which ranks of a run are workers and which servers. A ps run has `servers` ranks on
top of its workers: `--nproc 4 --servers 2` starts 6 processes, workers 0-3 and servers 4-5.
"""

from __future__ import annotations

import math

from ringzero.plan.strategies.param_server import MODES, PSConfig, check_servers  # noqa: F401 (MODES: the choices of ps_mode)
from ringzero.run.fields import FieldError
from ringzero.run.kind import RunKind


def _error(field: str, message: str):
    return FieldError(field, message)


def check(cfg) -> None:
    """Raise a `FieldError` for the first parameter-server or straggler option `cfg` cannot take."""
    s = cfg.servers
    if not isinstance(s, int) or isinstance(s, bool) or s < 0:
        raise _error("servers", f"servers must be an integer >= 0, got {s!r}")
    if cfg.ps_mode not in MODES:
        raise _error("ps_mode", f"ps_mode {cfg.ps_mode!r} is not supported; allowed: {', '.join(MODES)}")
    st = cfg.staleness
    if not isinstance(st, int) or isinstance(st, bool) or st < 0:
        raise _error("staleness", f"staleness must be an integer >= 0 (steps the fastest worker may lead the "
                                  f"slowest), got {st!r}")
    if cfg.kind is not RunKind.PARAMETER_SERVER:
        for name, default in (("servers", 0), ("ps_mode", "sync"), ("staleness", 0)):
            if getattr(cfg, name) != default:
                raise _error(name, f"{name} sets up a parameter server: it needs strategy 'ps', not "
                                   f"{cfg.strategy!r}")
    else:
        _check_ps(cfg)
    _check_straggler(cfg.straggler)


def _check_ps(cfg) -> None:
    if cfg.servers < 1:
        raise _error("servers", "strategy 'ps' needs servers >= 1 (ranks that hold the parameters, on top "
                                "of the workers)")
    if cfg.staleness and cfg.ps_mode != "ssp":
        raise _error("staleness", f"staleness bounds SSP: it needs ps_mode 'ssp', not {cfg.ps_mode!r}")
    wrong = [f"{k}={getattr(cfg, k)!r}" for k, ok in (
        ("tp", cfg.tp == 1), ("pp", cfg.pp == 1), ("precision", cfg.precision != "fp16"),
        ("offload_optimizer", cfg.offload_optimizer == "none"), ("zeropp", not cfg.zeropp)) if not ok]
    if wrong:
        raise _error(wrong[0].split("=")[0], f"strategy 'ps' runs whole models on its workers in fp32 or bf16 "
                                             f"with the optimizer on its servers; it cannot take {', '.join(wrong)}")


def _check_straggler(straggler) -> None:
    if straggler is None:
        return
    ok = (len(straggler) == 2 and isinstance(straggler[0], int) and not isinstance(straggler[0], bool)
          and straggler[0] >= 0 and math.isfinite(straggler[1]) and straggler[1] >= 1)
    if not ok:
        raise _error("straggler", f"straggler must be (rank >= 0, factor >= 1), got {straggler!r}")


def workers(cfg, world: int) -> int:
    """The worker ranks of a run of `world` processes (all of them unless it is a ps run)."""
    return world - cfg.servers if cfg.kind is RunKind.PARAMETER_SERVER else world


def check_world(cfg, world: int) -> None:
    """What needs the number of processes: servers below the workers, the straggler's rank in range."""
    if cfg.kind is RunKind.PARAMETER_SERVER:
        try:
            check_servers(cfg.servers, workers(cfg, world), " (nproc)")
        except ValueError as exc:
            raise _error("servers", str(exc)) from None
    if cfg.straggler is not None and cfg.straggler[0] >= workers(cfg, world):
        raise _error("straggler", f"straggler rank {cfg.straggler[0]} is not a worker rank: there are "
                                  f"{workers(cfg, world)} (0-{workers(cfg, world) - 1})")


def ps_config(cfg, world: int) -> PSConfig:
    return PSConfig(workers(cfg, world), cfg.servers, cfg.ps_mode, cfg.staleness)
