#!/usr/bin/env bash
# Set up a machine for airflow-provider-chasqui from the project's own files, so a brand-new
# machine and CI end up identical: the Debian packages the tests need (only those missing,
# as root), the venv, the editable install with every extra, and the pyspark repair below.
# Idempotent: re-running on a set-up machine only re-checks.
#
#   CHASQUI_VENV    venv to create or reuse (default ~/.cache/airflow-provider-chasqui/venv)
#   PYTHON          interpreter for a new venv (default python3; needs >= 3.11)
#   CHASQUI_EXTRAS  extras to install (default test,airflow,spark,spark-airflow,parquet,metrics,bench,otel,dashboard;
#                   the interop extra has its own venv: scripts/matrix.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${CHASQUI_VENV:-$HOME/.cache/airflow-provider-chasqui/venv}"
PYTHON="${PYTHON:-python3}"
EXTRAS="${CHASQUI_EXTRAS:-test,airflow,spark,spark-airflow,parquet,metrics,bench,otel,dashboard}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 DEBIAN_FRONTEND=noninteractive

_t0=0
step() { _t0=$(date +%s%N); printf '  [bootstrap] %s\n' "$*"; }
done_step() { local ms=$(( ($(date +%s%N) - _t0) / 1000000 )); printf '  [bootstrap]   done in %d.%03ds\n' $((ms / 1000)) $((ms % 1000)); }

# --- Debian packages: Redis 7 for the shared test server, Java for Spark, venv support ---
step "system packages"
missing=()
[ -x /usr/bin/redis-server ] || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
# validates docker-compose.yaml offline in the tests (no Docker engine is needed for `config`)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)  # the TLS tests make their certificates
# the dashboard's browser tests drive Debian's Chromium through Playwright (no browser download)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
if [ ! -x "$VENV/bin/python" ] && ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then sudo=(); elif command -v sudo >/dev/null 2>&1; then sudo=(sudo -n); else
    echo "bootstrap: missing Debian packages ${missing[*]}; install them as root" >&2; exit 1
  fi
  echo "  [bootstrap]   apt-get install ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
done_step

# --- the venv ---
step "venv at $VENV"
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  # Its base interpreter is gone or too old: rebuild, but only something that is a venv.
  [ -f "$VENV/pyvenv.cfg" ] || { echo "bootstrap: $VENV is not a venv; refusing to replace it" >&2; exit 1; }
  echo "  [bootstrap]   unusable venv, recreating"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
    || { echo "bootstrap: $PYTHON is older than 3.11; set PYTHON=" >&2; exit 1; }
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
done_step

# --- the project, editable, with every extra ---
step "pip install -e .[$EXTRAS]"
"$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
done_step

# --- the engine's own dependencies at the newest versions the pins allow, as a user's plain
# install gets them (an existing venv keeps whatever once satisfied the pins: chasquimq, once a
# test dependency, held redis-py below 7). Its interop tests have a venv of their own (matrix.sh).
step "newest redis-py, msgpack, croniter within the pins"
"$VENV/bin/python" -m pip uninstall -q -y chasquimq >/dev/null 2>&1 || true
mapfile -t pins < <("$VENV/bin/python" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
"$VENV/bin/python" -m pip install -q --upgrade "${pins[@]}"
"$VENV/bin/python" -c 'import importlib.metadata as m; print("  [bootstrap]   redis", m.version("redis"), "msgpack", m.version("msgpack"), "croniter", m.version("croniter"))'
done_step

# --- pyspark repair ---
# The spark-airflow extra (apache-airflow-providers-apache-spark) depends on pyspark-client, which
# ships the same pyspark/ package directory as pyspark (Python files only, older version). With
# both the spark and spark-airflow extras, whichever pip installs last wins, so the Python side
# can be pyspark-client's while the jars are pyspark's. Re-lay pyspark's own files at the version
# pip recorded for it, without touching deps. (The spark extra alone needs no repair.)
if "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("pyspark")' >/dev/null 2>&1; then
  step "pyspark files match pyspark's metadata"
  check='import importlib.metadata as m, pyspark; print(m.version("pyspark"), pyspark.__version__)'
  versions=$("$VENV/bin/python" -c "$check"); read -r want have <<<"$versions"
  if [ "$want" != "$have" ]; then
    echo "  [bootstrap]   pyspark files are $have (pyspark-client), metadata says $want: reinstalling pyspark==$want"
    "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "pyspark==$want"
    versions=$("$VENV/bin/python" -c "$check"); read -r want have <<<"$versions"
    [ "$want" = "$have" ] || { echo "bootstrap: pyspark still $have after reinstall (want $want)" >&2; exit 1; }
  fi
  # The JVM side must start too (Java present, jars intact). spark-submit finds SPARK_HOME
  # through whichever python3 is first on PATH, hence the venv's bin first.
  banner=$(PATH="$VENV/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 spark-submit --version 2>&1) || true
  grep -q "version $want" <<<"$banner" \
    || { echo "bootstrap: spark-submit --version does not report $want:" >&2; echo "$banner" >&2; exit 1; }
  echo "  [bootstrap]   pyspark $have; spark-submit OK"
  done_step
fi

echo "  [bootstrap] ready: source $VENV/bin/activate (or run scripts/test.sh)"
