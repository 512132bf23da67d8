# Kiln: the two commands of the quick start are `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test test-unit check protos clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/kiln demo

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

check: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

protos: setup
	$(PY) -m protos.generate

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
