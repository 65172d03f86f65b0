#!/usr/bin/env bash
# The official Ollama JavaScript library (npm `ollama`) for tests/integration/test_ollama_js.py:
# the pinned release from the npm registry into a cache directory outside the clone,
# ${XDG_CACHE_HOME:-~/.cache}/homelab-frontend/ollama-js/<version>. A no-op (well under a second)
# when that release is already there.
#
#   ollama-js.sh          install the pinned release
#   ollama-js.sh --dir    print the directory it goes to (the test reads this)
set -euo pipefail
. "$(dirname "$0")/lib/npm.sh"
VERSION=0.6.4
DEST="${XDG_CACHE_HOME:-$HOME/.cache}/homelab-frontend/ollama-js/$VERSION"

if [ "${1:-}" = "--dir" ]; then
  echo "$DEST"
  exit 0
fi

installed() {
  [ -f "$DEST/node_modules/ollama/package.json" ] &&
    grep -q "\"version\": \"$VERSION\"" "$DEST/node_modules/ollama/package.json"
}

if installed; then
  exit 0
fi
npm_install "$DEST" "ollama@$VERSION"
installed || {
  echo "ollama-js.sh: ollama@$VERSION did not install into $DEST" >&2
  exit 1
}
echo "ollama-js.sh: installed ollama@$VERSION into $DEST"
