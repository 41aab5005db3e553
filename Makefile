# `make train`: create .venv when missing, install with the extras every program
#               needs (train), run the Quick-start training job.
# `make test`:  create .venv when missing, install with test extras, run the test suite
#               on one pytest-xdist worker per core; an idle worker takes tests queued
#               for a busy one (worksteal), so that the suite does not end waiting on
#               one worker's queue.
# The first Python 3.12 or newer that runs (jax 0.11 needs 3.12): on PATH, else
# one pyenv installed (its shims run only the versions it has made active).
ifeq ($(origin PYTHON),undefined)
PYTHON := $(firstword $(foreach p,python3.12 python3.13 python3 \
  $(foreach root,$(PYENV_ROOT) $(HOME)/.pyenv $(shell pyenv root 2>/dev/null), \
  $(wildcard $(root)/versions/3.1[2-9]*/bin/python3)),$(shell $(p) -c \
  'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && command -v $(p))))
endif
VENV := .venv
export LM_ZOO_DATA ?= $(abspath ../shared/data)

.PHONY: train test lint api bench clean

# One stamp per extra installed: `make train` does not install the test tools.
$(VENV)/.installed-%: pyproject.toml
	@test -x $(VENV)/bin/python || test -n "$(PYTHON)" || { echo "make: no Python 3.12 or newer found:" \
	  "install one, or name it with PYTHON=/path/to/python3"; exit 1; }
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))' || { echo "make: $(VENV) is an older Python than" \
	  "lm_zoo's 3.12: remove it (rm -r $(VENV)) and run make again"; exit 1; }
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[$*]'
	touch $@

train: $(VENV)/.installed-train
	$(VENV)/bin/python launch/train.py --config=experiments/default.py --workdir=runs/default

test: $(VENV)/.installed-test
	$(VENV)/bin/python -m pytest -q -n auto --dist worksteal

# `make lint`: ruff's checks and its formatter's style (pyproject.toml's [tool.ruff])
# over every Python file (`ruff format .` rewrites a file in that style), and the
# size limits: files at most 400 lines, lm_zoo's functions at most 60 (.ci/layout.py).
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/python .ci/layout.py

# `make api`: the API reference from the docstrings (pdoc) in build/api, every
# warning an error but annotations pdoc cannot evaluate (generated __init__s,
# other libraries' type aliases), which it shows as written. The programs and
# the experiment configs are not APIs: docs/usage.md covers them.
api: $(VENV)/.installed-test
	$(VENV)/bin/python -W error::UserWarning -W 'ignore:Error parsing type annotation:UserWarning' \
	  -m pdoc lm_zoo '!lm_zoo.cli' '!lm_zoo.experiments' '!lm_zoo.programs' -o build/api

bench: $(VENV)/.installed-test
	$(VENV)/bin/python benchmarks/lstm_lm_speed.py

clean:
	rm -rf $(VENV) runs
