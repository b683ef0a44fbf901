# One-command entry points; each sets up .venv first (idempotent).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: anything else would pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

# resume=fresh: a second `make demo` replaces the first one's outputs instead of refusing
# (ARGS come later and win, e.g. ARGS="checkpoint.resume=auto")
demo: $(STAMP)
	$(BIN)/python -m flows.train checkpoint.resume=fresh $(ARGS)

# The UI test drives Debian's Chromium headless (Playwright uses it by path; no browser
# download). Installed once, as root or through sudo.
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	$$( [ "$$(id -u)" -eq 0 ] || echo sudo ) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $$( [ "$$(id -u)" -eq 0 ] || echo sudo ) apt-get install -y -qq chromium >/dev/null

test: $(STAMP) $(CHROMIUM)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/python -m bench.checkpoint_io
	$(BIN)/python -m bench.demo_footprint

clean:
	rm -rf runs .pytest_cache
