# `make run` and `make test` work on a fresh clone: they create .venv when missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench calibrate clean gpu-check docs docs-build

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned: on these machines 2.13.0 is a local CPU build; a looser pin pulls CUDA.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The main job: train ringzero's GPT with ZeRO-2 and selective recomputation on 4 local ranks
# (1-2.5 min in all on the 2-core development machines), then the planner's view of a real model.
run: $(STAMP)
	$(VENV)/bin/ringzero train --nproc 4 --strategy zero2 --recompute selective --micro-batch 4 --steps 200
	$(VENV)/bin/ringzero plan --model llama-2-7b --gpus 8 --gpu a100-80gb --zero 3 --recompute selective --flash-attention

# scripts/test-deps installs what the tests need beyond Python packages (Chromium), as CI does.
test: $(STAMP)
	scripts/test-deps
	$(PY) -m pytest -q --durations=25

bench: $(STAMP)
	$(PY) benchmarks/bench_comm.py
	$(PY) benchmarks/bench_transport.py --json out/bench_transport.json
	$(PY) benchmarks/bench_shm_leftovers.py --trials 20
	$(PY) benchmarks/bench_plan.py
	$(PY) benchmarks/bench_plan_fidelity.py
	$(PY) benchmarks/bench_simulate.py --json out/bench_simulate.json
	$(PY) benchmarks/bench_simulate_step.py --json out/bench_simulate_step.json
	$(PY) benchmarks/bench_simulate_engine.py --json out/bench_simulate_engine.json
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_compression.py --json out/bench_compression.json --plot out/compression.png
	$(PY) benchmarks/bench_offload.py --json out/bench_offload.json
	$(PY) benchmarks/bench_pipeline_bubble.py
	$(VENV)/bin/ringzero bench ps --nproc 4 --steps 60 --plot out/bench_ps.png --json out/bench_ps.json
	$(PY) benchmarks/bench_faults.py --trials 20 --nproc 3
	$(PY) benchmarks/bench_hangs.py --trials 20

# On a CUDA machine (~10 min at most): the CUDA tests, a 2-rank torchrun training per strategy, bench
# comm, and ringzero's collectives against NCCL's; one summary in out/gpu_check.json (docs/gpu.md).
# Without CUDA it says so in one line and exits 0.
gpu-check: $(STAMP)
	mkdir -p out
	$(PY) -m ringzero.gpu_check --out out/gpu_check.json

# The documentation site (mkdocs.yml, docs/): served with live reload, or built as the tests build it.
docs: $(STAMP)
	$(VENV)/bin/mkdocs serve

docs-build: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir out/site

clean:
	rm -rf $(VENV) build dist src/*.egg-info
