# The two commands: `make demo` runs the main job, `make test` runs all tests.
# Each creates .venv and installs '.[dev]' when needed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint java venv clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; dstltree needs Python 3.11" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

java:
	@command -v java >/dev/null || { echo "error: Spark needs Java 17: no 'java' on PATH (install openjdk-17-jre-headless)" >&2; exit 1; }
	@java -version 2>&1 | head -n1 | grep -Eq '"(17|21)[."]' || { echo "error: Spark needs Java 17; found: $$(java -version 2>&1 | head -n1)" >&2; exit 1; }

demo: $(STAMP) java
	$(BIN)/dstl demo $(DEMO_ARGS)

test: $(STAMP) java
	$(BIN)/python -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) data reports .pytest_cache .mypy_cache .ruff_cache
