"""`plan.units`: the one size parser of every command (plan, bench comm, explain)."""

import re

import pytest

from ringzero.plan.units import parse_bandwidth, parse_bytes, parse_link, parse_size


@pytest.mark.parametrize("text, expect", [
    ("4096", 4096), ("1KB", 10**3), ("1MB", 10**6), ("2GB", 2 * 10**9), ("1TB", 10**12),
    ("1KiB", 2**10), ("1MiB", 2**20), ("1GiB", 2**30), ("1TiB", 2**40),
    ("2K", 2048), ("1.5M", 3 << 19), ("1G", 2**30), ("1T", 2**40),   # bare letters: binary, as nccl-tests
    ("64kib", 65536), (" 8 B ", 8), ("1e3", 1000), ("4.1KB", 4100),
])
def test_every_command_reads_a_size_the_same_way(text, expect):
    assert parse_size(text, "--sizes") == expect
    assert parse_bytes(text, "--hbm") == pytest.approx(expect)


def test_zero_is_a_size_but_not_a_positive_quantity():
    assert parse_size("0", "--bytes") == 0 and parse_bytes("0", "--bytes", zero=True) == 0
    with pytest.raises(ValueError, match=r"^--hbm must be > 0, got '0'$"):
        parse_bytes("0", "--hbm")
    with pytest.raises(ValueError, match=r"^--bytes must be >= 0, got '-1'$"):
        parse_bytes("-1", "--bytes", zero=True)


@pytest.mark.parametrize("bad", ["12XB", "-1", "one", "", "1e999", "1Gbit", "64 KiB/s"])
def test_a_bad_size_is_one_line_naming_the_units(bad):
    with pytest.raises(ValueError) as err:
        parse_size(bad, "--sizes")
    message = str(err.value)
    assert message.startswith(f"bad size {bad!r} for --sizes") and "KiB" in message and "\n" not in message


def test_bandwidths_take_bits_bytes_and_a_plain_number_as_gb_per_s():
    """One rule for every bandwidth flag: a plain number is GB/s (not bytes/s: `--nic-bw 5` once
    made a 1 MiB all-reduce take 7 hours), echoed in the unit typed."""
    for text, expect, shown in (("5", 5e9, "5 GB/s"), ("8Gbit/s", 1e9, "8 Gbit/s"), ("2GiB/s", 2 * 2**30, "2 GiB/s"),
                                ("300 GB", 300e9, "300 GB/s"), ("12.5gb" "it/s", 12.5e9 / 8, "12.5 Gbit/s"),
                                ("7B/s", 7.0, "7 B/s")):
        bw = parse_bandwidth(text, "--inter-bw")
        assert bw.bytes_per_s == pytest.approx(expect) and str(bw) == shown
    for ambiguous in ("8Gb/s", "50G", "8gb/s", "1Gbps"):
        with pytest.raises(ValueError, match=f"^--inter-bw='{ambiguous}': unknown or ambiguous unit .*; allowed: GB/s "
                                             r"\(also a plain number\)"):
            parse_bandwidth(ambiguous, "--inter-bw")
    with pytest.raises(ValueError, match="unknown unit 'gbit'"):
        parse_bytes("8Gbit", "--hbm")


def test_an_emulated_link_is_a_bandwidth_and_a_latency():
    link = parse_link("10Gbit/s,20", "--emulate-inter-node")
    assert (link.gbps, link.latency_us, str(link)) == (1.25, 20.0, "10 Gbit/s, 20 µs per message")
    assert parse_link("0.05", "--emulate-inter-node").gbps == 0.05
    for bad, message in (("1,x", "the latency must be µs >= 0"), ("1,2,3", "give BW[,LATENCY_US]"),
                         ("0,5", "must be > 0, got '0'")):
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_link(bad, "--emulate-inter-node")


def test_a_pickled_shape_or_gpu_leaves_its_cached_hash_behind():
    """String hashes are salted per process: a hash cached in one must not travel to a rank."""
    import pickle

    from ringzero.plan.hardware import hardware
    from ringzero.plan.model.presets import model
    for obj in (model("gpt2"), hardware("a100-80gb")):
        hash(obj)
        again = pickle.loads(pickle.dumps(obj))
        assert "_hash" not in again.__dict__ and again == obj and hash(again) == hash(obj)
