# foxhunt-hpo: the two commands the README gives.
#   make demo   set up .venv and run the quick demo on the embedded defaults
#   make test   set up .venv and run the test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
COMPILED := $(VENV)/.compiled

.PHONY: setup demo test lint typecheck clean chromium

SOURCES := hpo trainables models cluster dashboards
LINTED := $(SOURCES) tests bench

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt -e ".[test]"
	touch $(STAMP)

# Bytecode for everything installed, on every core: pip's own pass compiles one file at a
# time (about a minute of one core here, the other idle), and without bytecode every
# process compiles what it imports (where PYTHONDONTWRITEBYTECODE is set, as in the
# sandboxes this project is tested in, nothing writes it later). Left out: the packages'
# own test suites (a sixth of the files, more than half of pandas', sympy's and scipy's
# compile time), which nothing imports, and the one file this Python cannot compile,
# torch's 3.12-only test helper (pip skips it silently); any other failure stops make.
$(COMPILED): $(STAMP)
	$(BIN)/python -m compileall -q -j 0 -x 'torch/testing/_internal/py312_intrinsics|/tests/' $(VENV)/lib
	touch $(COMPILED)

setup: $(COMPILED)

# Headless Chromium renders the comparison report in tests/dashboards (skipped without it).
chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null) || echo "chromium not installed: the report's browser test will be skipped"

demo: $(COMPILED)
	$(BIN)/hpo sweep examples/quick.toml --name quick-$$(date +%Y%m%d-%H%M%S)

# Style, types, bytecode and the browser first, side by side (mypy takes a core for about
# a minute, the bytecode both cores for about 40 s, chromium's install the network): CI
# keeps them without anyone remembering to. The layering is a test (tests/test_layers.py).
test: $(STAMP)
	$(MAKE) --no-print-directory --output-sync=target -j3 lint typecheck chromium $(COMPILED)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

typecheck: $(STAMP)
	$(BIN)/mypy $(SOURCES)

clean:
	rm -rf $(VENV) runs mlflow.db mlruns .pytest_cache
