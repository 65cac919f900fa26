# Set-up and everyday commands. `make demo` and `make test` create .venv on first use.
#
# torch is installed first and pinned: this machine has the CPU wheel on disk, and an
# unpinned resolve would pull a multi-gigabyte CUDA build from the index instead.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.partita-installed
PYTEST_TIMEOUT ?= 300
BENCH_ARGS ?=

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# The stamp records that the install ran against this pyproject.toml; pip is only asked
# again when the dependencies may have changed.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m partita demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --timeout=$(PYTEST_TIMEOUT) -p no:cacheprovider -q tests

bench: $(STAMP)
	$(PY) bench/bench_ir.py $(BENCH_ARGS)

clean:
	rm -rf bench/results build *.egg-info partita.egg-info
	find . -name __pycache__ -type d -not -path './$(VENV)/*' -prune -exec rm -rf {} +
