#!/usr/bin/env bash
# Claude Code for tests/e2e/test_claude_code.py: the pinned releases from the npm registry, each
# into its own directory outside the clone, ${XDG_CACHE_HOME:-~/.cache}/homelab-frontend/claude-code/
# <version> (a fresh clone then copies no ~245 MB native binary). A no-op for a release that is
# already there.
#
# NEWEST (2.1.332) is the newest release when this was last pinned: what a new user installs today
# (claude-opus-5-5, deferred tools with ToolSearch, `<total_tokens>` system turns after tool
# results, thinking display "omitted"). OLDEST (2.1.197) is the oldest release we support: the
# newest whose `engines` still admits Node 20, the first pinned one. Since 2.1.113 the package is
# a launcher whose postinstall (node install.cjs) puts the platform's native binary (an optional
# dependency, ~245 MB on linux-x64) in place of bin/claude.exe; Node runs only that install step,
# so a release whose `engines` asks for Node 22 still runs here (npm only warns).
#
#   claude-code.sh            install every pinned release
#   claude-code.sh --versions print the pinned releases, newest first (the tests read this)
#   claude-code.sh --bin V    print where release V's `claude` is (the tests run that)
set -euo pipefail
. "$(dirname "$0")/lib/npm.sh"
NEWEST=2.1.332
OLDEST=2.1.197
VERSIONS="$NEWEST $OLDEST"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/homelab-frontend/claude-code"

bin_of() { echo "$CACHE/$1/node_modules/.bin/claude"; }

if [ "${1:-}" = "--versions" ]; then
  echo "$VERSIONS"
  exit 0
fi
if [ "${1:-}" = "--bin" ]; then
  bin_of "${2:?claude-code.sh --bin VERSION}"
  exit 0
fi

installed() {
  local bin
  bin="$(bin_of "$1")"
  # not grep -q: it may exit before claude has written all, and pipefail would take the SIGPIPE
  [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep "^$1 " >/dev/null
}

install_one() {
  local version="$1" dest="$CACHE/$1"
  local pkg="$dest/node_modules/@anthropic-ai/claude-code"
  if installed "$version"; then
    return 0
  fi
  npm_install "$dest" --include=optional "@anthropic-ai/claude-code@$version"
  # npm may hold dependency install scripts back (ignore-scripts, script approvals): then the
  # launcher is still the placeholder, and the postinstall is run here by hand.
  if ! installed "$version" && [ -f "$pkg/install.cjs" ]; then
    (cd "$pkg" && node install.cjs)
  fi
  installed "$version" || {
    echo "claude-code.sh: @anthropic-ai/claude-code@$version did not install into $dest" >&2
    echo "claude-code.sh: $(bin_of "$version") --version said: $("$(bin_of "$version")" --version 2>&1 | head -c 2000)" >&2
    exit 1
  }
  echo "claude-code.sh: installed $("$(bin_of "$version")" --version) into $dest"
}

for v in $VERSIONS; do
  install_one "$v"
done
