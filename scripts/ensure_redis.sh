#!/usr/bin/env bash
# Make sure the shared Redis answers on 127.0.0.1:6379 (start Debian's redis-server if not).
# Tests start their own extra servers on free ports; this one is the default target.
set -euo pipefail
ping6379() { [ "$(timeout 5 redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; }
if ping6379; then
  echo "redis: already answering on 127.0.0.1:6379"
  exit 0
fi
echo "redis: starting redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:6379"
redis-server --daemonize yes --port 6379 --bind 127.0.0.1 --save "" --appendonly no
deadline=$(( $(date +%s) + 30 ))
until ping6379; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "redis on 6379 did not answer PING within 30s" >&2; exit 1; }
  sleep 0.1
done
