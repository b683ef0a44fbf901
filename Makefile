# One-command entry points; each sets up .venv first (idempotent).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0
# The exact versions the suite passed on, as pip constraints: a setup months later installs
# the same ones, not the newest that pyproject.toml's ranges allow. Torch is not in it.
LOCK := requirements.lock

.PHONY: setup sglang-venv demo test lint lock bench clean

$(STAMP): pyproject.toml $(LOCK)
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: anything else would pull a multi-GB CUDA build
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -c $(LOCK) -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

# Refresh requirements.lock: resolve pyproject.toml's ranges afresh (the newest versions
# they allow) in a scratch venv and record what was installed, torch excepted. Run
# `make test` on the new lock before committing it.
LOCK_VENV := .venv-lock
lock:
	rm -rf $(LOCK_VENV)
	$(PY) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q --upgrade pip
	$(LOCK_VENV)/bin/pip install -q $(TORCH)
	$(LOCK_VENV)/bin/pip install -q -e ".[test]"
	{ echo "# Exact versions of everything \`make setup\` installs besides torch (the Makefile pins it"; \
	  echo "# and installs it first), used as pip constraints. Refreshed by \`make lock\`."; \
	  $(LOCK_VENV)/bin/pip freeze --exclude-editable | grep -v -E '^(torch|triton)==|^nvidia-'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf $(LOCK_VENV)

# A second venv in which SGLang runs on CPU: its real server as a rollout engine
# (configs/sglang-cpu.yaml; rollout.sglang_python finds this venv) and the SGLang test tiers
# (`pytest -m sglang`): CPU torch, then SGLang and its light dependencies from an exact
# list, without resolving (SGLang's metadata asks for CUDA builds). The stand-ins for
# triton, torchvision and sgl_kernel go on its path through a .pth file, which also loads
# the start-up hooks: one hides the triton stand-in from torch, one makes pinned memory plain
# memory on CPU torch (SGLang's LoRA code asks for it). Built once; rebuilt when the list
# changes; the .pth is rewritten (no rebuild) when this Makefile changes.
SGLANG_VENV := .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed
SGLANG_HOOKS := $(SGLANG_VENV)/.standins
SGLANG_REQS := tests/sglang/requirements.txt
$(SGLANG_STAMP): $(SGLANG_REQS)
	rm -rf $(SGLANG_VENV)
	$(PY) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q $(TORCH)
	$(SGLANG_VENV)/bin/pip install -q --no-deps -r $(SGLANG_REQS)
	touch $(SGLANG_STAMP)

$(SGLANG_HOOKS): $(SGLANG_STAMP) Makefile
	$(SGLANG_VENV)/bin/python -c 'import sys, sysconfig; open(sysconfig.get_path("purelib") \
		+ "/conformance-standins.pth", "w").write(sys.argv[1] \
		+ "\nimport torch_sees_no_triton\nimport cpu_pinned_memory\n")' \
		"$(CURDIR)/tests/sglang/standins"
	touch $(SGLANG_HOOKS)

sglang-venv: $(SGLANG_STAMP) $(SGLANG_HOOKS)

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

# Two pytest-xdist workers: the flow tests one after another on one, the rest beside them on
# the other (tests/worker_groups.py). TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2

test: $(STAMP) $(SGLANG_STAMP) $(SGLANG_HOOKS) $(CHROMIUM)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -c $(LOCK) -e ".[bench]"
	touch $(BENCH_STAMP)

# every script in bench/suite.py's BENCHES; writes bench/RESULTS.md (~25 min on 2 cores)
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.suite $(ARGS)

clean:
	rm -rf runs .pytest_cache
