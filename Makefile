# IBEX: `make demo` runs the exchange on this machine, `make test` runs the checks.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install lint bench clean browser screenshots crash load

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

# Reliability (docs/reliability.md): 50 SIGKILLs of a worker in each of placement, clearing,
# metering and payouts, and PostgreSQL restarted three times under 60 s of load.
crash: install
	IBEX_CRASH_LOOPS=50 IBEX_PG_RESTART_SECONDS=60 IBEX_PG_RESTARTS=3 \
		$(BIN)/python -m pytest -q -s -p no:cacheprovider tests/reliability/test_crash.py \
		tests/reliability/test_postgres_restart.py

# Load: 50 tenants for 5 minutes against gunicorn with 4 workers (needs DATABASE_URL, REDIS_URL).
load: install
	$(BIN)/python bench/load.py --seconds 300 --users 50

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
