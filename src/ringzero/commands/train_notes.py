"""What `ringzero train` tells the user on stderr before its ranks start: the transport it falls back
to, what offloading needs, a compression that compresses nothing, what a resume changes. These are
notes and warnings, so `--quiet` (which drops the progress and the tables) never hides them; rank 0
of a torchrun job says them once."""

from __future__ import annotations

import dataclasses
import os
import sys

from ringzero.run import compress_options
from ringzero.run.config import TrainConfig
from ringzero.run.kind import RunKind


def say(line: str) -> None:
    """One note on stderr, from rank 0 only under torchrun."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(line, file=sys.stderr, flush=True)


def transport(cfg: TrainConfig, world: int, torchrun: bool) -> TrainConfig:
    """The transport the ranks will use: --transport, unless auto must fall back to gloo (a
    /dev/shm too small for the channels, said); one line and exit 2 if shm cannot run."""
    from ringzero.comm.transport.preflight import grid_groups, transport_for
    if cfg.kind is RunKind.PARAMETER_SERVER:
        sizes = [world]
    else:
        pl = cfg.placement(world)
        sizes = grid_groups(world, pl.dp, pl.tp, pl.pp)
    chosen, note = transport_for(cfg.parallel.transport, sizes, torchrun)
    if note:
        say(note)
    return cfg if chosen == cfg.parallel.transport else dataclasses.replace(cfg, transport=chosen)


def offload_resources(cfg: TrainConfig, world: int) -> None:
    """Say what offloading will need (`twin.offload.offload_needs`), and fail in one line when the
    host memory or the drive under nvme_path does not have it."""
    if cfg.zero.offload_optimizer == "none" and cfg.zero.offload_params == "none":
        return
    from ringzero.parallel.offload.config import OffloadConfig, check_offload
    from ringzero.twin.offload import offload_needs
    host, disk = offload_needs(cfg, world)
    check_offload(OffloadConfig(device="nvme" if disk else "cpu", nvme_path=cfg.zero.nvme_path if disk else None),
                  host, disk)
    where = f" and {disk / 2**30:.3f} GiB on disk under {cfg.zero.nvme_path}" if disk else ""
    say(f"ringzero: offload ({cfg.zero.offload_optimizer} optimizer, {cfg.zero.offload_params} parameters) needs "
        f"{host / 2**30:.3f} GiB of host memory{where} for {world} rank{'s' if world > 1 else ''}")


def compression(cfg: TrainConfig) -> None:
    """A cast of gradients that are already 16-bit: allowed, and said, since it sends no fewer bytes."""
    cast = compress_options.no_op_cast(cfg)
    if cast == "same":
        say(f"ringzero: note: --compress {cfg.compress.compress} with --precision {cfg.optim.precision}: the gradients "
            f"are already {cfg.optim.precision}, so the cast is a no-op and compresses nothing")
    elif cast == "width":
        say(f"ringzero: note: --compress {cfg.compress.compress} with --precision {cfg.optim.precision}: the gradients "
            f"are already 16-bit, so the cast sends as many bytes and only rounds them to "
            f"{cfg.compress.compress}")
