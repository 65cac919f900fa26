# Set-up and everyday commands. `make demo` and `make test` create .venv on first use.
#
# Everything they install comes from requirements.lock: exact versions with their hashes,
# torch among them as 2.13.0+cpu (this machine has that CPU wheel on disk; an unpinned
# resolve would pull a multi-gigabyte CUDA build from the index instead). pyproject.toml
# keeps the ranges a library user needs; the lock is what the project is tested against.
# `make lock` re-resolves it after a change to pyproject.toml (keeping the other pins);
# `make lock-upgrade` moves every pin to the newest release. See docs/development.md.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.partita-installed
LOCK := requirements.lock
LOCK_TOOL := pip-tools==7.6.2
LOCK_FLAGS ?=
PYTEST_TIMEOUT ?= 300
BENCH_ARGS ?=
FUZZ_ARGS ?=

.PHONY: setup demo test test-fast test-tiers bench fuzz lock lock-upgrade clean

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# The stamp records that the install ran against this lock; pip is asked again only when the
# lock or pyproject.toml changed. --no-deps and --require-hashes: only the locked files go in.
# partita itself is built without build isolation, so its build backend (setuptools) is the
# locked one too.
$(STAMP): $(LOCK) pyproject.toml | $(PY)
	$(PY) -m pip install -q --require-hashes --no-deps -r $(LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m partita demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --timeout=$(PYTEST_TIMEOUT) -p no:cacheprovider -q -rs tests

# The quick loop while developing: every test but the slow, multi-process and benchmark-shaped
# ones (tests/conftest.py; the marks come from tests/tiers.json, which `make test-tiers`
# records). `make test` runs everything, as CI does.
test-fast: $(STAMP)
	$(PY) -m pytest -n 2 --timeout=$(PYTEST_TIMEOUT) -p no:cacheprovider -q -rs -m "not slow and not multiprocess and not bench" tests

test-tiers: $(STAMP)
	$(PY) tools/test_tiers.py

bench: $(STAMP)
	$(PY) bench/bench_ir.py $(BENCH_ARGS)

# The long fuzzing campaign (tests/fuzz/campaign.py; docs/reliability.md), e.g.
# make fuzz FUZZ_ARGS="--minutes 5 --seed 0 --targets pir,onnx"
fuzz: $(STAMP)
	$(PY) tools/fuzz.py $(FUZZ_ARGS)

# Re-resolve the lock in a throw-away virtualenv holding only the lock tool.
lock:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(PYTHON) -m venv "$$tmp/venv" && \
	"$$tmp/venv/bin/python" -m pip install -q $(LOCK_TOOL) && \
	CUSTOM_COMPILE_COMMAND="make lock" "$$tmp/venv/bin/pip-compile" --quiet $(LOCK_FLAGS) \
	    --extra test --generate-hashes --allow-unsafe --strip-extras \
	    --no-emit-index-url --no-emit-find-links -o $(LOCK) pyproject.toml

lock-upgrade:
	$(MAKE) lock LOCK_FLAGS=--upgrade

clean:
	rm -rf bench/results build *.egg-info partita.egg-info
	find . -name __pycache__ -type d -not -path './$(VENV)/*' -prune -exec rm -rf {} +
