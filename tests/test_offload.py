"""ZeRO-Offload (cpu) and ZeRO-Infinity (nvme) for the optimizer: bit-for-bit the same steps as
`ShardedAdam` (fp32, bf16, fp16 with an overflow; clipping; several buckets; shards that are not a
multiple of the chunk), bytes by location and bytes read and written per step equal to
`plan.strategies.offload`'s formulas, the swap pipeline's time model, one-line errors for bad configurations,
and swap files that do not outlive the optimizer."""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero.parallel.offload.nvme_swap import probe_disk
from ringzero.parallel.offload.config import OffloadConfig, check_directory, check_offload
from ringzero.parallel.offload.optimizer import CpuOffloadAdam, NvmeOffloadAdam, offloaded_adam
from ringzero.parallel.offload.params import ParamStore
from ringzero.parallel.optimizer import AdamConfig, ShardedAdam
from ringzero.plan.strategies import offload as plan
from ringzero.plan.strategies.offload import ALIGN_NUMEL, OffloadDevice, OffloadRates

SIZES = [5000, 3001, 12345]
"""Three buckets; with 2048-element chunks none is a multiple of the chunk."""
ADAM = AdamConfig(lr=1e-2, weight_decay=0.1, clip=0.05)
"""A clip low enough to bite on every step."""


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: these shards are tiny, and on shared cores a thread pool woken for
    each 2048-element call costs milliseconds. Thread counts do not change the bits (the fused
    kernel splits its range at multiples of 16 elements); `test_parity_with_the_thread_pool` runs
    the default pool."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def swap_dir(tmp_path):
    """(a directory for swap files, whether it takes O_DIRECT: some file systems do not)."""
    try:
        check_directory(str(tmp_path), direct_io=True)
        return str(tmp_path), True
    except ValueError:
        return str(tmp_path), False


def offload_config(device: str, swap_dir, **kw) -> OffloadConfig:
    if device != "nvme":
        return OffloadConfig(device=device, **kw)
    return OffloadConfig(device=device, nvme_path=swap_dir[0], direct_io=swap_dir[1], **kw)


def shards(sizes, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype) for n in sizes]


def states(opt):
    """(master, m, v) per bucket, wherever they live."""
    if isinstance(opt, NvmeOffloadAdam):
        return opt.read_state()
    return opt.master, opt.exp_avg, opt.exp_avg_sq


def run_both(sizes, dtype, offload, steps, seed=0, overflow_at=None):
    """`steps` steps of ShardedAdam and of the offloaded optimizer on the same gradients; returns
    (reference, offloaded, their step results, the offloaded optimizer's io_bytes per step)."""
    ref = ShardedAdam(shards(sizes, dtype, seed), ADAM)
    opt = offloaded_adam(shards(sizes, dtype, seed), ADAM, offload, rank=3)
    g = torch.Generator().manual_seed(seed + 1)
    outs, io = [], []
    for s in range(steps):
        grads = [(torch.randn(n, generator=g) * 1e3).to(dtype) for n in sizes]
        if s == overflow_at:
            grads[1][7] = float("inf")
        scale = 1024.0 if dtype == torch.float16 else 1.0
        a = ref.step([x.clone() for x in grads], divisor=4.0, loss_scale=scale, lr=1e-2 / (1 + s))
        b = opt.step([x.clone() for x in grads], divisor=4.0, loss_scale=scale, lr=1e-2 / (1 + s))
        outs.append((a, b))
        io.append(opt.io_bytes())
    return ref, opt, outs, io


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_twenty_steps_are_bit_for_bit_sharded_adam_and_bytes_are_the_planners(device, dtype, swap_dir):
    offload = offload_config(device, swap_dir, buffer_numel=2048, buffer_count=3)
    ref, opt, outs, io = run_both(SIZES, dtype, offload, steps=20)
    try:
        assert all(a == b and not a["skipped"] and a["grad_norm"] > ADAM.clip for a, b in outs)
        assert all(torch.equal(x, y) for x, y in zip(ref.shards, opt.shards))
        for want, got in zip(states(ref), states(opt)):
            assert all(torch.equal(x.float(), y) for x, y in zip(want, got))
        wb = ref.shards[0].element_size()
        assert opt.placement_bytes() == offload.needs(SIZES, wb).as_dict()
        assert opt.state_bytes() == 0 and opt.placement_bytes()["device"] == 0
        assert io[-1] == plan.io_per_step(offload.device, SIZES, offload.buffer_numel)
        assert ref.placement_bytes() == plan.placement(OffloadDevice.NONE, SIZES, wb, 4, 2048).as_dict()
    finally:
        opt.close()


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_parity_with_the_thread_pool(device, swap_dir, one_thread):
    torch.set_num_threads(max(2, torch.get_num_threads()))
    offload = offload_config(device, swap_dir, buffer_numel=8192)
    ref, opt, outs, _ = run_both([20000, 9001], torch.bfloat16, offload, steps=3)
    opt.close()
    assert all(a == b for a, b in outs) and all(torch.equal(x, y) for x, y in zip(ref.shards, opt.shards))


def test_nvme_bytes_counted_on_a_small_case_by_hand(swap_dir):
    # chunks of 2048: bucket 0 (5000) -> 2048, 2048, 904 -> records of 2048, 2048, 1024 elements.
    offload = offload_config("nvme", swap_dir, buffer_numel=2048, buffer_count=3)
    need = offload.needs([5000], 4)
    assert need.disk == 12 * (2048 + 2048 + 1024)
    assert need.host == 3 * 4 * 4 * 2048 + 4096
    assert plan.io_per_step(OffloadDevice.NVME, [5000], 2048) == {"read": need.disk, "write": need.disk}
    assert OffloadConfig(device="cpu", buffer_numel=2048).needs([5000], 2).host == 12 * 5000 + 4 * 2048


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_fp16_overflow_skips_the_step_everywhere_and_moves_no_bytes(device, swap_dir):
    offload = offload_config(device, swap_dir, buffer_numel=4096)
    ref, opt, outs, io = run_both(SIZES, torch.float16, offload, steps=4, overflow_at=2)
    try:
        assert [b["skipped"] for _, b in outs] == [False, False, True, False]
        assert all(a == b for a, b in outs)
        assert all(torch.equal(x, y) for x, y in zip(ref.shards, opt.shards))
        moved = plan.io_per_step(offload.device, SIZES, offload.buffer_numel)
        assert io[2] == {"read": 0, "write": 0} and io[3] == moved
    finally:
        opt.close()


@settings(max_examples=12, deadline=None)
@given(sizes=st.lists(st.integers(1, 9000), min_size=1, max_size=3),
       blocks=st.integers(1, 5), count=st.integers(2, 5), seed=st.integers(0, 2**16))
def test_any_chunking_gives_the_unchunked_bits(tmp_path_factory, sizes, blocks, count, seed):
    """Fused AdamW is elementwise: chunks that start at multiples of ALIGN_NUMEL give the bits of
    one call over the shard, for any shard sizes, chunk size and buffer count."""
    path = str(tmp_path_factory.mktemp("swap"))
    direct = True
    try:
        check_directory(path, True)
    except ValueError:
        direct = False
    offload = OffloadConfig(device="nvme", nvme_path=path, buffer_numel=blocks * ALIGN_NUMEL,
                            buffer_count=count, direct_io=direct)
    ref, opt, outs, io = run_both(sizes, torch.float32, offload, steps=3, seed=seed)
    try:
        assert all(a == b for a, b in outs)
        assert all(torch.equal(x, y) for x, y in zip(ref.shards, opt.shards))
        assert opt.placement_bytes() == offload.needs(sizes, 4).as_dict()
        assert io[-1] == plan.io_per_step(offload.device, sizes, offload.buffer_numel)
    finally:
        opt.close()
    assert os.listdir(path) == []


def test_swap_file_is_named_by_rank_and_pid_unique_and_removed_at_close(swap_dir):
    offload = offload_config("nvme", swap_dir, buffer_numel=2048)
    a = NvmeOffloadAdam(shards(SIZES, torch.float32), ADAM, offload, rank=5)
    b = NvmeOffloadAdam(shards(SIZES, torch.float32), ADAM, offload, rank=5)
    names = sorted(os.listdir(swap_dir[0]))
    assert len(names) == 2 and all(f"rank5-pid{os.getpid()}" in n for n in names)
    a.close()
    a.close()                        # idempotent
    b.close()
    assert os.listdir(swap_dir[0]) == []


def test_probing_a_live_swap_file_leaves_its_state_as_it_was(swap_dir):
    offload = offload_config("nvme", swap_dir, buffer_numel=2048)
    ref, opt, _, _ = run_both(SIZES, torch.bfloat16, offload, steps=2)
    try:
        before = opt.read_state()
        rates = opt.probe_disk()
        assert set(rates) == {"write_gbps", "read_gbps"} and all(r > 0 for r in rates.values())
        assert all(torch.equal(x, y) for a, b in zip(before, opt.read_state()) for x, y in zip(a, b))
    finally:
        opt.close()


def test_factory_follows_the_device_and_direct_io_off_works(swap_dir):
    w = shards([3000], torch.float32)
    assert type(offloaded_adam(w, ADAM, OffloadConfig())) is ShardedAdam
    assert type(offloaded_adam(w, ADAM, OffloadConfig(device="cpu"))) is CpuOffloadAdam
    offload = OffloadConfig(device="nvme", nvme_path=swap_dir[0], direct_io=False, buffer_numel=1024)
    ref, opt, outs, _ = run_both([3000], torch.float32, offload, steps=2)
    opt.close()
    assert all(torch.equal(x, y) for x, y in zip(ref.shards, opt.shards))


@pytest.mark.parametrize("kw, words", [
    (dict(device="disk"), "offload device must be one of none, cpu, nvme, got 'disk'"),
    (dict(device="nvme"), "needs nvme_path"),
    (dict(device="cpu", nvme_path="/tmp"), "nvme_path is only used with offload device 'nvme'"),
    (dict(device="cpu", buffer_count=1), "buffer_count must be an integer >= 2"),
    (dict(device="cpu", buffer_numel=1000), "buffer_numel must be a positive multiple of 1024"),
    (dict(device="cpu", buffer_numel=0), "buffer_numel must be a positive multiple of 1024"),
])
def test_bad_configs_are_one_line_errors(kw, words):
    with pytest.raises(ValueError, match=words) as e:
        OffloadConfig(**kw)
    assert "\n" not in str(e.value)


def one_line_error(fn, *args) -> str:
    with pytest.raises(ValueError) as e:
        fn(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_unusable_nvme_paths_and_short_resources_are_one_line_errors(tmp_path, swap_dir):
    nvme = lambda p: OffloadConfig(device="nvme", nvme_path=str(p), direct_io=swap_dir[1])  # noqa: E731
    assert "does not exist" in one_line_error(check_offload, nvme(tmp_path / "missing"), 0, 0)
    (tmp_path / "file").write_text("x")
    assert "is not a directory" in one_line_error(check_offload, nvme(tmp_path / "file"), 0, 0)
    (tmp_path / "file").unlink()
    free = os.statvfs(swap_dir[0]).f_bavail * os.statvfs(swap_dir[0]).f_frsize
    assert "GiB free, the optimizer's swap files need" in one_line_error(
        check_offload, nvme(swap_dir[0]), 0, free + 2**40)
    assert "of host memory for the optimizer" in one_line_error(
        check_offload, OffloadConfig(device="cpu"), 2**62, 0)
    check_offload(nvme(swap_dir[0]), 2**20, 2**20)        # enough of both: no error
    check_offload(OffloadConfig(), 2**62, 2**62)           # nothing offloaded: nothing to check
    assert os.listdir(swap_dir[0]) == []


def test_a_read_only_nvme_path_is_a_one_line_error(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    config = OffloadConfig(device="nvme", nvme_path=str(locked), direct_io=False)
    if os.geteuid() == 0:            # root writes anywhere: refuse as a read-only mount would
        def refuse(*args, **kw):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr("ringzero.parallel.offload.config.tempfile.mkstemp", refuse)
    try:
        assert "is not writable (Permission denied)" in one_line_error(check_offload, config, 0, 0)
    finally:
        locked.chmod(0o700)


def test_a_path_without_direct_io_is_a_one_line_error(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")
        return real_open(path, flags, *args)
    monkeypatch.setattr(os, "open", no_direct)
    config = OffloadConfig(device="nvme", nvme_path=str(tmp_path))
    assert "does not support direct I/O (Invalid argument); set direct_io=False" in one_line_error(
        check_offload, config, 0, 0)
    assert os.listdir(tmp_path) == []


def test_probe_disk_measures_both_ways_and_leaves_nothing(swap_dir):
    rates = probe_disk(swap_dir[0], nbytes=4 << 20, buffer_numel=1 << 18, direct_io=swap_dir[1])
    assert set(rates) == {"write_gbps", "read_gbps"} and all(r > 0 for r in rates.values())
    assert os.listdir(swap_dir[0]) == []


# -- the time model ----------------------------------------------------------------------------
def test_swap_pipeline_fill_and_drain():
    n, r, c, w = 6, 1.0, 5.0, 2.0
    # Compute-bound: the first read fills, the last write drains, the updates run back to back.
    assert plan.swap_seconds([r] * n, [c] * n, [w] * n, 3) == r + n * c + w
    # Nothing to compute: the one I/O thread never idles.
    assert plan.swap_seconds([r] * n, [0.0] * n, [w] * n, 2) == n * (r + w)
    # One chunk: no overlap at all.
    assert plan.swap_seconds([r], [c], [w], 4) == r + c + w
    # I/O-bound (r + w > c): a chunk costs r + w in steady state; more buffers only move reads earlier.
    t = plan.swap_seconds([r] * n, [1.0] * n, [w] * n, 2)
    assert n * (r + w) <= t <= n * (r + w) + 1.0


def test_update_seconds_cpu_is_the_serial_chunk_loop_and_nvme_adds_only_fill_and_drain():
    rates = OffloadRates(adam_per_s=1e6, transfer_bw=1e7, read_bw=1e8, write_bw=1e8)
    sizes = [8192, 6144]                     # equal chunks of 2048, each compute-bound
    cpu = plan.update_seconds(OffloadDevice.CPU, sizes, 2, 4, 2048, rates)
    assert cpu == pytest.approx(sum(sizes) * (1 / 1e6 + 4 / 1e7))
    nvme = plan.update_seconds(OffloadDevice.NVME, sizes, 2, 4, 2048, rates)
    record = plan.chunks(sizes, 2048)[0].record_bytes
    assert nvme == pytest.approx(cpu + record / 1e8 + record / 1e8)
    assert plan.update_seconds(OffloadDevice.NONE, sizes, 2, 4, 2048, rates) == sum(sizes) / 1e6
    with pytest.raises(ValueError, match="read_bw must be > 0"):
        OffloadRates(adam_per_s=1.0, transfer_bw=1.0, read_bw=0.0)


# -- ZeRO-3 weight shards off the device ---------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_param_store_round_trips_with_prefetch_in_zero3_order_and_bytes_are_the_planners(device, dtype, swap_dir):
    sizes = [3000, 1, 7777, 4096, 2500]
    offload = offload_config(device, swap_dir, buffer_count=3)
    values = shards(sizes, dtype)
    store = ParamStore(values, offload, rank=2)
    try:
        wb = values[0].element_size()
        assert store.placement_bytes() == plan.param_placement(offload.device, sizes, wb, 3).as_dict()
        order = list(range(len(sizes)))
        for layers, ahead in ((order, 1), (order[::-1], -1)):     # forward, then backward
            for i in layers:
                for j in (i + ahead, i + 2 * ahead):             # prefetch two layers ahead
                    if 0 <= j < len(sizes):
                        store.prefetch(j)
                assert torch.equal(store.load(i), values[i])
        store.prefetch(3)
        assert device == "cpu" or 3 in store.pending
        values = shards(sizes, dtype, seed=9)          # the optimizer's update, stored back
        for i, v in enumerate(values):
            store.store(i, v)
        assert all(torch.equal(store.load(i), v) for i, v in enumerate(values))   # no stale prefetch
        if device == "nvme":
            records = [plan.param_record_bytes(n, wb) for n in sizes]
            assert store.io_bytes() == {"read": 3 * sum(records), "write": sum(records)}
            assert len(os.listdir(swap_dir[0])) == 1
    finally:
        store.close()
    assert os.listdir(swap_dir[0]) == []


def test_param_store_refuses_no_offload():
    assert "needs offload device 'cpu' or 'nvme'" in one_line_error(ParamStore, [torch.zeros(4)], OffloadConfig())


def test_cpu_update_time_is_the_coarse_planners_offload_term_and_devices_are_its_choices():
    """With the coarse planner's rates, the chunked cpu model gives `step_time.offload_seconds`
    (PCIe both ways plus host Adam); nvme differs on purpose (its I/O overlaps the update here)."""
    from ringzero.plan import Parallel, Training, hardware, model, param_count
    from ringzero.plan.config import OFFLOADS
    from ringzero.plan.strategies.memory import model_parallel_params
    from ringzero.plan.step_time import offload_seconds
    m, tr, hw = model("gpt2"), Training(precision="bf16"), hardware("a100-80gb")
    shard = -(-model_parallel_params(param_count(m).total) // 8)
    coarse = offload_seconds(m, tr, Parallel(dp=8, zero=2, offload="cpu"), hw)
    rates = OffloadRates.for_hardware(hw)
    assert plan.update_seconds(OffloadDevice.CPU, [shard], 2, 4, 1 << 22, rates) == pytest.approx(coarse)
    assert [d.value for d in OffloadDevice] == list(OFFLOADS)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_offload_moves_real_bytes_between_a_gpu_and_pinned_host_memory(dtype):
    """On a GPU the states live in pinned host memory, the update runs on the host, and the weights
    that come back equal a host-only `ShardedAdam`'s bit for bit (the same host kernel ran)."""
    gen = torch.Generator().manual_seed(0)
    host = [torch.randn(5000, generator=gen).to(dtype) for _ in range(2)]
    grads = [[torch.randn(5000, generator=gen).to(dtype) for _ in range(2)] for _ in range(3)]
    device = [w.cuda() for w in host]
    cfg = AdamConfig(lr=1e-2, clip=0.5)
    ref = ShardedAdam([w.clone() for w in host], cfg)
    opt = CpuOffloadAdam(device, cfg, OffloadConfig(device="cpu", buffer_numel=2048))
    assert all(t.is_pinned() for t in opt.master + opt.exp_avg + opt.exp_avg_sq)
    for g in grads:
        ref.step([x.clone() for x in g], divisor=2.0)
        opt.step([x.cuda() for x in g], divisor=2.0)
    for want, got in zip(ref.shards, device):
        assert got.is_cuda and torch.equal(got.cpu(), want)
    assert opt.placement_bytes()["device"] == 0 and opt.state_bytes() == 0
