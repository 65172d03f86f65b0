#!/usr/bin/env bash
# redis-server for tests/integration/test_cluster.py (the tests start their own on a free port).
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends redis-server
