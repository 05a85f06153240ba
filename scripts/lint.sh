#!/usr/bin/env bash
# The lint command, for developers and CI alike (`.ci/run` calls it before the tests): ruff's
# lint rules, ruff's formatter in check mode, and mypy --strict on the package, all configured
# in pyproject.toml ([tool.ruff], [tool.mypy]).  Every check runs even when one before it
# failed, so one run lists every problem; the exit status is non-zero when any failed.
# `ruff format airflow_provider_chasqui tests benchmarks example_dags scripts` applies the format.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${CHASQUI_VENV:-$HOME/.cache/airflow-provider-chasqui/venv}"
if [ ! -f "$VENV/bin/activate" ] || [ "${CHASQUI_BOOTSTRAP:-auto}" = always ]; then
  bash scripts/bootstrap.sh
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"

PATHS=(airflow_provider_chasqui tests benchmarks example_dags scripts)
failed=()
run() {
  local name=$1
  shift
  echo "--> $name: $*"
  if "$@"; then
    echo "<-- $name: ok"
  else
    echo "<-- $name: FAILED"
    failed+=("$name")
  fi
}
run "ruff check" ruff check "${PATHS[@]}"
run "ruff format --check" ruff format --check "${PATHS[@]}"
run "mypy (strict, the package)" mypy
if [ "${#failed[@]}" -gt 0 ]; then
  echo "lint failed: ${failed[*]}"
  exit 1
fi
echo "lint: all checks passed"
