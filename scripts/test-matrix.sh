#!/usr/bin/env bash
# `make test-matrix`: the Spark-side integration subset on every Spark line of
# scripts/spark-lines.txt (or the lines given as arguments), each in its own
# .venvs/spark-<line> (scripts/spark-env.sh: that pyspark, the runtime's libraries, no
# Airflow) with the runtime taken from the source tree; then docs/compatibility.md from the
# results (scripts/compatibility.py). Exits non-zero when a line failed.
set -uo pipefail
cd "$(dirname "$0")/.."
# The subset, by feature row of docs/compatibility.md (scripts/compatibility.py maps them).
tests=(
  tests/integration/test_kill_restart.py      # checkpoints, SIGKILL and restart (Delta merge)
  tests/integration/test_driver_sigterm.py    # SIGTERM and restart
  tests/integration/test_runtime_restore.py   # savepoint relocation, restore refusals
  tests/integration/test_delta_sink.py        # Delta append and merge
  tests/integration/test_delta_sink_s3.py     # Delta on S3
  tests/integration/test_s3_sink.py           # S3 sink
  tests/races/test_self_healing.py            # self-healing replay
)
# MATRIX_TESTS (space-separated files) narrows the subset, e.g. CI's oldest-and-newest smoke
# (`make test-matrix-ci`); a narrowed run keeps its results apart (.venvs/results-subset)
# and leaves docs/compatibility.md alone.
root=.venvs/results
if [[ -n "${MATRIX_TESTS:-}" ]]; then
  read -r -a tests <<<"$MATRIX_TESTS"; root=.venvs/results-subset
  [[ ${#tests[@]} -gt 0 ]] || { echo "MATRIX_TESTS names no test file" >&2; exit 2; }
fi
if [[ $# -gt 0 ]]; then lines=("$@"); else mapfile -t lines < <(awk '!/^#/ && NF { print $1 }' scripts/spark-lines.txt); fi
mkdir -p "$root"
status=0
for line in "${lines[@]}"; do
  bash scripts/spark-env.sh "$line" || { status=1; continue; }
  python=$PWD/.venvs/spark-$line/bin/python
  echo "== Spark $line: $("$python" -c 'import pyspark; print(pyspark.__version__)')"
  # -m 'not airflow': the Spark side only (no Airflow in this venv); slow tests included.
  # One pytest per file (each one JUnit file): MATRIX_WRAPPER (e.g. a CPU-slot wrapper)
  # is put in front of each.
  results=$root/spark-$line
  rm -rf "$results" && mkdir -p "$results"
  for test in "${tests[@]}"; do
    ${MATRIX_WRAPPER:-} env PYTHONPATH="$PWD" PYSPARK_PYTHON="$python" PYSPARK_DRIVER_PYTHON="$python" \
      "$python" -m pytest -p no:cacheprovider -m 'not airflow' -rfEs \
      --junitxml="$results/$(basename "$test" .py).xml" ${MATRIX_PYTEST_ARGS:-} "$test" || status=1
  done
done
[[ -n "${MATRIX_TESTS:-}" ]] || python3 scripts/compatibility.py .venvs/results docs/compatibility.md
exit $status
