#!/usr/bin/env bash
# The one test command, for developers and CI alike: the project venv, pytest, no cache dir
# (a fresh clone must not depend on .pytest_cache). Extra arguments go to pytest.
# Needs scripts/bootstrap.sh to have run, and Redis on 127.0.0.1:6379 (or REDIS_URL).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${CHASQUI_VENV:-$HOME/.cache/airflow-provider-chasqui/venv}"
if [ ! -f "$VENV/bin/activate" ]; then
  echo "test.sh: no venv at $VENV; run scripts/bootstrap.sh first" >&2
  exit 2
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
# Spark otherwise binds the machine's outward address; tests stay on loopback.
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
exec python -m pytest -q -p no:cacheprovider "$@"
