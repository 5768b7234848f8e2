#!/usr/bin/env bash
# Build .venvs/spark-<line>: pyspark of that Spark line (scripts/spark-lines.txt), the
# runtime's libraries (the `runtime` extra of pyproject.toml), what the line's row adds
# (protobuf) and the test tools of the Spark-side subset (the `spark-test` extra). No
# Airflow, and not the package itself: the runtime runs from the source tree (PYTHONPATH).
# uv when there is one, else venv + pip.
set -euo pipefail
cd "$(dirname "$0")/.."
line=${1:?usage: spark-env.sh LINE (e.g. 3.5)}
version=$(awk -v l="$line" '$1 == l { print $2 }' scripts/spark-lines.txt)
read -r -a line_extras < <(awk -v l="$line" '$1 == l { $1 = ""; $2 = ""; print }' scripts/spark-lines.txt) || true
[[ -n "$version" ]] || { echo "Spark line $line is not in scripts/spark-lines.txt" >&2; exit 2; }
env=.venvs/spark-$line
python=${PYTHON:-python3}
mapfile -t reqs < <("$python" - <<'PY'
import tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print("\n".join(extras["runtime"] + extras["spark-test"]))
PY
)
reqs+=("${line_extras[@]}")
# Re-installs only when the pinned version or the requirement lists changed.
stamp="$env/.sparkpoint-$version-$(printf '%s\n' "${reqs[@]}" | sha1sum | cut -c1-12)"
[[ -f "$stamp" ]] && exit 0
uv=${UV:-$(command -v uv || echo .venv/bin/uv)}
rm -rf "$env"
if [[ -x "$uv" ]]; then
  "$uv" venv --quiet --python "$python" "$env"
  "$uv" pip install --quiet --python "$env/bin/python" "pyspark==$version" "${reqs[@]}"
else
  "$python" -m venv "$env"
  "$env/bin/python" -m pip install --quiet "pyspark==$version" "${reqs[@]}"
fi
touch "$stamp"
echo "$env: pyspark $version"
