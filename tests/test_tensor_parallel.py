"""Tensor and sequence parallelism against one process, their collectives' bytes, and their dropout RNG.

Parity: a GPT split over tp = 2 and 4 ranks (world = tp), with and without sequence parallelism,
eager and sdpa attention, a vocabulary (37) that neither divides, gives the single-rank model's loss
and every parameter's gradient (reassembled from the shards with `unshard`) to rtol 1e-5 in fp32,
dropout 0, same seed.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ringzero import comm
from ringzero.parallel.recompute import Checkpointed
from ringzero.parallel.tp.rng import RNGFork, RNGTracker
from ringzero.parallel.tp.tensor_parallel import apply_tensor_parallel
from ringzero.parallel.tp.grads import TPParamKind, sync_sequence_parallel_grads, tp_param_kind, unshard
from ringzero.parallel.topology import Topology
from ringzero.plan.comm.volume import call_for, volume
from ringzero.plan.placement import Placement
from ringzero.plan.model.shapes import ModelShape
from ringzero.train.model import GPT

SHAPE = ModelShape(layers=2, hidden=16, heads=4, vocab=37, seq=8)
B = 2
RTOL, ATOL = 1e-5, 1e-7


def _batch(shape=SHAPE, b=B):
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, shape.vocab, (b, shape.seq), generator=g),
            torch.randint(0, shape.vocab, (b, shape.seq), generator=g))


def _pair(group, tp, attention="eager", dropout=0.0, world=None):
    """(topology, reference GPT, GPT to split), both built from seed 0."""
    topo = Topology.build(Placement.for_world(world or tp, tp=tp), group)
    torch.manual_seed(0)
    ref = GPT(SHAPE, attention=attention, dropout=dropout)
    return topo, ref, copy.deepcopy(ref)


def _close(label, got, want, bad):
    if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
        bad.append(f"{label}: max |diff| {float((got - want).abs().max()):.3g} "
                   f"(max |ref| {float(want.abs().max()):.3g})")


def _parity(group, tp, sp, attention, world=None):
    topo, ref, model = _pair(group, tp, attention, world=world)
    x, y = _batch()
    ref_loss = ref(x, y)
    ref_loss.backward()
    layout = apply_tensor_parallel(model, topo, sequence_parallel=sp, algorithm="ring")
    loss = model(x, y)
    loss.backward()
    sync_sequence_parallel_grads(model.parameters(), topo, algorithm="ring")
    bad = []
    _close("loss", loss.detach(), ref_loss.detach(), bad)
    want = dict(ref.named_parameters())
    assert set(dict(model.named_parameters())) == set(want)
    for name, p in model.named_parameters():
        _close(f"{name} value", unshard(p.detach(), p, topo), want[name].detach(), bad)
        _close(f"{name} grad", unshard(p.grad, p, topo), want[name].grad, bad)
    pad = model.wte.weight.grad[SHAPE.vocab - topo.tp_rank * model.wte.weight.size(0):]
    if pad.numel() and pad.abs().max() > 0:
        bad.append("padding rows of the embedding have a gradient")
    kinds = {n: tp_param_kind(p) for n, p in model.named_parameters()}
    return bad, layout.vocab_padding, kinds


@pytest.mark.timeout(120)
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("tp", [2, 4])
def test_gpt_matches_single_rank(pool, tp, sp, attention):
    results = pool.run(_parity, tp, sp, attention, world=tp)
    bad = [f"rank {r}: {b}" for r, (rank_bad, _, _) in enumerate(results) for b in rank_bad]
    assert not bad, f"{len(bad)} mismatches; first: {bad[:4]}"
    assert {pad for _, pad, _ in results} == {-SHAPE.vocab % tp}
    kinds = results[0][2]
    sharded = {n for n, k in kinds.items() if k is TPParamKind.SHARDED}
    partial = {n for n, k in kinds.items() if k is TPParamKind.PARTIAL_GRAD}
    assert sharded == {n for n in kinds if n == "wte.weight" or any(
        s in n for s in ("qkv.", "fc.", "attn.proj.weight", "mlp.proj.weight"))}
    assert partial == ({n for n in kinds if "ln" in n or n.endswith("proj.bias")} if sp else set())


@pytest.mark.timeout(60)
def test_tp_groups_inside_a_dp_by_tp_grid(pool):
    """tp = 2 on 4 ranks: two tp groups (ranks 0-1 and 2-3, sub-groups of the job) side by side."""
    results = pool.run(_parity, 2, True, "eager", 4, world=4)
    assert not [b for bad, _, _ in results for b in bad], results


def test_tp_one_leaves_the_model_as_it_is():
    torch.manual_seed(0)
    model = GPT(SHAPE)
    before = {n: p.clone() for n, p in model.state_dict().items()}
    layout = apply_tensor_parallel(model, Topology.alone(), sequence_parallel=True)
    assert (layout.tp, layout.vocab_padding, layout.styles) == (1, 0, {})
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())


# -- a model that is not ringzero's, through a plan ------------------------------------------------

class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleDict({"fc1": nn.Linear(8, 12), "act": nn.GELU(),
                                                   "fc2": nn.Linear(12, 8)}) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer["fc2"](layer["act"](layer["fc1"](x)))
        return x


PLAN = {"layers.*.fc1": "colwise", "layers.*.fc2": "rowwise"}


def _plan_parity(group, tp):
    topo = Topology.build(Placement.for_world(tp, tp=tp), group)
    torch.manual_seed(0)
    ref = TwoLinears()
    model = copy.deepcopy(ref)
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(1))
    ref_loss = ref(x).square().mean()
    ref_loss.backward()
    layout = apply_tensor_parallel(model, topo, PLAN)
    loss = model(x).square().mean()
    loss.backward()
    bad = []
    _close("loss", loss.detach(), ref_loss.detach(), bad)
    want = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        _close(f"{name} grad", unshard(p.grad, p, topo), want[name].grad, bad)
    return bad, layout.styles


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", [2, 4])
def test_plan_splits_a_custom_module(pool, tp):
    results = pool.run(_plan_parity, tp, world=tp)
    assert not [b for bad, _ in results for b in bad], results
    assert results[0][1] == {"layers.0.fc1": "colwise", "layers.1.fc1": "colwise",
                             "layers.0.fc2": "rowwise", "layers.1.fc2": "rowwise"}


# -- traffic ---------------------------------------------------------------------------------------

def _metered(group, tp, sp):
    topo, _, model = _pair(group, tp)
    apply_tensor_parallel(model, topo, sequence_parallel=sp, algorithm="ring")
    x, y = _batch()
    with comm.TrafficMeter() as step:
        model(x, y).backward()
    with comm.TrafficMeter() as sync:
        sync_sequence_parallel_grads(model.parameters(), topo, algorithm="ring")
    return topo.tp_rank, step.records, sync.records


def expected_tp_calls(shape: ModelShape, b: int, t: int, sp: bool) -> dict[str, list[int]]:
    """Collective -> element counts (whole buffers, as `plan.comm.volume.call_for` takes them) of one
    forward + backward of the GPT split over t ranks.

    Per layer: without SP, four all-reduces of b·s·h (g after attention and after the MLP in forward,
    f before qkv and before fc in backward); with SP, each becomes an all-gather or a reduce-scatter
    of the same b·s·h (forward: 2 all-gathers before qkv and fc, 2 reduce-scatters after the two
    projections; backward: the reverse).
    Outside the layers: the embedding's all-reduce of b·s·h (forward); the head's f, an all-reduce of
    b·s·h (backward), or under SP its all-gather (forward) and reduce-scatter (backward), and the
    embedding output's scatter, an all-gather of b·s·h in backward; the cross-entropy's three
    all-reduces of b·s floats (max, target logit, sum of exps; forward only).
    """
    bsh, bs, L = b * shape.seq * shape.hidden, b * shape.seq, shape.layers
    if not sp:
        return {"all_reduce": [bsh] * (4 * L + 2) + [bs] * 3}
    return {"all_reduce": [bsh] + [bs] * 3, "all_gather": [bsh] * (4 * L + 2),
            "reduce_scatter": [bsh] * (4 * L + 1)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("tp", [2, 4])
def test_traffic_is_four_all_reduces_per_layer_plus_vocab(pool, tp, sp):
    bsh, bs = B * SHAPE.seq * SHAPE.hidden, B * SHAPE.seq
    want = expected_tp_calls(SHAPE, B, tp, sp)
    per_layer_ring = 4 * 2 * (tp - 1) * bsh // tp * 4    # 4 all-reduces' bytes (or 4 AG + 4 RS, the same)
    # embedding + head: 2 all-reduces of b·s·h; under SP 1 all-reduce and 3 halves (an all-gather for the
    # scatter's backward, the head's all-gather and reduce-scatter); the loss: 3 all-reduces of b·s
    halves = 5 if sp else 4
    outside = (halves * (tp - 1) * bsh // tp + 3 * 2 * (tp - 1) * bs // tp) * 4
    for rank, step, sync in pool.run(_metered, tp, sp, world=tp):
        assert set(step) == {f"{c}/ring" for c in want}
        for coll, counts in want.items():
            rec = step[f"{coll}/ring"]
            assert rec.calls == len(counts)
            assert rec.bytes_sent == sum(volume(call_for(coll, "ring", tp, n), rank).bytes_sent for n in counts)
        assert sum(r.bytes_sent for r in step.values()) == SHAPE.layers * per_layer_ring + outside
        synced = (6 * SHAPE.layers + 2) * SHAPE.hidden          # 2 LayerNorms + 2 biases per layer, ln_f
        assert sum(r.calls for r in sync.values()) == (1 if sp else 0)
        if sp:
            assert sync["all_reduce/ring"].bytes_sent == volume(call_for("all_reduce", "ring", tp, synced),
                                                                rank).bytes_sent


# -- dropout RNG -----------------------------------------------------------------------------------

def _masks(group, sp):
    """Dropout masks of layer 0 on this rank: attention probabilities (sharded by heads) and the
    attention output (replicated; under SP a sequence shard)."""
    topo, _, model = _pair(group, 2, dropout=0.5)
    apply_tensor_parallel(model, topo, sequence_parallel=sp, seed=7)
    masks = {}
    attn = model.blocks[0].attn
    for key, mod in (("probs", attn.core.inner.drop), ("out", attn.drop.inner if sp else attn.drop)):
        mod.register_forward_hook(lambda m, i, o, key=key: masks.__setitem__(key, o == 0))
    model.train()
    model(_batch()[0])
    return masks, torch.get_rng_state()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_dropout_masks_differ_only_in_sharded_regions(pool, sp):
    (m0, state0), (m1, state1) = pool.run(_masks, sp, world=2)
    causal = torch.ones(SHAPE.seq, SHAPE.seq, dtype=torch.bool).tril()   # above: 0 without dropout
    assert 0.3 < m0["probs"][:, causal].float().mean() < 0.7
    assert not torch.equal(m0["probs"], m1["probs"])          # each rank's heads: its own masks
    assert torch.equal(m0["out"], m1["out"]) != sp             # replicated: one mask; SP shards: their own
    assert torch.equal(state0, state1)                        # the default stream stays in step


def test_checkpoint_context_replays_the_tracked_state():
    """A checkpointed region that forks inside needs `tracker.checkpoint_context` to redraw its forward's
    masks; a fork outside the checkpointed module (RNGFork(Checkpointed(core))) needs nothing."""
    x = torch.randn(4, 64, requires_grad=True)

    def grads(mode):
        tracker = RNGTracker.model_parallel(0, tp_rank=1)
        inner = nn.Sequential(nn.Dropout(0.5))
        if mode == "outside":
            fn = RNGFork(Checkpointed(inner), tracker)
        else:
            fork = RNGFork(inner, tracker)
            kw = {"context_fn": tracker.checkpoint_context} if mode == "inside" else {}
            fn = (lambda v: checkpoint(fork, v, use_reentrant=False, **kw)) if mode != "plain" else fork
        return torch.autograd.grad((fn(x) * x).sum(), x)[0]

    plain = grads("plain")
    assert torch.equal(grads("inside"), plain) and torch.equal(grads("outside"), plain)
    assert not torch.equal(grads("inside, no context_fn"), plain)


# -- bad input -------------------------------------------------------------------------------------

def _topo(tp):
    return Topology(world=tp, rank=0, dp=1, tp=tp)          # no process groups: errors come first


@pytest.mark.parametrize("shape, tp, sp, match", [
    (ModelShape(layers=1, hidden=12, heads=3, vocab=11, seq=8), 2, False, "attention heads"),
    (ModelShape(layers=1, hidden=16, heads=4, vocab=11, seq=8, ffn=30), 4, False, "MLP width"),
    (ModelShape(layers=1, hidden=16, heads=4, vocab=11, seq=6), 4, True, "sequence length 6"),
])
def test_gpt_shape_errors(shape, tp, sp, match):
    with pytest.raises(ValueError, match=match):
        apply_tensor_parallel(GPT(shape), _topo(tp), sequence_parallel=sp)


@pytest.mark.parametrize("plan, tp, sp, match", [
    ({"layers.*.fc3": "colwise"}, 2, False, "matches no module"),
    ({"layers.*.act": "colwise"}, 2, False, "GELU"),
    ({"layers.*.fc1": "diagonal"}, 2, False, "allowed: colwise, rowwise"),
    ({"layers.*.fc1": "colwise"}, 2, True, "sequence_parallel needs"),
    ({"layers.*.fc1": "colwise", "layers.*.fc2": "rowwise"}, 5, False, "tp=5 does not divide the 12 output"),
])
def test_plan_errors(plan, tp, sp, match):
    model = TwoLinears()
    with pytest.raises(ValueError, match=match):
        apply_tensor_parallel(model, _topo(tp), plan, sequence_parallel=sp)
    assert all(isinstance(layer["fc1"], nn.Linear) for layer in model.layers)     # nothing split


def test_plan_none_needs_the_gpt():
    with pytest.raises(ValueError, match="give a plan"):
        apply_tensor_parallel(TwoLinears(), _topo(2))



# -- one block alone, as the step-time probe times it ----------------------------------------------

def _block_pass(group, sp, recompute):
    """A block split with `split_block`: its output against the whole block's, and the collectives
    of one forward and backward (`probe_tp.TPLayerPass`, the probe's tp pass)."""
    from ringzero.parallel.tp.tensor_parallel import split_block
    from ringzero.run.config import TrainConfig
    from ringzero.train.model import Block
    from ringzero.train.probe_tp import TPLayerPass
    topo = Topology.build(Placement.for_world(2, tp=2), group)
    torch.manual_seed(0)
    whole = Block(SHAPE, "eager", 0.0)
    split = copy.deepcopy(whole)
    split_block(split, topo, sequence_parallel=sp, algorithm="ring")
    x = torch.randn(B, SHAPE.seq, SHAPE.hidden)
    mine = x.chunk(2, dim=1)[topo.tp_rank] if sp else x
    want = whole(x).chunk(2, dim=1)[topo.tp_rank] if sp else whole(x)
    same = torch.allclose(split(mine), want, rtol=RTOL, atol=1e-6)
    cfg = TrainConfig(model="nano", seq=SHAPE.seq, micro_batch=B, tp=2, dp=1, sequence_parallel=sp,
                      recompute=recompute, comm_algorithm="ring")
    one = TPLayerPass(cfg, topo, torch.float32)
    one()                                                   # first use outside the meter
    with comm.TrafficMeter() as meter:
        one()
    return same, {k: r.calls for k, r in meter.records.items()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_a_split_block_is_the_layer_the_step_runs(pool, sp, recompute):
    """Its output is the whole block's (this rank's sequence shard under SP), and one pass makes the
    collectives `plan.strategies.tensor_parallel.layer_collectives` counts for a layer of the step."""
    from ringzero.plan.strategies.tensor_parallel import layer_collectives
    want = {f"{c}/ring": k for _, c, k in layer_collectives(sp, recompute)}
    for same, calls in pool.run(_block_pass, sp, recompute, world=2):
        assert same
        assert calls == want
