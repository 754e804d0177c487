"""`ringzero plan`: the tables, the JSON schema, flag handling, bad input, the plot and the search."""

import json
import os

import pytest

from ringzero import cli
from ringzero.commands import plan as plan_cmd
from ringzero.plan.strategies import compare
from ringzero.plan.config import Parallel, Training
from ringzero.plan.model.presets import MODELS, TRAINED_TOKENS
from ringzero.plan.units import parse_bandwidth

SPEC = ["plan", "--model", "llama-2-7b", "--gpus", "8", "--gpu", "a100-80gb", "--zero", "3"]
CUSTOM = ["--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "1000", "--seq", "128"]


def _main(argv, capsys):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _json(argv, capsys) -> dict:
    code, out, err = _main([*argv, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def test_spec_example_prints_every_section_with_units(capsys):
    code, out, err = _main([*SPEC, "--days", "30"], capsys)
    assert code == 0, err
    for section in ("Inputs", "Size and compute", "Memory per GPU", "Communication per GPU per step",
                    "the textbook formula vs the exact bytes", "Time per step"):
        assert section in out
    assert "GB (10⁹ B)" in out and "GiB (2³⁰ B)" in out
    assert "6,738,415,616" in out and "L(12h²+5h)" in out
    assert "gradient reduce-scatter" in out and "weight all-gather before forward" in out
    assert "GPUs for 30 days" in out and "implied MFU" in out
    assert "2 T tokens (llama-2-7b's training run)" in out


def test_json_has_the_schema_keys_and_echoes_the_inputs(capsys):
    d = _json(SPEC, capsys)
    assert d["schema"] == "ringzero.plan/1"
    for k in ("params", "flops_per_step", "flops_total", "fits", "mfu", "tokens_per_s"):
        assert k in d
    assert set(d["memory"]) >= {"params", "grads", "optimizer", "activations", "buffers", "total"}
    assert set(d["comm"]) == {"dp", "tp", "pp", "zero"}
    assert set(d["time"]) >= {"compute", "comm", "exposed_comm", "bubble", "step"}
    inp = d["inputs"]
    assert inp["model"]["name"] == "llama-2-7b" and inp["model"]["layers"] == 32
    assert inp["parallel"] == {**inp["parallel"], "dp": 8, "tp": 1, "pp": 1, "zero": 3}
    assert inp["hardware"]["name"] == "a100-80gb" and inp["gpus"] == 8
    assert inp["tokens"] == TRAINED_TOKENS["llama-2-7b"]
    assert d["params"] == 6_738_415_616 and d["comm"]["zero"] > 0 == d["comm"]["dp"]
    assert "gpus_for_days" not in d


def test_flags_override_a_preset(capsys):
    full = _json(SPEC, capsys)
    half = _json([*SPEC, "--layers", "16"], capsys)
    for k in ("attention", "mlp"):
        assert half["params_by_component"][k] * 2 == full["params_by_component"][k]
    assert half["params_by_component"]["embedding"] == full["params_by_component"]["embedding"]
    assert half["inputs"]["model"]["layers"] == 16
    assert half["inputs"]["model"]["name"] == "llama-2-7b (modified)"
    untied = _json(["plan", "--model", "gpt2", "--no-tied", "--kv-heads", "4"], capsys)
    assert untied["params_by_component"]["head"] == 50257 * 768
    assert untied["inputs"]["model"]["kv_heads"] == 4


def test_explicit_shape_defaults_to_20_tokens_per_parameter(capsys):
    d = _json(["plan", *CUSTOM, "--gated", "--no-bias", "--positions", "rotary", "--norm", "rmsnorm"],
              capsys)
    m = d["inputs"]["model"]
    assert (m["name"], m["gated"], m["bias"], m["positions"], m["norm"]) == \
        ("custom", True, False, "rotary", "rmsnorm")
    assert d["inputs"]["tokens"] == 20.0 * d["params"]


def test_gpus_tokens_and_hardware_flags(capsys):
    d = _json(["plan", "--model", "gpt2", "--gpus", "16", "--tp", "2", "--pp", "2", "--tokens", "300B",
               "--gpu", "h100-sxm", "--mfu", "0.4", "--hbm", "40GiB", "--inter-bw", "200Gbit/s",
               "--intra-bw", "450GB/s", "--gpus-per-node", "4", "--days", "10"], capsys)
    p, hw = d["inputs"]["parallel"], d["inputs"]["hardware"]
    assert (p["dp"], p["tp"], p["pp"]) == (4, 2, 2) and d["inputs"]["tokens"] == 300e9
    assert (hw["target_mfu"], hw["hbm_bytes"], hw["inter_bw"], hw["intra_bw"], hw["gpus_per_node"]) == \
        (0.4, 40 * 2**30, 25e9, 450e9, 4)
    assert d["gpus_for_days"]["days"] == 10 and d["gpus_for_days"]["gpus"] >= 1
    assert d["comm"]["tp"] > 0 and d["comm"]["pp"] > 0 and d["comm"]["dp"] > 0


def test_quantity_parsers():
    assert plan_cmd.parse_count("300e9") == plan_cmd.parse_count("300B") == 300e9
    assert plan_cmd.parse_count("2T") == 2e12 and plan_cmd.parse_count("1.5m") == 1.5e6
    assert parse_bandwidth("300GB/s", "--intra-bw").bytes_per_s == 300e9
    assert parse_bandwidth("200Gbit/s", "--inter-bw").bytes_per_s == 25e9
    assert plan_cmd.parse_bytes("80GiB", "--hbm") == 80 * 2**30
    assert plan_cmd.parse_bytes("8.5e10", "--hbm") == 8.5e10
    for bad in ("", "two", "5X", "-3"):
        with pytest.raises(ValueError):
            plan_cmd.parse_count(bad)
    with pytest.raises(ValueError, match="unknown unit"):
        plan_cmd.parse_bytes("80Gbit", "--hbm")


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt5"], "unknown model 'gpt5'; allowed: nano"),
    (["--model", "llama-2-7b", "--zero", "5"], "--zero=5 is not supported; allowed: 0, 1, 2, 3"),
    (["--model", "llama-2-7b", "--tp", "3"], "--tp 3 must divide the 32 attention heads; allowed: 1, 2, 4"),
    (["--model", "llama-2-70b", "--tp", "16"], "and the 8 kv heads; allowed: 1, 2, 4, 8"),
    (["--model", "gpt2", "--gpus", "8", "--dp", "3"], "= 3 must equal --gpus 8"),
    (["--model", "gpt2", "--gpus", "8", "--pp", "3"], "--gpus 8 is not divisible by tp x pp = 1 x 3"),
    (["--layers", "2", "--heads", "4"], "missing --hidden, --vocab, --seq"),
    ([], "missing --layers, --hidden, --heads, --vocab, --seq"),
    (["--model", "gpt2", "--tokens", "3X"], "--tokens='3X': unknown suffix"),
    (["--model", "gpt2", "--precision", "fp8"], "--precision='fp8' is not supported; allowed: fp32"),
    (["--model", "gpt2", "--gpu", "v100"], "unknown gpu 'v100'; allowed: a100-40gb"),
    (["--model", "gpt2", "--offload", "cpu"], "--offload='cpu' needs zero >= 1"),
    (["--model", "gpt2", "--pp", "13"], "--pp 13 is more stages than the 12 layers"),
    (["--model", "gpt2", "--gpus", "2", "--global-batch", "3"], "--global-batch=3 must be a multiple"),
    (["--model", "gpt2", "--mfu", "1.5"], "--mfu must be in (0, 1]"),
    (["--model", "gpt2", "--days", "0"], "--days must be > 0"),
    (["--model", "gpt2", "--top", "0"], "--top must be >= 1"),
    (["--model", "gpt2", "--plot", "plan.doc"], "format .doc is not one matplotlib writes; allowed: .png"),
    (["--model", "gpt2", "--plot", "/no/such/dir/plan.png"], "does not exist"),
    (["--model", "gpt2", "--tokens", "-5B"], "--tokens must be > 0, got '-5B'"),
    (["--model", "gpt2", "--tokens=-5B"], "--tokens must be > 0, got '-5B'"),
    (["--model", "gpt2", "--tokens", "0"], "--tokens must be > 0, got '0'"),
    (["--model", "gpt2", "--hbm", "-80GiB"], "--hbm must be > 0, got '-80GiB'"),
    (["--model", "gpt2", "--inter-bw", "-25GB/s"], "--inter-bw must be > 0, got '-25GB/s'"),
    (["--model", "gpt2", "--gpus", "16", "--gpus-per-node", "3"],
     "--gpus 16 does not fill whole nodes of --gpus-per-node 3"),
    (["--model", "gpt2", "--gpus", "12"], "--gpus 12 does not fill whole nodes of --gpus-per-node 8"),
    (["--model", "gpt2", "--gpus", "8", "--servers", "0"], "--servers must be >= 1, got 0"),
    (["--model", "gpt2", "--gpus", "8", "--zero", "1", "--servers", "2"], "needs --tp 1 --pp 1 --zero 0"),
    (["--model", "gpt2", "--gpus", "8", "--tp", "2", "--servers", "2"], "got --tp 2 --pp 1"),
])
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    code, out, err = _main(["plan", *argv], capsys)
    assert code == 2 and out == ""
    assert err.startswith("ringzero: error: ") and len(err.strip().splitlines()) == 1
    assert message in err


def test_nodes_that_fill_or_one_node_are_accepted(capsys):
    for argv in (["--gpus", "16", "--gpus-per-node", "4"], ["--gpus", "2", "--gpus-per-node", "3"],
                 ["--gpus", "12", "--gpus-per-node", "6"]):
        code, _, err = _main(["plan", "--model", "gpt2", *argv, "--json"], capsys)
        assert code == 0, (argv, err)


def test_a_bad_output_path_fails_before_the_plan_is_computed(tmp_path, capsys, monkeypatch):
    def never(*args, **kw):
        raise AssertionError("computed before the output path was checked")
    monkeypatch.setattr(plan_cmd, "estimate", never)
    for path in (tmp_path / "missing" / "m.png", tmp_path):
        code, out, err = _main([*SPEC, "--plot", str(path)], capsys)
        assert code == 2 and out == "" and "--plot" in err and len(err.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == []


def test_the_plot_is_written_atomically(tmp_path, capsys, monkeypatch):
    """A failure while writing leaves neither the PNG nor a temporary file, and is not bad input."""
    import matplotlib.figure
    def broken(self, f, **kw):
        f.write(b"\x89PNG half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken)
    code, out, err = _main([*SPEC, "--plot", str(tmp_path / "m.png")], capsys)
    assert code == 1 and str(tmp_path / "m.png") in err
    assert os.listdir(tmp_path) == []


def test_a_plan_that_fails_after_checking_is_not_bad_input(capsys, monkeypatch):
    def buggy(*args, **kw):
        raise ValueError("a bug in the computation")
    monkeypatch.setattr(plan_cmd, "estimate", buggy)
    code, _, err = _main(SPEC, capsys)
    assert code == 1 and "a bug in the computation" in err


def test_no_message_counts_one_thing_in_the_plural(capsys):
    """"1 GPU", never "1 GPUs" (or "1 micro-batches", "1 sequences", "1 configs")."""
    code, out, err = _main(["plan", "--model", "gpt2", "--gpus", "1", "--gpus-per-node", "1", "--search",
                            "--top", "2"], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "1 GPU " in text and "over 1 GPU " in text and "on 1 GPU," in text
    for wrong in ("1 GPUs", "1 micro-batches", "1 sequences", " 1 configs"):
        assert wrong not in text, wrong


def test_memory_is_whole_bytes(capsys):
    """Every byte count of the JSON is an int, activations (a fractional estimate) rounded up."""
    for extra in ([], ["--pp", "2", "--tp", "2", "--sequence-parallel"], ["--zero", "3", "--offload", "cpu"]):
        d = _json([*SPEC[:5], *extra], capsys)
        assert all(type(v) is int for v in d["memory"].values()), d["memory"]


def test_plot_writes_a_png_and_nothing_else(tmp_path, capsys):
    path = tmp_path / "memory.png"
    code, out, err = _main([*SPEC, "--plot", str(path)], capsys)
    assert code == 0, err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(tmp_path) == ["memory.png"] and f"wrote {path}" in out
    code, out, _ = _main([*SPEC, "--plot", str(tmp_path / "j.png"), "--json"], capsys)
    assert code == 0 and json.loads(out)["schema"] == "ringzero.plan/1"
    assert (tmp_path / "j.png").read_bytes()[:4] == b"\x89PNG"


def test_memory_by_stage_shrinks_with_each_zero_stage():
    m = MODELS["llama-2-7b"]
    stages = compare.memory_by_stage(m, Training(), Parallel(dp=8, zero=3, offload="cpu"))
    assert [label for label, _ in stages] == list(compare.STAGE_LABELS)
    totals = [mem.model_states for _, mem in stages]
    assert totals == sorted(totals, reverse=True) and stages[0][1].offloaded == 0
    assert stages[1][1].optimizer == 0 < stages[1][1].offloaded


def test_strategy_comparison_matches_the_seed_up_to_n_minus_1_over_n():
    m = MODELS["llama-2-7b"]
    rows = {(r.strategy, r.scope.split(",")[0]): r
            for r in compare.strategy_comparison(m, Training(), Parallel(dp=8))}
    phi = 6_738_415_616 * 2
    root = rows[("DP naive all-reduce", "root")]
    assert root.seed_bytes == root.exact_bytes == 7 * phi
    system = rows[("DP naive all-reduce", "whole system")]
    assert (system.seed_bytes, system.exact_bytes) == (2 * 8 * phi, 2 * 7 * phi)
    assert rows[("DP ring all-reduce", "per GPU")].ratio == pytest.approx(1.0)
    assert rows[("ZeRO-1/2", "per GPU")].ratio == pytest.approx(7 / 8, rel=1e-6)
    assert rows[("ZeRO-3", "per GPU")].exact_bytes == pytest.approx(3 * 7 / 8 * phi, rel=1e-6)
    tp, pp = rows[("TP (Megatron-LM)", "per GPU")], rows[("PP", "whole pipeline")]
    assert (tp.group, tp.what_if, pp.group, pp.what_if) == (8, True, 8, True)
    bsh2 = 4096 * 4096 * 2
    assert tp.seed_bytes == 8 * bsh2 and tp.exact_bytes == pytest.approx(8 * 7 / 8 * bsh2)
    assert pp.seed_bytes == pp.exact_bytes == 2 * 7 * bsh2
    planned = compare.tp_row(m, Training(), Parallel(dp=2, tp=4))
    assert (planned.group, planned.what_if) == (4, False)
    inside = compare.tp_row(MODELS["gpt2"], Training(), Parallel(dp=64), gpus_per_node=8)
    assert (inside.group, inside.what_if) == (6, True)       # <= 8 and divides the 12 heads


def test_single_gpu_plan_has_no_communication(capsys):
    code, out, err = _main(["plan", "--model", "nano"], capsys)
    assert code == 0, err
    assert "no communication (one GPU)" in out and "N=2 (what if)" in out


def test_search_prints_the_top_configurations(capsys):
    code, out, err = _main(["plan", "--model", "gpt2", "--gpus", "8", "--search", "--top", "3"], capsys)
    assert code == 0, err
    assert "Search: the 3 fastest configurations that fit on 8 GPUs" in out and "tokens/s" in out
    assert "evaluated" in out and "configs/s" in out
    d = _json(["plan", "--model", "gpt2", "--gpus", "8", "--search", "--top", "2"], capsys)
    assert d["plan"]["schema"] == "ringzero.plan/1"
    s = d["search"]
    assert set(s) == {"evaluated", "fitting", "seconds", "rate", "best", "why"}
    assert len(s["best"]) == 2 and s["best"][0]["schema"] == "ringzero.plan/1"
    assert s["evaluated"] >= s["fitting"] >= 2 and s["why"]


def test_search_that_finds_nothing_says_why(capsys):
    code, out, err = _main(["plan", "--model", "llama-2-70b", "--gpus", "2", "--search"], capsys)
    assert code == 0, err
    assert "no configuration fits" in out and "Nothing fits" in out


def test_servers_add_the_parameter_server_plan(capsys):
    code, out, _ = _main(["plan", "--model", "gpt2", "--gpus", "8", "--servers", "2", "--json"], capsys)
    ps = json.loads(out)["parameter_server"]
    assert code == 0 and ps["workers"] == 8 and ps["servers"] == 2 and ps["bottleneck"] == "server link"
    assert ps["server_ingress_bytes"] == 4 * ps["push_bytes"]         # 8 workers x half the vector
    code, out, _ = _main(["plan", "--model", "gpt2", "--gpus", "8", "--servers", "2"], capsys)
    assert code == 0 and "into the busiest server" in out and "Parameter server" in out
