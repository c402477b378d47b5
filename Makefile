# IBEX: `make demo` runs the exchange on this machine, `make test` runs the checks.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install lint bench clean browser screenshots

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python -m ibex.run

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

# Chromium for the browser tests (Debian's package; Playwright drives /usr/bin/chromium).
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

# Re-take docs/screenshots/*.png from the browser tests.
screenshots: install browser
	IBEX_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest -q tests/web/browser

lint: install
	$(BIN)/ruff check .

bench: install
	@for f in bench/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
