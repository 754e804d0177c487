"""A trainer's checkpoints: what it saves besides its tensors, and how a run starts from one.

Saved with the tensors (`ringzero.checkpoint`): the step (the data position: a step's batch is a
function of the step), the optimizer's step count, the fp16 loss scaler, every rank's RNG states
(the default generator and tensor parallelism's tracked ones) and its gradient compression's state
(residuals, PowerSGD's Q), the layout and the configuration. A run resumed in the same layout
restores those too, so it continues bit for bit; in another layout they are per rank and per
bucket and cannot carry over (dropout then draws anew, compression starts with no residual).
What all of this reads off a trainer is `train.protocols.CheckpointedTrainer`.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist

from ringzero.checkpoint.folders import resolve
from ringzero.checkpoint.load import Reader, fill, fill_weights
from ringzero.checkpoint.manifest import CheckpointError, read
from ringzero.checkpoint.save import Snapshot, snapshot, write
from ringzero.checkpoint.state import Local, optimizer_states, pieces
from ringzero.comm import timeline
from ringzero.run.config import TrainConfig
from ringzero.train.protocols import CheckpointedTrainer


def layout(trainer: CheckpointedTrainer) -> dict:
    c, t = trainer.cfg, trainer.topo
    return {"world": t.world, "dp": t.dp, "tp": t.tp, "pp": t.pp, "strategy": c.parallel.strategy,
            "precision": c.optim.precision, "virtual_stages": c.parallel.virtual_stages, "sequence_parallel": c.parallel.sequence_parallel,
            "offload_optimizer": c.zero.offload_optimizer}


def _rng(trainer: CheckpointedTrainer) -> dict[str, torch.Tensor]:
    """This rank's own state: its RNG states, and its communication hook's (gradient compression's
    residuals and Q, which differ on every rank)."""
    out = {"torch": torch.get_rng_state()}
    tracker = trainer.tp.rng
    if tracker is not None:
        out.update({f"tp.{k}": v.clone() for k, v in tracker.states.items()})
    hook = trainer.strategy.comm_hook.hook
    if hook is not None:
        out.update({f"compress.{k}": v for k, v in hook.state_dict().items()})
    return out


def _scaler(trainer: CheckpointedTrainer) -> dict:
    s = trainer.scaler
    return {k: getattr(s, k) for k in ("scale", "good_steps", "skipped", "tolerance") if hasattr(s, k)}


class Behind:
    """One write at a time on a background thread; `wait` joins it and raises its error there."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self, fn: Callable[..., object], *args: object) -> None:
        def run() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - raised on the training thread by `wait`
                self.error = exc
        self.wait()
        self.thread = threading.Thread(target=run, name="ringzero-checkpoint", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        """Wait for the write in flight; raise its error."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        self.error, error = None, self.error
        if error is not None:
            raise error


class Saver:
    """The run's checkpoint writer (`checkpoint.save`): synchronous, or with `cfg.checkpoint.async_save` one
    save at a time on a background thread while training goes on. `blocked_s`: what each save
    cost the step (the copy to host memory, and waiting for the previous save when it had not
    finished); `write_s`: each save's own writing time."""

    def __init__(self, trainer: CheckpointedTrainer) -> None:
        self.cfg, self.topo = trainer.cfg, trainer.topo
        self.token = run_token(self.topo.grid_group, self.topo.world)
        self.ancestors = ancestors(self.cfg)
        self.behind = Behind()
        self.blocked_s: list[float] = []
        self.write_s: list[float] = []

    def save(self, trainer: CheckpointedTrainer, step: int) -> str | None:
        """Save the state after `step` completed steps; returns the path on rank 0 once it is
        complete (synchronous saves), else None."""
        c, t = self.cfg, self.topo
        t0 = time.perf_counter()
        self.wait()
        meta = {"layout": layout(trainer), "config": c.as_dict(), "scaler": _scaler(trainer),
                "optimizer_step": trainer.opt.t}
        with trainer.strategy.shards_at_hand():
            snap = snapshot(step, t.rank, t.world, pieces(trainer.strategy, t, trainer.opt, writing=True),
                            _rng(trainer), meta, self.token, c.checkpoint.keep, copy=c.checkpoint.async_save or c.zero.offload_params != "none",
                            ancestors=self.ancestors, overwrite=c.checkpoint.overwrite)
        if c.checkpoint.async_save:
            self.behind.start(self._write, snap)
            self.blocked_s.append(time.perf_counter() - t0)
            return None
        try:
            path = self._write(snap)
        finally:
            if t.world > 1:
                dist.barrier(group=t.grid_group)   # everyone returns once rank 0 has published it
            self.blocked_s.append(time.perf_counter() - t0)
        return path

    @timeline.spanned("checkpoint write", "checkpoint")
    def _write(self, snap: Snapshot) -> str | None:
        t0 = time.perf_counter()
        try:
            return write(self.cfg.checkpoint.save_dir, snap)
        finally:
            self.write_s.append(time.perf_counter() - t0)

    def wait(self) -> None:
        """Wait for the save in flight; raise its error."""
        self.behind.wait()

    def summary(self) -> dict:
        return {"saves": len(self.blocked_s), "blocked_s": list(self.blocked_s), "write_s": list(self.write_s),
                "async": self.cfg.checkpoint.async_save}


def run_token(group: dist.ProcessGroup | None, world: int) -> str:
    """This run's id: in its checkpoints' manifests and shards, and the name of its temporary
    checkpoint folders; the same on every rank of `group` (rank 0's, broadcast: a collective when
    `world` > 1)."""
    box = [secrets.token_hex(8)]
    if world > 1:
        src = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def ancestors(cfg: TrainConfig) -> tuple[str, ...]:
    """The runs a run of `cfg` descends from: the lineage of the checkpoint it resumes (none when
    it starts afresh, or from a checkpoint saved before run ids)."""
    return tuple(read(resolve(cfg.checkpoint.resume)).lineage) if cfg.checkpoint.resume is not None else ()


def save_checkpoint(trainer: CheckpointedTrainer, step: int) -> str | None:
    """Save the state after `step` completed steps under `cfg.checkpoint.save_dir` (every rank calls it)."""
    if getattr(trainer, "saver", None) is None:
        trainer.saver = Saver(trainer)
    with timeline.span("checkpoint save", "checkpoint", step=step):
        return trainer.saver.save(trainer, step)


def due(cfg: TrainConfig, done: int) -> bool:
    """Whether to save after `done` steps."""
    return cfg.checkpoint.save_dir is not None and (done == cfg.training.steps or (cfg.checkpoint.save_every is not None and done % cfg.checkpoint.save_every == 0))


@torch.no_grad()
def load_checkpoint(trainer: CheckpointedTrainer, path: str) -> int:
    """Load checkpoint `path` (a checkpoint or a save_dir) into `trainer`, whatever layout saved it;
    returns the step to continue from."""
    reader = Reader(resolve(path))
    m = reader.manifest
    if m.step >= trainer.cfg.training.steps:
        raise CheckpointError(f"the checkpoint {reader.directory} is at step {m.step}, not before steps "
                              f"{trainer.cfg.training.steps}: nothing is left to run")
    _load(trainer, lambda locals_: fill(reader, locals_))
    trainer.opt.t = m.optimizer_step
    for k, v in m.scaler.items():
        if hasattr(trainer.scaler, k):
            setattr(trainer.scaler, k, type(getattr(trainer.scaler, k))(v))
    if m.layout == layout(trainer):
        _restore_rng(trainer, reader.rng(trainer.topo.rank))
    return m.step


@torch.no_grad()
def init_weights(trainer: CheckpointedTrainer, path: str) -> None:
    """Take the weights from a consolidated safetensors file (`ringzero checkpoint consolidate`), in
    any layout; the optimizer starts afresh."""
    _load(trainer, lambda locals_: fill_weights(path, [l for l in locals_ if not l.name.startswith("exp_avg")]))


def _load(trainer: CheckpointedTrainer, filler: Callable[[list[Local]], None]) -> None:
    """`filler(pieces)` sets this rank's pieces; then what the optimizer and strategy derive from them."""
    opt = trainer.opt
    with trainer.strategy.shards_at_hand(changed=True):
        states = optimizer_states(opt)
        filler(pieces(trainer.strategy, trainer.topo, opt, writing=False, states=states))
        if not opt.mixed:                  # fp32: the master is the weights (a separate copy when offloaded)
            for w, master in zip(trainer.strategy.owned_weights(), states["master"]):
                if master.data_ptr() != w.data_ptr():
                    master.copy_(w)
    if hasattr(opt, "write_state"):
        opt.write_state(states["master"], states["exp_avg"], states["exp_avg_sq"])
    trainer.strategy.after_step()          # ZeRO-1/2: every rank's full weights from the loaded shards


def _restore_rng(trainer: CheckpointedTrainer, saved: dict[str, torch.Tensor]) -> None:
    if "torch" in saved:
        torch.set_rng_state(saved["torch"])
    tracker = trainer.tp.rng
    if tracker is not None:
        for k in tracker.states:
            if f"tp.{k}" in saved:
                tracker.states[k] = saved[f"tp.{k}"].clone()
    trainer.strategy.comm_hook.load_state_dict(
        {k.removeprefix("compress."): v for k, v in saved.items() if k.startswith("compress.")}, trainer.strategy.groups)
