"""The written-down interfaces are the real ones: every class that plays a part satisfies its
Protocol, an object missing a member does not, and each Protocol lists exactly what its users use
(read from their source)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

from ringzero.comm import symbolic
from ringzero.comm.ops import Op
from ringzero.comm.p2p import TorchComm
from ringzero.comm.protocol import AsyncComm, Comm, Handle
from ringzero.comm.subcomm import SubComm
from ringzero.comm.symbolic import SymComm
from ringzero.parallel.topology import Topology
from ringzero.run.config import TrainConfig
from ringzero.train.engine import Trainer
from ringzero.train.pipeline_schedule import PipelineSchedule
from ringzero.train.protocols import CheckpointedTrainer, StepSchedule
from ringzero.train.ps_engine import PSWorker
from ringzero.train.step_schedule import GradAccumulation

SRC = Path(__file__).resolve().parents[1] / "src" / "ringzero"
TINY = dict(model="nano", seq=16, micro_batch=2, steps=2, max_bytes=1 << 15, eval_every=1000, eval_batches=1)


def _members(proto: type) -> set[str]:
    """The members a Protocol class declares itself (methods, properties, annotated attributes)."""
    return {k for k in vars(proto) if not k.startswith("_")} | set(vars(proto).get("__annotations__", {}))


def _params(fn) -> list[str]:
    """Parameter names, without `self` (a staticmethod has none)."""
    names = list(inspect.signature(fn).parameters)
    return names[1:] if names[:1] == ["self"] else names


def _attrs_read(path: Path, name: str) -> set[str]:
    """Every attribute read or set on a variable called `name` anywhere in `path`."""
    tree = ast.parse(path.read_text())
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == name}


def _without(cls: type, name: str) -> type:
    """A copy of `cls` lacking member `name` (inherited members copied in, so none comes back)."""
    body = {}
    for base in reversed(cls.__mro__[:-1]):
        body.update({k: v for k, v in vars(base).items() if k not in ("__dict__", "__weakref__")})
    body.pop(name)
    return type(f"{cls.__name__}Without_{name}", (), body)


# -- the Comm ------------------------------------------------------------------------------------

class _FullComm:
    """Every member of `AsyncComm`, doing nothing: the baseline the negative cases take one from."""

    rank, size, itemsize, ranks_per_node, async_p2p = 0, 1, 4, None, True

    def empty(self, n): return np.empty(n)
    def exchange(self, sends=(), recvs=(), new_round=True): return _Done()
    def sendrecv(self, sends=(), recvs=(), new_round=True): pass
    def reduce(self, dst, src): pass
    def copy(self, dst, src): pass
    def split(self, buf, sizes): return []
    def post_send(self, peer, buf, new_round=False): return _Done()
    def post_recv(self, peer, buf, new_round=False): return _Done()
    def post_recv_reduce(self, peer, dst, scratch, new_round=False): return _Done()


class _Done:
    def wait(self) -> None:
        pass


def test_the_comm_protocol_lists_exactly_what_the_algorithms_use():
    used = set().union(*(_attrs_read(p, "c") for p in (SRC / "comm" / "algorithms").glob("*.py")))
    assert used == _members(Comm) | _members(AsyncComm)
    assert _members(AsyncComm) == {"split", "post_send", "post_recv", "post_recv_reduce"}   # the pipelined ring's alone


def test_the_symbolic_comm_and_a_subcomm_over_it_are_comms():
    seen = []
    symbolic.run(lambda c: seen.append(c), 2, lambda r: ((), np.empty(0, dtype=object)))
    assert len(seen) == 2 and all(type(c) is SymComm for c in seen)
    for c in seen:
        assert isinstance(c, Comm) and not c.async_p2p      # lockstep: needs no AsyncComm calls
        sub = SubComm(c, [1 - c.rank, c.rank])
        assert isinstance(sub, Comm) and not sub.async_p2p
        assert isinstance(c.exchange(), Handle)


def _torch_comm_check(group):
    c = TorchComm(group, torch.float32, torch.device("cpu"), Op.SUM, "protocol/check")
    sub = SubComm(c, list(range(c.size)))
    return (isinstance(c, Comm), isinstance(c, AsyncComm), c.async_p2p, isinstance(sub, AsyncComm),
            isinstance(c.exchange(), Handle))


def test_the_torch_comm_is_an_async_comm_on_gloo(pool):
    for out in pool.run(_torch_comm_check, world=2):
        assert out == (True, True, True, True, True)


@pytest.mark.parametrize("cls", [TorchComm, SymComm, SubComm])
def test_the_comms_methods_take_the_protocols_parameters(cls):
    for name in _members(AsyncComm) | _members(Comm):
        spec = getattr(AsyncComm, name)
        if isinstance(spec, property) or not hasattr(cls, name):
            continue        # attributes are checked on instances; SymComm posts no single messages
        assert _params(getattr(cls, name)) == _params(spec), f"{cls.__name__}.{name}"


@pytest.mark.parametrize("name", sorted(_members(Comm)))
def test_an_object_missing_one_comm_member_is_not_a_comm(name):
    assert isinstance(_FullComm(), Comm) and isinstance(_FullComm(), AsyncComm)
    assert not isinstance(_without(_FullComm, name)(), Comm)


@pytest.mark.parametrize("name", sorted(_members(AsyncComm)))
def test_a_comm_missing_one_single_message_call_is_a_comm_but_not_an_async_one(name):
    lacking = _without(_FullComm, name)()
    assert isinstance(lacking, Comm) and not isinstance(lacking, AsyncComm)


# -- the step schedule ---------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [GradAccumulation, PipelineSchedule])
def test_both_schedules_are_step_schedules(cls):
    assert issubclass(cls, StepSchedule)
    assert _params(cls.run) == _params(StepSchedule.run)


def test_a_schedule_without_run_is_not_a_step_schedule():
    assert not isinstance(_without(GradAccumulation, "run")(), StepSchedule)
    assert not issubclass(_without(PipelineSchedule, "run"), StepSchedule)


# -- what checkpointing reads off a trainer --------------------------------------------------------

def test_the_trainer_protocol_lists_exactly_what_checkpointing_reads():
    # `saver` is checkpointing's own, kept on the trainer and made when missing.
    assert _attrs_read(SRC / "train" / "checkpointing.py", "trainer") - {"saver"} == _members(CheckpointedTrainer)


def test_the_trainer_is_a_checkpointed_trainer_and_both_loops_hold_a_step_schedule():
    trainer = Trainer(TrainConfig(strategy="single", **TINY), Topology(world=1, rank=0, dp=1))
    try:
        assert isinstance(trainer, CheckpointedTrainer)
        assert isinstance(trainer.schedule, StepSchedule)
    finally:
        trainer.close()
    worker = PSWorker(TrainConfig(strategy="ps", servers=1, **TINY), 0, 1, [1], None, None)
    try:
        assert isinstance(worker.schedule, StepSchedule)
    finally:
        worker.replica.close()


@pytest.mark.parametrize("name", sorted(_members(CheckpointedTrainer)))
def test_a_trainer_missing_one_member_is_not_a_checkpointed_trainer(name):
    full = dict.fromkeys(_members(CheckpointedTrainer))
    assert isinstance(type("Full", (), full)(), CheckpointedTrainer)
    full.pop(name)
    assert not isinstance(type("Lacking", (), full)(), CheckpointedTrainer)
