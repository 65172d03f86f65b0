#!/usr/bin/env bash
# Debian's nginx (nginx-light) and Caddy for tests/integration/test_reverse_proxy.py: the gateway
# behind a real reverse proxy (the test writes its own config in a tmp dir and runs the proxy in
# the foreground on a free port). A no-op when both are installed. Debian's packages only.
# Installing must not start either as a service: where no policy-rc.d already says so, one is put
# in place for the install and taken out after it.
set -euo pipefail
if command -v nginx >/dev/null 2>&1 && command -v caddy >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
  trap '[ "$own_policy" = 1 ] && rm -f "$policy"' EXIT
fi
apt-get update
apt-get install -y --no-install-recommends nginx-light caddy
