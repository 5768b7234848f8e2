# Two commands on a fresh machine:
#   make demo   set everything up, then run the guided demo (Airflow + Spark + Delta)
#   make test   set everything up, then run the test suite (what CI runs)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sparkpoint-installed
PYTEST_ARGS ?=

.PHONY: explore setup lint test test-all test-fast test-e2e test-matrix test-matrix-ci spark-envs airflow-env airflow-test-env test-airflow demo bench bench-deps bench-large chaos check-java browser clean dist test-install

setup: check-java $(STAMP)

# Re-installs only when pyproject.toml changes; safe to run again and again.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip uv
	@$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[dev]'
	@touch $(STAMP)

check-java:
	@bash scripts/check-java.sh

# The UI plugin's browser test drives Debian's chromium through Playwright (the Python
# package comes with `setup`; Playwright's own browser download cannot be used). Installed
# once; a no-op when /usr/bin/chromium is there.
browser:
	@bash scripts/install-chromium.sh

# Before any test: ruff, mypy on the package, the import-linter contracts of pyproject.toml
# (layers, no Airflow on the Spark side, no PySpark under checkpoints/storage, no cycles)
# scripts/check_structure.py (no module over 1,000 lines, no import cycle at all, __all__ in
# every public module, no runtime class built on another runtime module's class, no test
# package importing another, job scripts importing only runtime and sinks) and
# scripts/check_local_fs.py (no raw shutil.rmtree, os.replace, os.listdir... outside
# storage/localfs.py, the one layer that follows no symbolic link).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy airflow_sparkpoint
	$(VENV)/bin/lint-imports
	$(PY) scripts/check_structure.py airflow_sparkpoint
	$(PY) scripts/check_local_fs.py airflow_sparkpoint

test: setup browser lint
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -m 'not spark and not s3 and not airflow and not slow' $(PYTEST_ARGS)

test-all: setup browser
	$(PY) -m pytest -m '' $(PYTEST_ARGS)

# The end-to-end suite alone, slow tests included: a real Airflow (api-server, scheduler,
# dag-processor, triggerer) and a Spark standalone cluster, started once for the package.
# Logs of a failed run are kept under test-artifacts/ (or $$SPARKPOINT_E2E_ARTIFACTS).
test-e2e: setup
	$(PY) -m pytest tests/e2e -m '' $(PYTEST_ARGS)

# Every maintained Spark line (scripts/spark-lines.txt): .venvs/spark-<line> holds that
# line's pyspark and the runtime's libraries only (no Airflow); the Spark-side integration
# subset runs there from the source tree, and docs/compatibility.md is written from the
# results. Not part of `make test`. One line: make test-matrix SPARK_LINES=3.5
SPARK_LINES ?=
UV ?= $(shell command -v uv || echo $(VENV)/bin/uv)
spark-envs:
	@for line in $${SPARK_LINES:-$$(awk '!/^#/ && NF { print $$1 }' scripts/spark-lines.txt)}; do \
		UV=$(UV) bash scripts/spark-env.sh $$line || exit 1; done

test-matrix: check-java
	UV=$(UV) bash scripts/test-matrix.sh $(SPARK_LINES)

# CI's Spark-line check (.ci/run, after `make test`): on the oldest and the newest line of
# scripts/spark-lines.txt, a checkpointed Delta merge job SIGKILLed and restarted, exact.
# Minutes: two environments (about 1 GB each, downloaded once) and one test per line.
MATRIX_CI_TESTS ?= tests/integration/test_kill_restart.py
test-matrix-ci: check-java setup
	MATRIX_TESTS="$(MATRIX_CI_TESTS)" UV=$(UV) bash scripts/test-matrix.sh \
		$$(awk '!/^#/ && NF { l = $$1; if (!f) f = l } END { print f; if (l != f) print l }' scripts/spark-lines.txt)

# An Airflow worker's environment with the provider and no pyspark (scripts/airflow-env.sh):
# .venvs/airflow-nospark, or .venvs/airflow-<v>-nospark with AIRFLOW_VERSION=<v>. The
# cross-environment test (tests/e2e/test_e2e_cross_env.py) builds it with spark-envs.
AIRFLOW_VERSION ?=
airflow-env:
	@UV=$(UV) bash scripts/airflow-env.sh $(AIRFLOW_VERSION)

# The Airflow-side tests on another Airflow (e.g. AIRFLOW_VERSION=3.2.0): .venvs/airflow-<v>-test
# holds `.[test]` on that Airflow; the tests run there from the source tree.
AIRFLOW_TESTS ?= tests/unit/airflow
airflow-test-env:
	@UV=$(UV) bash scripts/airflow-env.sh "$(AIRFLOW_VERSION)" test
test-airflow: airflow-test-env
	PYTHONPATH=$(CURDIR) .venvs/airflow$(if $(AIRFLOW_VERSION),-$(AIRFLOW_VERSION))-test/bin/python -m pytest \
		-p no:cacheprovider -m 'not slow' $(PYTEST_ARGS) $(AIRFLOW_TESTS)

# A release a user installs (docs/install.md): the wheel and the sdist in dist/, built from
# the version in airflow_sparkpoint/__init__.py (its one home), checked against CHANGELOG.md
# (a section per version; ".devN": Unreleased) and by `twine check --strict` (the metadata
# and the README that PyPI renders). Publishing: docs/development.md "Releasing".
dist: setup
	$(PY) scripts/check_release.py
	rm -rf dist
	$(VENV)/bin/uv build --quiet --out-dir dist
	$(VENV)/bin/twine check --strict dist/*
	$(PY) scripts/check_release.py dist/*

# The built wheel as a user installs it (tests/install/test_wheel_install.py): a fresh venv
# with Airflow, its constraints file and the wheel, no pyspark; Airflow sees the provider,
# the example DAGs import, and the tutorial's DAG runs against .venvs/spark-<line>.
# 1.5 to 3.5 minutes here with uv's cache warm and the Spark environment built (a venv of
# Airflow, one tutorial run); it builds environments from the package index, so it is not
# part of `make test` (40-minute budget): .ci/run calls it after the Spark-line check,
# whose newest line it reuses (INSTALL_SPARK_LINE=<line> for another).
test-install: dist
	$(PY) -m pytest tests/install -m '' -p no:cacheprovider $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/sparkpoint demo --workdir demo-output

# The report's pictures need matplotlib (the `bench` extra), installed here only.
bench-deps: setup
	@$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[dev,bench]'

bench: bench-deps
	$(PY) benchmarks/run_all.py

# Production scale (issue 18): 200k / 2M / 20M keys of RocksDB state, checkpoints on local
# disk and on SeaweedFS, throughput at 2M keys. About an hour on a shared 2-core machine;
# refreshes its part of docs/BENCHMARKS.md (figures and docs/images/*.png).
bench-large: bench-deps
	$(PY) benchmarks/run_all.py --large

# Fault injection: >= 50 SIGKILL trials per sink (sinks on S3: split between moto and
# SeaweedFS), every (fault point x commit mode) pair of each must fire; plus storage faults,
# zombies and corrupt metadata. Prints the table (trials, fired, duplicates, lost, failed
# per sink x point x mode) at the end. SPARKPOINT_CHAOS_TRIALS, _SEED, _WORKERS (default 2),
# _CASES (e.g. SPARKPOINT_CHAOS_CASES=directory,s3@moto). Every trial is appended to the
# cumulative record docs/chaos/ (SPARKPOINT_CHAOS_RECORD= turns that off). Hours on 2 cores: see docs/development.md "Fault injection".
chaos: setup
	SPARKPOINT_CHAOS_TRIALS=$${SPARKPOINT_CHAOS_TRIALS:-50} \
	SPARKPOINT_CHAOS_RECORD=$${SPARKPOINT_CHAOS_RECORD-docs/chaos/trials.jsonl} $(PY) -m pytest tests/chaos -m '' \
		-p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venvs demo-output .pytest_cache

# Soak (issue 32; not part of `make test`): a stateful job checkpointing every batch to
# SeaweedFS for SOAK_ARGS (default two hours), savepoints every 10 minutes; writes
# soak-output/soak.json and a plot, prints last/first quarter ratios. See docs/BENCHMARKS.md.
.PHONY: soak
soak: bench-deps
	$(PY) benchmarks/soak.py $${SOAK_ARGS:---minutes 120}

# The protocol explored by simulation (issue 45; not part of `make test`, which runs 2,000
# Hypothesis schedules): EXPLORE_SCHEDULES seeded random schedules (default 100,000, about
# two hours on one core), appended to docs/simulation/runs.jsonl and its README table.
# EXPLORE_SEED repeats a run; a violation prints the SEED:INDEX that repeats it
# (`python -m tests.simulation.explore --repeat SEED:INDEX`).
EXPLORE_SCHEDULES ?= 100000
explore: setup
	$(PY) -m tests.simulation.explore --schedules $(EXPLORE_SCHEDULES) $(if $(EXPLORE_SEED),--seed $(EXPLORE_SEED))
