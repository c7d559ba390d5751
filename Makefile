# foxhunt-hpo: the two commands the README gives.
#   make demo   set up .venv and run the quick demo on the embedded defaults
#   make test   set up .venv and run the test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
LOCKED := $(VENV)/.locked
STAMP := $(VENV)/.installed
COMPILED := $(VENV)/.compiled

.PHONY: setup demo test lint typecheck clean chromium sources-bytecode

SOURCES := hpo trainables models cluster dashboards
LINTED := $(SOURCES) tests bench

# The lock (constraints.txt pins every package the project and its tests need, with
# this machine's CPU build of torch) goes in first, in two halves side by side: pip reads
# every package's index page and unpacks its wheel one at a time on one core, so a single
# install leaves the other core idle for its 35-40 s. The halves take --no-deps; the
# project's editable install then resolves against what is there and adds whatever the
# lock left out (with a CUDA build of torch, its CUDA libraries), and `pip check` fails
# the set-up on any broken requirement. setuptools, which torch needs newer than the
# venv's, goes in with pip. xargs runs both halves in the foreground: Ctrl-C stops both,
# and either one failing fails the step.
$(LOCKED): constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt --upgrade pip setuptools
	awk '!/^#/ && NF { print > ("$(VENV)/lock-" (++n % 2 ? "odd" : "even") ".txt") }' constraints.txt
	printf '%s\n' even odd | xargs -P 2 -I '{}' \
	  $(BIN)/python -m pip install -q --no-compile --no-deps -r $(VENV)/lock-'{}'.txt
	touch $(LOCKED)

$(STAMP): pyproject.toml $(LOCKED)
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt -e ".[test]"
	$(BIN)/python -m pip check
	touch $(STAMP)

# Bytecode for everything installed, on every core: pip's own pass compiles one file at a
# time (about a minute of one core here, the other idle), and without bytecode every
# process compiles what it imports (where PYTHONDONTWRITEBYTECODE is set, as in the
# sandboxes this project is tested in, nothing writes it later). Left out: the packages'
# own test suites (a sixth of the files, more than half of pandas', sympy's and scipy's
# compile time), and the packages and subpackages that neither the service nor its tests
# import (torch's ONNX export, RLlib, Ray's LLM library, scikit-learn, matplotlib and
# fontTools, and the tools pip, setuptools and compiled mypy: 5.6 of 50 CPU-s; torch's
# compiler and Ray Serve stay: an optimizer's step imports the one, `ray start` the
# other); whatever imports one of them later compiles it in memory, as without this
# pass. Also left out: the one file this Python cannot compile, torch's 3.12-only test
# helper (pip skips it silently); any other failure stops make. The pass runs at a lower
# priority so that mypy, its neighbour under `make test` and the longer of the two, keeps
# a core to itself.
NOT_COMPILED := torch/testing/_internal/py312_intrinsics|/tests/|/site-packages/(torch/onnx|ray/rllib|ray/llm|sklearn|matplotlib|fontTools|pip|setuptools|mypy)/

$(COMPILED): $(STAMP)
	nice $(BIN)/python -m compileall -q -j 0 -x '$(NOT_COMPILED)' $(VENV)/lib
	touch $(COMPILED)

setup: $(COMPILED)

# The project's own modules get bytecode too, at each run, not once: their sources change
# between runs (Python checks each file's time stamp and compiles a stale one in memory).
# An editable install leaves them without any, and where PYTHONDONTWRITEBYTECODE is set
# every `hpo` call and every Ray worker of a sweep compiled what it imported of them
# (1.65 CPU-s in 20 processes of two end-to-end test files; bench/README.md, "Where the
# test suite's time goes", eleventh session).
sources-bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 $(LINTED)

# Headless Chromium renders the comparison report in tests/dashboards (skipped without it).
chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null) || echo "chromium not installed: the report's browser test will be skipped"

demo: $(COMPILED) sources-bytecode
	$(BIN)/hpo sweep examples/quick.toml --name quick-$$(date +%Y%m%d-%H%M%S)

# Style, types, bytecode and the browser first, side by side (mypy takes a core for about
# 40 s, the bytecode 50 CPU-s, chromium's install the network): CI keeps them without
# anyone remembering to. The layering is a test (tests/test_layers.py). Then the machine
# in one line (bench/machine.py): machines of one kind differ by up to 1.9x in the suite's
# time, so a log's time means something only beside the processor it ran on. A line of
# information, so its failure does not stop the tests (tests/bench/test_machine.py does).
test: $(STAMP)
	$(MAKE) --no-print-directory --output-sync=target -j3 lint typecheck chromium $(COMPILED) sources-bytecode
	-$(BIN)/python bench/machine.py
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

typecheck: $(STAMP)
	$(BIN)/mypy $(SOURCES)

clean:
	rm -rf $(VENV) runs mlflow.db mlruns .pytest_cache
