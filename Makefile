# Two entry points for a fresh clone (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow lint setup clean bench accuracy

$(STAMP): pyproject.toml constraints-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints-dev.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints-dev.txt -e ".[dev]"
	$(BIN)/pip install -q --no-deps -c constraints-dev.txt litgpt==0.5.13  # memfit[litgpt]: see pyproject
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/memfit estimate llama-3.2-1b --mode train --batch 4 --seq 2048 --precision bf16-mixed --gpu A100-80GB

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

# The default run leaves out tests marked `slow` (minutes each: the 50-model-type coverage scan,
# planner-vs-trace agreement, browser tests of the trace path); `make test-slow` runs them.
test: $(STAMP) lint
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python benchmarks/trace_speed.py

accuracy: $(STAMP)
	$(BIN)/python benchmarks/accuracy_published.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
