# Two commands do all the set-up: `make run` (environment + the default FedDB run) and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN      = $(VENV)/bin
RUN_CONFIG ?=
ARGS    ?=

.PHONY: run test lint env clean-runs

$(BIN)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -c constraints.txt -e ".[dev]"
	touch $@

env: $(BIN)/.installed

run: env
	$(BIN)/python -m feddb.launch --run-config "$(RUN_CONFIG)" $(ARGS)

# two pytest processes of one thread each: the second fills the time the first waits on Flower
# (ARGS="-n 0" runs it in one process)
test: env
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=25 $(ARGS)

lint: env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean-runs:
	rm -rf runs .flwr-home
