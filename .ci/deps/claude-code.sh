#!/usr/bin/env bash
# Claude Code for tests/e2e/test_claude_code.py: one pinned release from the npm registry into
# the project-local, gitignored .cache/claude-code. A no-op when that release is already there.
#
# Why 2.1.197: it is the newest release whose `engines` admits the machine's Node 20 (>= 18; from
# 2.1.198 on it is >= 22), and it sends what current Claude Code sends (claude-opus-4-8 with
# max_tokens 64000, `role: system` inside `messages`, adaptive thinking, effort, context
# management). Since 2.1.113 the package is a launcher whose postinstall (node install.cjs) puts
# the platform's native binary (an optional dependency, ~245 MB on linux-x64) in place of
# bin/claude.exe; Node runs only that install step.
set -euo pipefail
VERSION=2.1.197
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DEST="$ROOT/.cache/claude-code"
PKG="$DEST/node_modules/@anthropic-ai/claude-code"
BIN="$DEST/node_modules/.bin/claude"

installed() {
  [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q "^$VERSION "
}

if installed; then
  exit 0
fi

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get update
  apt-get install -y --no-install-recommends nodejs npm
fi

mkdir -p "$DEST"
npm install --prefix "$DEST" --no-save --no-audit --no-fund --include=optional \
  "@anthropic-ai/claude-code@$VERSION"
# npm may hold dependency install scripts back (ignore-scripts, script approvals): then the
# launcher is still the placeholder, and the postinstall is run here by hand.
if ! installed && [ -f "$PKG/install.cjs" ]; then
  (cd "$PKG" && node install.cjs)
fi
installed || { echo "claude-code.sh: @anthropic-ai/claude-code@$VERSION did not install into $DEST" >&2; exit 1; }
echo "claude-code.sh: installed $("$BIN" --version) into $DEST"
