# The two commands of the README:
#   make demo   create .venv, install, run the end-to-end demo
#   make test   create .venv if needed, install, lint (ruff), type-check (mypy), check the import layers
#               (import-linter), build the docs site with warnings as errors (mkdocs), run the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[harness,test,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/continual_unlearning.py

# NO_MKDOCS_2_WARNING: mkdocs-material prints a banner about its own end of life (2027) on every build; this is the
# switch it documents. The build's own warnings stay errors (strict).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

bench: $(STAMP)
	$(PY) benchmarks/acu.py

clean:
	rm -rf $(VENV) outputs lightning_logs
