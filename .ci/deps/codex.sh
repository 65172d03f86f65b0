#!/usr/bin/env bash
# Codex CLI for tests/e2e/test_codex.py: one pinned release from the npm registry into a cache
# directory outside the clone, ${XDG_CACHE_HOME:-~/.cache}/homelab-frontend/codex/<version>.
# A no-op when that release is already there.
#
#   codex.sh        install the pinned release
#   codex.sh --bin  print where its `codex` is (the test runs that)
#
# Why 0.171.0: the newest release when the Responses surface was built (it speaks only the
# Responses API). The npm package is a small Node launcher (engines: node >= 16, so Node 20 is
# fine); the platform's native binary comes as an optional dependency aliased to
# `@openai/codex@<version>-<platform>`, so --include=optional is required.
set -euo pipefail
. "$(dirname "$0")/lib/npm.sh"
VERSION=0.171.0
DEST="${XDG_CACHE_HOME:-$HOME/.cache}/homelab-frontend/codex/$VERSION"
BIN="$DEST/node_modules/.bin/codex"

if [ "${1:-}" = "--bin" ]; then
  echo "$BIN"
  exit 0
fi

installed() {
  [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep " $VERSION\$" >/dev/null  # not -q: see claude-code.sh
}

if installed; then
  exit 0
fi

npm_install "$DEST" --include=optional "@openai/codex@$VERSION"
installed || { echo "codex.sh: @openai/codex@$VERSION did not install into $DEST" >&2; exit 1; }
echo "codex.sh: installed $("$BIN" --version) into $DEST"
