#!/usr/bin/env bash
# curl for tests/integration/test_seed_verify.py: the seeds' Verify commands are curl commands.
set -euo pipefail
if command -v curl >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends curl ca-certificates
