#!/usr/bin/env bash
# Build .venvs/airflow-nospark (or .venvs/airflow-<version>-nospark for an
# AIRFLOW_VERSION): an Airflow worker's environment as a user installs it (docs/install.md):
# Airflow and this provider (built from the source tree, not editable) with its
# dependencies, which bring the Spark provider but never `pyspark`, and no JVM. The Spark
# provider's own dependency `pyspark-client` is left out too (an override that never
# matches), so that nothing named `pyspark` is importable here at all: what the Airflow
# side needs of Spark is spark-submit of another environment (`make spark-envs`).
# Safe to run again: the dependencies are re-resolved when pyproject.toml or the version
# changes, the package is rebuilt when its sources change; uv's cache is reused.
#
# With a second argument `test` (`make airflow-test-env AIRFLOW_VERSION=3.2.0`):
# .venvs/airflow-<version>-test, the development environment's `.[test]` on that Airflow
# (pyspark included, as in .venv), where the Airflow-side tests run from the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-}
flavour=${2:-nospark}
[[ "$flavour" == nospark || "$flavour" == test ]] || { echo "flavour $flavour: expected nospark or test" >&2; exit 2; }
env=.venvs/airflow${version:+-$version}-$flavour
python=${PYTHON:-python3}
uv=${UV:-$(command -v uv || echo .venv/bin/uv)}
[[ -x "$uv" ]] || { echo "airflow-env.sh needs uv (UV=/path/to/uv, or make setup)" >&2; exit 2; }
overrides=$(mktemp) && trap 'rm -f "$overrides"' EXIT
package=.
if [[ "$flavour" == nospark ]]; then
  echo "pyspark-client; sys_platform == 'never'" >"$overrides"
else
  package=".[test]"
fi
pins=(${version:+"apache-airflow==$version"})
# Airflow 3.2 caps none of these, and their newest releases break its in-process execution
# API (dag.test(), a task's supervisor): a PydanticUserError on TITerminalStatePayload's
# discriminator (fastapi 0.165 with cadwyn 9), then no `svcs_registry` on the sub-app's
# state (svcs 26). Airflow's constraints file for 3.2 (not reachable here) pins older ones;
# this set was checked on 3.2.2 (docs/install.md).
constraints=$(mktemp) && trap 'rm -f "$overrides" "$constraints"' EXIT
[[ "$version" != 3.2.* ]] || printf '%s\n' "fastapi<0.137" "cadwyn<7" "svcs<26" >"$constraints"
deps_stamp="$env/.deps-$(cat pyproject.toml "$overrides" "$constraints" <(echo "$package ${pins[@]:-}") | sha1sum | cut -c1-12)"
sources_stamp="$env/.sources-$(find airflow_sparkpoint pyproject.toml -type f ! -name '*.pyc' -print0 | sort -z \
  | xargs -0 sha1sum | sha1sum | cut -c1-12)"
if [[ ! -f "$deps_stamp" ]]; then
  rm -rf "$env"
  "$uv" venv --quiet --python "$python" "$env"
  "$uv" pip install --quiet --python "$env/bin/python" --override "$overrides" --constraint "$constraints" \
    "$package" "${pins[@]}"
  touch "$deps_stamp"
elif [[ ! -f "$sources_stamp" ]]; then
  "$uv" pip install --quiet --python "$env/bin/python" --override "$overrides" --constraint "$constraints" \
    --reinstall-package airflow-sparkpoint "$package" "${pins[@]}"
fi
rm -f "$env"/.sources-* && touch "$sources_stamp"
# The point of this environment: refuse to call it done if a pyspark crept in.
[[ "$flavour" == test ]] || "$env/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("pyspark") is not None)' \
  || { echo "$env: pyspark is importable; expected none" >&2; exit 1; }
echo "$env: $("$env/bin/python" -c 'import airflow, airflow_sparkpoint as s; print("airflow", airflow.__version__, "sparkpoint", s.__version__)')"
