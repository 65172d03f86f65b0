#!/usr/bin/env bash
# Gemini CLI for tests/e2e/test_gemini_cli.py: one pinned release from the npm registry into a
# cache directory outside the clone, ${XDG_CACHE_HOME:-~/.cache}/homelab-frontend/gemini-cli/
# <version>. A no-op when that release is already there.
#
#   gemini-cli.sh        install the pinned release
#   gemini-cli.sh --bin  print where its `gemini` is (the test runs that)
#
# Why 0.61.0: the newest release when the Gemini surface was built (it speaks only Google's
# Gemini API; GOOGLE_GEMINI_BASE_URL moves it to the gateway). engines: node >= 20.
set -euo pipefail
. "$(dirname "$0")/lib/npm.sh"
VERSION=0.61.0
DEST="${XDG_CACHE_HOME:-$HOME/.cache}/homelab-frontend/gemini-cli/$VERSION"
BIN="$DEST/node_modules/.bin/gemini"

if [ "${1:-}" = "--bin" ]; then
  echo "$BIN"
  exit 0
fi

installed() {
  [ -x "$BIN" ] && grep -q "\"version\": \"$VERSION\"" "$DEST/node_modules/@google/gemini-cli/package.json" 2>/dev/null
}

if installed; then
  exit 0
fi

npm_install "$DEST" "@google/gemini-cli@$VERSION"
installed || { echo "gemini-cli.sh: @google/gemini-cli@$VERSION did not install into $DEST" >&2; exit 1; }
echo "gemini-cli.sh: installed @google/gemini-cli $VERSION into $DEST"
