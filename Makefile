# The commands the README gives. Each sets up what it needs first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make run` needs only the app's own dependencies: a first run does not wait for the test tools.
RUN_STAMP := $(if $(wildcard $(STAMP)),$(STAMP),$(VENV)/.installed-run)
# Tests run against $DATABASE_URL when set, else against a throwaway PostgreSQL cluster.
WITH_PG := $(if $(DATABASE_URL),,$(PY) scripts/throwaway_postgres.py --)
# The benchmarks time commits: their cluster flushes each one to disk, as production does.
WITH_DURABLE_PG := $(if $(DATABASE_URL),,$(PY) scripts/throwaway_postgres.py --durable --)

# Each extra alone, and none: a virtualenv each with the app, that extra and the test tools
# (`.venv` has every extra). Built once, then again only when pyproject.toml changes.
EXTRA_LEGS := none celery tasks otel
EXTRA_STAMPS := $(EXTRA_LEGS:%=.venv-extra-%/.installed)
comma := ,

.PHONY: install run worker test test-tools extras $(EXTRA_LEGS:%=extras-%) lint soak bench \
	screenshot clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The app and what the example project's settings read.
$(VENV)/.installed-run: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[demo]'
	touch $@

$(EXTRA_STAMPS): .venv-extra-%/.installed: pyproject.toml
	test -d $(@D) || $(PYTHON) -m venv $(@D)
	$(@D)/bin/python -m pip install --quiet --upgrade pip
	$(@D)/bin/python -m pip install --quiet -e '.[test$(if $(filter none,$*),,$(comma)$*)]'
	touch $@

install: $(STAMP)

# The benchmark's comparisons (procrastinate, django-tasks-db) come with the `bench` extra.
$(VENV)/.bench-installed: $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(VENV)/.bench-installed

# Migrates SQLite, creates admin/admin if there is no user, runs the web server and run_jobs.
run: $(RUN_STAMP)
	$(PY) manage.py run_demo

worker: $(RUN_STAMP)
	$(PY) manage.py migrate --no-input
	$(PY) manage.py run_worker

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy ultimat3_jobs testproject tests bench
	$(PY) manage.py makemigrations --check --dry-run

# PostgreSQL, Redis and Chromium: installed as root when missing, else the command to run.
test-tools:
	@PYTHON=$(PYTHON) scripts/test_tools.sh

test: test-tools lint
	$(WITH_PG) $(PY) -m pytest -m "not soak" $(PYTEST_ARGS)
	# The embedded default: everything that does not need PostgreSQL, again on SQLite.
	DATABASE_URL=sqlite:///$(CURDIR)/.test-sqlite.db $(PY) -m pytest -m "not postgres and not soak and not browser" -q tests/integration tests/acceptance
	$(MAKE) --no-print-directory --keep-going extras

# Imports, `manage.py check` and each role, on SQLite, with no extra and with each alone.
extras: $(EXTRA_LEGS:%=extras-%)

$(EXTRA_LEGS:%=extras-%): extras-%: .venv-extra-%/.installed
	ULTIMAT3_EXTRAS=$* DATABASE_URL=sqlite:///$(CURDIR)/.venv-extra-$*/test.db $(<D)/bin/python -m pytest -q -p no:cacheprovider tests/extras

# The whole-fleet soak's length: `make soak SOAK_SECONDS=3600` for an hour.
SOAK_SECONDS ?= 120

soak: $(STAMP)
	SOAK_SECONDS=$(SOAK_SECONDS) $(WITH_PG) $(PY) -m pytest -m soak $(PYTEST_ARGS)

# The README's screenshot of the tasks list, taken again by the quickstart's browser test.
screenshot: $(STAMP)
	ULTIMAT3_UPDATE_DOCS=1 $(WITH_PG) $(PY) -m pytest -q tests/browser/test_quickstart_browser.py

# Compiled first, as an installed package is (pip compiles what it installs, the peers
# included): a worker process timed from its start should not compile our sources each time.
bench: $(VENV)/.bench-installed
	$(PY) -m compileall -q ultimat3_jobs testproject bench
	$(WITH_DURABLE_PG) $(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-extra-* db.sqlite3 .test-sqlite.db .pytest_cache .mypy_cache .ruff_cache
