"""`python -m ringzero.gpu_check [--out out/gpu_check.json] [--parts pytest,train,bench,nccl] [--steps N]`

See the package's docstring and docs/gpu.md. Exit code: 0 when every part passed (or when there is
no CUDA here: one line, nothing run, nothing written), 1 when a part failed or timed out, 2 on bad
input (one line, before anything runs).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ringzero import outputs
from ringzero.cli import Parser
from ringzero.errors import UsageError, usage
from ringzero.gpu_check import parts as P
from ringzero.gpu_check import summary

PARTS = ("pytest", "train", "bench", "nccl")
DEFAULT_OUT = os.path.join("out", "gpu_check.json")
REPO_TESTS = str(Path(__file__).resolve().parents[3] / "tests")
"""The checkout's tests (src/ringzero/gpu_check/ -> the repository root), for `pytest -m cuda`."""


@dataclass(frozen=True)
class Options:
    out: str = DEFAULT_OUT
    parts: tuple[str, ...] = PARTS
    steps: int = 30
    tests: str = REPO_TESTS

    def __post_init__(self) -> None:
        bad = [p for p in self.parts if p not in PARTS]
        if bad or not self.parts:
            raise ValueError(f"--parts takes a comma list of {', '.join(PARTS)}, got {','.join(self.parts)!r}")
        if self.steps < 4:
            # Two warm-up steps are left out of the medians; fewer than 4 leaves too few to measure.
            raise ValueError(f"--steps must be at least 4, got {self.steps}")
        if "pytest" in self.parts and not os.path.isdir(self.tests):
            raise ValueError(f"--tests {self.tests!r} is not a folder (the checkout's tests/)")


def parse(argv: list[str] | None) -> Options:
    p = Parser(prog="python -m ringzero.gpu_check", description=__doc__.split("\n\n")[1])
    p.add_argument("--out", default=DEFAULT_OUT, help=f"summary JSON (default {DEFAULT_OUT}; its folder must exist)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)} (default: all)")
    p.add_argument("--steps", type=int, default=30, help="training steps per torchrun run (default 30)")
    p.add_argument("--tests", default=REPO_TESTS, help="the tests folder for pytest -m cuda (default: the checkout's)")
    a = p.parse_args(argv)
    with usage():
        opts = Options(out=a.out, parts=tuple(x.strip() for x in a.parts.split(",") if x.strip()),
                       steps=a.steps, tests=os.path.abspath(a.tests))
        outputs.check(opts.out, "--out")
    return opts


def no_cuda_reason() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    import torch
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        return "no CUDA device visible" + (f" (CUDA_VISIBLE_DEVICES={seen!r})" if seen is not None else "")
    return None


def machine() -> dict:
    import torch
    n = torch.cuda.device_count()
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "devices": n,
            "device_names": [torch.cuda.get_device_name(i) for i in range(n)],
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
            "cpus": os.cpu_count()}


def run_parts(parts: list[P.Part], out: str, info: dict, say=print) -> dict:
    """Run `parts` in order, each to its end or its timeout whatever the others did, rewriting the
    summary at `out` after each; returns the final summary."""
    t0, entries = time.monotonic(), []
    for part in parts:
        entry = summary.entry(part, P.execute(part))
        entries.append(entry)
        outputs.write_text(out, json.dumps(summary.assemble(info, entries, time.monotonic() - t0, False), indent=1))
        say(f"gpu-check: {part.name}: {entry['status']} ({entry['wall_s']:.1f} s)")
    final = summary.assemble(info, entries, time.monotonic() - t0, True)
    outputs.write_text(out, json.dumps(final, indent=1))
    return final


def main(argv: list[str] | None = None) -> int:
    try:
        opts = parse(argv)
    except UsageError as exc:
        print(f"gpu-check: error: {exc}", file=sys.stderr)
        return 2
    why = no_cuda_reason()
    if why is not None:
        print(f"gpu-check: skipped, no CUDA here: {why}; nothing run, nothing written")
        return 0
    info = machine()
    with tempfile.TemporaryDirectory(prefix="ringzero-gpu-check-") as work:
        final = run_parts(P.plan(opts.parts, opts.steps, opts.tests, info["devices"], work), opts.out, info)
    c = final["counts"]
    print(f"gpu-check: {c['passed']} passed, {c['failed']} failed, {c['timeout']} timed out; wrote {opts.out}")
    return 0 if final["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
