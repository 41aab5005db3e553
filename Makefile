# `make train`: create .venv when missing, install with the extras every program
#               needs (train), run the Quick-start training job.
# `make test`:  create .venv when missing, install with test extras, run the test suite
#               on one pytest-xdist worker per core; an idle worker takes tests queued
#               for a busy one (worksteal), so that the suite does not end waiting on
#               one worker's queue.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
export LM_ZOO_DATA ?= $(abspath ../shared/data)

.PHONY: train test lint bench clean

# One stamp per extra installed: `make train` does not install the test tools.
$(VENV)/.installed-%: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[$*]'
	touch $@

train: $(VENV)/.installed-train
	$(VENV)/bin/python launch/train.py --config=experiments/default.py --workdir=runs/default

test: $(VENV)/.installed-test
	$(VENV)/bin/python -m pytest -q -n auto --dist worksteal

# `make lint`: ruff's checks (pyproject.toml's [tool.ruff]) over every Python file.
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .

bench: $(VENV)/.installed-test
	$(VENV)/bin/python benchmarks/lstm_lm_speed.py

clean:
	rm -rf $(VENV) runs
