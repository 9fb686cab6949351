# The two commands of the README:
#   make demo   create .venv from the lock file, run the end-to-end demo
#   make test   create .venv from the lock file if it is missing or older than the lock, lint (ruff), type-check
#               (mypy), check the import layers (import-linter), build the docs site with warnings as errors (mkdocs),
#               run the doctests and the test suite
# Both install the library (pyproject.toml) and the bench (bench/pyproject.toml: the harness and the lightning-unlearn
# command), editable. And for maintainers (not part of CI):
#   make lock         re-resolve requirements.lock (every transitive pin with its hashes) to the newest versions the
#                     ranges in pyproject.toml and bench/pyproject.toml allow, with torch/torchvision pinned by
#                     constraints.txt
#   make test-latest  the same checks in .venv-latest, installed from the ranges (not the lock), plus secure_bytes on the
#                     newest release of every major version of cryptography the range allows: drift seen before users see it
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LOCK   := requirements.lock
PIP    := -m pip install --quiet --disable-pip-version-check

.PHONY: demo test lock test-latest bench clean

# A new lock rebuilds the venv from scratch (--clear), so nothing of an older lock survives in it.
$(STAMP): $(LOCK) pyproject.toml bench/pyproject.toml
	$(PYTHON) -m venv --clear $(VENV)
	$(PY) $(PIP) --require-hashes --no-deps -r $(LOCK)
	$(PY) $(PIP) --no-deps --no-build-isolation -e . -e bench
	$(PY) -m pip check
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/continual_unlearning.py

# NO_MKDOCS_2_WARNING: mkdocs-material prints a banner about its own end of life (2027) on every build; this is the
# switch it documents. The build's own warnings stay errors (strict).
define checks
	$(1)/bin/ruff check .
	$(1)/bin/python -m mypy
	$(1)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(1)/bin/mkdocs build --strict
	$(1)/bin/python -m pytest -q -p no:cacheprovider --doctest-modules lightning_unlearn bench/lightning_unlearn_bench
	$(1)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile
endef

test: $(STAMP)
	$(call checks,$(VENV))

# The bench requires lightning-unlearn, which no index has: pip-compile finds it as a wheel built from this checkout
# (--find-links) and leaves it out of the lock (--unsafe-package, which replaces pip-tools' default unsafe list, so
# pip and setuptools are pinned as before without --allow-unsafe); `make` installs it editable.
lock:
	$(PYTHON) -m venv .venv-tools
	.venv-tools/bin/python $(PIP) "pip-tools>=7.6,<8"
	rm -rf .venv-tools/wheels
	.venv-tools/bin/python -m pip wheel --quiet --disable-pip-version-check --no-deps -w .venv-tools/wheels .
	.venv-tools/bin/pip-compile --quiet --upgrade --generate-hashes --strip-extras \
		--no-emit-index-url --no-emit-find-links -c constraints.txt \
		--find-links .venv-tools/wheels --unsafe-package lightning-unlearn \
		--extra metrics --extra test --extra docs -o $(LOCK) pyproject.toml bench/pyproject.toml

test-latest:
	$(PYTHON) -m venv --clear .venv-latest
	.venv-latest/bin/python $(PIP) --upgrade --upgrade-strategy eager -c constraints.txt -e ".[metrics,test,docs]" -e bench
	.venv-latest/bin/python -m pip check
	$(call checks,.venv-latest)
	.venv-latest/bin/python tests/scripts/cryptography_majors.py

bench: $(STAMP)
	$(PY) benchmarks/acu.py

clean:
	rm -rf $(VENV) .venv-latest .venv-tools outputs lightning_logs
