# The two commands of the README:
#   make demo   create .venv, install, run the end-to-end demo
#   make test   create .venv if needed, install, lint (ruff), type-check (mypy), run the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[harness,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/continual_unlearning.py

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(PY) benchmarks/acu.py

clean:
	rm -rf $(VENV) outputs lightning_logs
