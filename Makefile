# AgentNest: one entry point.  `make demo` and `make test` do all set-up on a
# fresh Debian machine (root) and are safe to rerun.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: demo test unit integration escapes lint docs bench engine image browser storage postgres venv clean e2b-latest

demo: engine venv image storage
	$(BIN)/agentnest demo

# The suite on TEST_WORKERS processes (pytest-xdist).  Most tests wait on an engine, a sandbox or a
# clock rather than on a core, so three workers keep two cores busy (four ran faster
# but made timing-sensitive tests flaky under the load); worksteal lets a worker that
# runs dry take queued tests from the others, so one long test never leaves the rest idle.
# Every test owns what it creates (labels with its own process, private pools, engines and
# servers on free ports), so workers never touch each other's sandboxes.  Lint, types and the
# docs build run beside the tests (their output follows the tests'); either failing fails make.
TEST_WORKERS ?= 3

test: engine venv image browser storage postgres
	@rm -f .lint.log .lint.rc; \
	( $(MAKE) --no-print-directory lint docs > .lint.log 2>&1; echo $$? > .lint.rc ) & \
	AGENTNEST_REQUIRE_ENGINE=1 $(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25 tests; \
	tests=$$?; wait; cat .lint.log; lint=$$(cat .lint.rc 2>/dev/null || echo 1); \
	echo "make test: the tests exited $$tests; lint, types and docs exited $$lint"; \
	[ $$tests -eq 0 ] && [ $$lint -eq 0 ]

unit: venv
	$(BIN)/pytest -q tests/unit

integration: engine venv image browser storage postgres
	$(BIN)/pytest -q tests/integration

escapes: engine venv image storage
	$(BIN)/pytest -q -m escapes tests

lint: venv
	$(BIN)/ruff check agentnest tests benchmarks scripts
	$(BIN)/ruff format --check agentnest tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/mypy --check-untyped-defs tests
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml); --strict turns every broken link or docstring
# warning into a failure.  Serve it locally with `$(BIN)/mkdocs serve`.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .site

# The E2B canary: the acceptance suite (tests/e2b) against whatever `e2b` and
# `e2b-code-interpreter` PyPI serves today, in a venv made for today only
# (~/.cache/agentnest/e2b-sdk/latest-DATE; `make test` runs the pinned matrix).
e2b-latest: engine venv image
	AGENTNEST_E2B_MATRIX=latest AGENTNEST_REQUIRE_ENGINE=1 $(BIN)/pytest -q tests/e2b

bench: engine venv image browser storage postgres
	$(BIN)/python benchmarks/bench.py

engine:
	bash scripts/setup-engine.sh

# PostgreSQL's binaries for the manager's database tests (each run starts its own server).
postgres:
	bash scripts/setup-postgres.sh

image: engine venv
	$(BIN)/agentnest image base

# The browser preset's image (Debian's Chromium + Playwright; docs/presets.md): built once.
browser: engine venv image
	$(BIN)/agentnest image browser

# The storage pool of disk workspaces (btrfs on a sparse file, quotas on); see docs/state.md.
storage: engine venv
	$(BIN)/agentnest setup

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .site
