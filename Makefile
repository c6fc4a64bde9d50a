# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
# Both create or reuse .venv and install the project with the tested versions
# pinned in constraints.txt.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.gossipnet-installed

# Python caches compiled modules (__pycache__, ignored by git) even where the environment
# says not to: the tests start many `gossipnet` processes, and each would otherwise compile
# our packages again (about 1.5 s a process on 2 cores). For the same reason pip does not
# compile every installed file up front (--no-compile: about 35 s of a fresh install, most
# of it for modules nothing imports); a module is compiled once, when first imported.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test reproduce chaos install lint format typecheck layers clean

$(STAMP): pyproject.toml constraints.txt
	@echo "make: installing gossipnet into $(VENV)/ with the versions pinned in constraints.txt:"
	@echo "  PyTorch, aiohttp, msgpack, networkx, scipy; MNIST-1D and matplotlib (the simulator);"
	@echo "  Ray, TensorBoard, pyarrow; the test and lint tools (extra [dev]). A few minutes the"
	@echo "  first time; reused until pyproject.toml or constraints.txt change."
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --no-compile -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gossipnet demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 --dist worksteal

# The paper-length reproductions (tests marked `reproduce`, left out of `make test`; the
# last results, commands and wall times are in docs/reproductions.md).
reproduce: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist load -m reproduce

# The reliability suite (docs/reliability.md): every attack against real peers on
# 127.0.0.1, a table at the end, exit code 1 if a verdict fails (about 10 minutes).
# `make test` runs its quick subset (tests/chaos/test_quick.py). Options, e.g.:
# make chaos CHAOS_ARGS="--seed 1 --requests 2000 --only fuzz-open"
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos.run $(CHAOS_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
