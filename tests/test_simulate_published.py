"""The simulator against published nccl-tests runs: the NVLink figures fitted to Azure's ND A100 v4
all_reduce_perf run at two sizes are the `nd-a100-v4` preset's, and with them the simulated ring's
busbw is within 15 % of the published one at every other size from 16 MiB to 8 GiB."""

import pytest

from ringzero.simulate import calibrate
from ringzero.simulate.published import AZURE_ND_A100_V4, GCP_A3_MEGA_16, GiB, MiB, RUNS
from ringzero.simulate.topology import preset

AT = (32 * MiB, 8 * GiB)


@pytest.fixture(scope="module")
def fitted():
    return calibrate.fit(AZURE_ND_A100_V4, "ring", AT)


def test_the_fit_meets_both_sizes_and_is_the_preset(fitted):
    for s in AT:
        assert calibrate.busbw(fitted, "ring", s) == pytest.approx(AZURE_ND_A100_V4.at(s), rel=1e-6)
    p = preset("nd-a100-v4", 8)
    assert p.nvlink_bw == pytest.approx(fitted.nvlink_bw, rel=2e-3)
    assert p.nvlink_latency == pytest.approx(fitted.nvlink_latency, rel=2e-3)
    assert (p.nic_bw, p.nic_latency) == (preset("dgx-a100", 8).nic_bw, preset("dgx-a100", 8).nic_latency)


def test_every_other_size_from_16_mib_to_8_gib_is_within_15_percent():
    rows = calibrate.compare(AZURE_ND_A100_V4, preset("nd-a100-v4", 8), "ring",
                             AZURE_ND_A100_V4.sizes(16 * MiB, 8 * GiB), AT)
    assert len(rows) == 10 and sum(r.calibrated for r in rows) == 2
    bad = [f"{r.nbytes}: {r.simulated:.1f} vs {r.published:.1f} GB/s ({r.error:+.1%})" for r in rows if abs(r.error) > 0.15]
    assert not bad, bad
    assert calibrate.geomean_error(rows) < 0.097          # ASTRA-sim's own best, at 2-8 GPUs


def test_the_uncalibrated_preset_is_not_within_15_percent():
    # the nominal 300 GB/s per direction is not what NCCL reaches: the fit is what closes the gap
    rows = calibrate.compare(AZURE_ND_A100_V4, preset("dgx-a100", 8), "ring", AZURE_ND_A100_V4.sizes(16 * MiB))
    assert all(r.error > 0.15 for r in rows), [round(r.error, 3) for r in rows]


def test_a_fit_is_found_on_the_nics_too():
    # the multi-node run: a single ring crossing the nodes on two NICs needs a NIC no network has to
    # match NCCL's many channels over eight; the fit still solves its two sizes exactly
    at = (64 * MiB, 8 * GiB)
    topo = calibrate.fit(GCP_A3_MEGA_16, "ring", at, link="nic")
    for s in at:
        assert calibrate.busbw(topo, "ring", s) == pytest.approx(GCP_A3_MEGA_16.at(s), rel=1e-6)
    assert topo.nic_bw > 8 * 200e9 / 8          # more than the node's eight 200 Gb/s NICs together


def test_every_published_run_is_well_formed():
    for run in RUNS.values():
        sizes = [s for s, _ in run.busbw]
        assert sizes == sorted(sizes) and all(b > 0 for _, b in run.busbw) and run.source
        assert run.gpus % run.gpus_per_node == 0


def test_a_run_no_figure_of_the_link_can_reach_is_refused_with_the_cap():
    # the leader-based hierarchical all-reduce moves the whole buffer over NVLink twice: at 8 GiB it
    # gets about 139 GB/s even over infinitely fast NICs, not the published 337
    with pytest.raises(ValueError, match=r"hierarchical cannot reach the published 337.35 GB/s at 8589934592 bytes "
                                         r"by fitting the nic: it gets at most 13\d\.\d\d GB/s"):
        calibrate.fit(GCP_A3_MEGA_16, "hierarchical", (64 * MiB, 8 * GiB), link="nic")


@pytest.mark.parametrize("kw, match", [(dict(at=(8 * GiB, 8 * GiB)), "two different sizes"),
                                       (dict(at=AT, link="pcie"), "a link in nvlink, nic")])
def test_bad_fit_input_is_one_line(kw, match):
    with pytest.raises(ValueError, match=match):
        calibrate.fit(AZURE_ND_A100_V4, "ring", **kw)
