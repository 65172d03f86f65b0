#!/usr/bin/env bash
# Debian's chromium and its chromedriver for tests/integration/test_dashboard_browser.py (driven by
# Selenium, a Python test extra in pyproject.toml). A no-op when both are already installed.
# Debian's own packages: no browser download at run time, works offline.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
apt-get update
apt-get install -y --no-install-recommends chromium chromium-driver
