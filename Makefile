# Everything runs in the project's own virtual environment, .venv (Python 3.11).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv demo test lint tox-latest clean distclean

venv: $(STAMP)

# Re-installs whenever pyproject.toml is newer than the stamp.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The demo site on http://127.0.0.1:8000/ (admin / admin), a worker, and an
# embedded Redis server unless COGWORKER_REDIS_URL is set.
demo: venv
	$(BIN)/python testproject/rundemo.py

# The tests start their own Redis server unless COGWORKER_REDIS_URL is set.
test: venv
	$(BIN)/pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Python 3.12 with the newest Django.
tox-latest: venv
	$(BIN)/tox -e py312-django61

clean:
	rm -rf .tox build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache test-artifacts
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

# Also the virtual environment, the demo database and the embedded Redis data.
distclean: clean
	if [ -x $(BIN)/python ]; then $(BIN)/python testproject/manage.py cogworker_embedded stop || true; fi
	rm -rf $(VENV) testproject/db.sqlite3 testproject/.cogworker
