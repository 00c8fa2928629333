# The two commands: `make demo` runs the main job, `make test` runs all tests.
# Each creates .venv and installs '.[dev]' when needed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint java jar wheel venv clean

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

# The checkpoint file manager for Structured Streaming (jvm/), compiled against the
# installed pyspark's jars into build/jvm/dstltree-spark-<line>.jar (rebuilt when older
# than a source); dstltree.structured_streaming.jar builds the same on first use.
jar: $(STAMP)
	@command -v javac >/dev/null || { echo "error: building the jar needs a JDK 17: no 'javac' on PATH (install openjdk-17-jdk-headless)" >&2; exit 1; }
	$(BIN)/python -c 'import sys; from dstltree.structured_streaming.jar import main; sys.exit(main([""]))'

# The wheel, with one jar per supported Spark line (structured_streaming/jar.py's
# SPARK_LINES): one pyspark per line from PyPI into build/spark-lines/<line> (pip's
# cache makes the second time quick), javac against each line's jars/, by setup.py.
SPARK_LINES_DIR := build/spark-lines

wheel: $(STAMP)
	@command -v javac >/dev/null || { echo "error: the wheel's jars need a JDK 17: no 'javac' on PATH" >&2; exit 1; }
	@$(BIN)/python -c 'import sys; from dstltree.structured_streaming.jar import main; sys.exit(main(["", "--releases"]))' | while read line release; do \
	  test -f $(SPARK_LINES_DIR)/$$line/.done || { \
	    rm -rf $(SPARK_LINES_DIR)/$$line && \
	    $(BIN)/python -m pip install -q --no-deps --target $(SPARK_LINES_DIR)/$$line pyspark==$$release && \
	    touch $(SPARK_LINES_DIR)/$$line/.done; } || exit 1; \
	done
	rm -rf dist build/lib build/bdist.*
	DSTLTREE_REQUIRE_JARS=all \
	DSTLTREE_SPARK_JARS="$$(for d in $(SPARK_LINES_DIR)/*/pyspark/jars; do printf '%s:' "$$PWD/$$d"; done)" \
	  $(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -w dist .

demo: $(STAMP) java
	$(BIN)/dstl demo $(DEMO_ARGS)

test: $(STAMP) java jar
	$(BIN)/python -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) data reports .pytest_cache .mypy_cache .ruff_cache
