# llmgw — `make demo` to try it, `make test` to test it. Nothing else needs installing for the demo.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export LLMGW_DATA_DIR ?= $(CURDIR)/var

.PHONY: demo test test-quick docs lint venv bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[server,test]'
	touch $(STAMP)

venv: $(STAMP)

# make demo ADDR=127.0.0.1:8001 serves elsewhere when 8000 is taken; SCENARIO=crac-failure replays a
# row's cooling failure from the start.
ADDR ?= 127.0.0.1:8000
SCENARIO ?=
demo: $(STAMP)
	$(BIN)/llmgw demo --addr $(ADDR)$(if $(SCENARIO), --scenario $(SCENARIO))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/llmgw makemigrations --check --dry-run

test: $(STAMP)
	bash scripts/test.sh

# The loop a developer runs every few minutes: everything but the servers, workers, browsers and fuzzing.
test-quick: $(STAMP)
	bash scripts/test.sh -m "not slow" -q

# The docs site (docs/, reference pages written from the code) into build/docs.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	bash scripts/bench.sh

clean:
	rm -rf $(VENV) var .pytest_cache test-output
