# foxhunt-hpo: the two commands the README gives.
#   make demo   set up .venv and run the quick demo on the embedded defaults
#   make test   set up .venv and run the test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/hpo sweep examples/quick.toml --name quick-$$(date +%Y%m%d-%H%M%S)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check hpo trainables models cluster dashboards tests bench
	$(BIN)/ruff format --check hpo trainables models cluster dashboards tests bench

clean:
	rm -rf $(VENV) runs mlflow.db mlruns .pytest_cache
