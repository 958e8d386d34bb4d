# llmgw — `make demo` to try it, `make test` to test it. Nothing else needs installing for the demo.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# What is installed, each remade when pyproject.toml changes: the demo needs only the server extra;
# the tests, lint and docs the test extra beside it (`make test` after `make demo` adds it).
SERVER_STAMP := $(VENV)/.installed-server
TEST_STAMP := $(VENV)/.installed-test
export LLMGW_DATA_DIR ?= $(CURDIR)/var

.PHONY: demo test test-quick docs lint venv bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(SERVER_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[server]'
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[server,test]'
	touch $@ $(SERVER_STAMP)

venv: $(TEST_STAMP)

# make demo ADDR=127.0.0.1:8001 serves elsewhere when 8000 is taken; SCENARIO=crac-failure replays a
# row's cooling failure from the start.
ADDR ?= 127.0.0.1:8000
SCENARIO ?=
demo: $(SERVER_STAMP)
	$(BIN)/llmgw demo --addr $(ADDR)$(if $(SCENARIO), --scenario $(SCENARIO))

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/llmgw makemigrations --check --dry-run

test: $(TEST_STAMP)
	bash scripts/test.sh

# The loop a developer runs every few minutes: everything but the servers, workers, browsers and fuzzing,
# and a third of the property tests' examples (tests/examples.py).
test-quick: $(TEST_STAMP)
	LLMGW_TEST_QUICK=1 bash scripts/test.sh -m "not slow" -q

# The docs site (docs/, reference pages written from the code) into build/docs.
docs: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(TEST_STAMP)
	bash scripts/bench.sh

clean:
	rm -rf $(VENV) var .pytest_cache test-output
