# The two commands: `make demo` runs the main job, `make test` runs all tests.
# Each creates .venv and installs '.[dev]' when needed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint java jar venv clean

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
# installed pyspark's jars; dstltree.structured_streaming.jar builds the same on first use.
JAR := build/jvm/dstltree-spark.jar
JAVA_SRC := $(wildcard jvm/src/main/java/io/dstltree/spark/*.java)

jar: $(JAR)

$(JAR): $(STAMP) $(JAVA_SRC)
	@command -v javac >/dev/null || { echo "error: building $(JAR) needs a JDK 17: no 'javac' on PATH (install openjdk-17-jdk-headless)" >&2; exit 1; }
	@rm -rf build/jvm/classes && mkdir -p build/jvm/classes
	javac --release 17 -Xlint:all,-path -cp "$$($(BIN)/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')/*" -d build/jvm/classes $(JAVA_SRC)
	jar --create --file $(JAR).tmp -C build/jvm/classes .
	@mv $(JAR).tmp $(JAR)

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
