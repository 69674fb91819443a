# devchar: `make run` characterizes this machine; `make test` runs the tests.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export DEVCHAR_HOME ?= $(CURDIR)/.devchar

.PHONY: run test test-slow test-all check-references ui mlflow lock clean

# Re-installs only when the requirements change (the stamp is older than them).
$(STAMP): requirements.txt requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, from the local CPU wheel: letting another package pull it brings a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt -c requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/devchar run

# Fast tier (unit tests and tiny-profile integration); `make test-all` adds the slow tier
# (quick-profile materializations), marked `slow`. Tests marked `gpu` skip without CUDA.
# --durations: the slowest tests close each log, where the suite's time goes on CI's machine
test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -m "not slow" --durations=15

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow --durations=15

test-all: test test-slow

# Fit, predict and check every committed reference calibration (models_store/reference/<slug>/),
# each in a data directory of its own: nothing is measured, the blocking held-out checks gate.
# The replays run side by side ($CHECK_REFERENCES_JOBS at a time, default the core count).
check-references: $(STAMP)
	DEVCHAR=$(VENV)/bin/devchar scripts/check_references.sh

ui: $(STAMP)
	$(VENV)/bin/devchar ui

mlflow: $(STAMP)
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(DEVCHAR_HOME)/mlflow.db --host 127.0.0.1 --port 5000

# Regenerate the lock from the current venv (after changing requirements.txt).
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v -E '^(torch|devchar)[=@ ]' > requirements.lock

clean:
	rm -rf $(DEVCHAR_HOME)
