# `make run` and `make test` work on a fresh clone: they create .venv when missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench calibrate clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned: on these machines 2.13.0 is a local CPU build; a looser pin pulls CUDA.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/ringzero bench comm --nproc 4 --collective all_reduce --sizes 64KiB,1MiB,4MiB,16MiB --compare
	$(VENV)/bin/ringzero explain all-reduce --algorithm ring --world 4

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_comm.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
