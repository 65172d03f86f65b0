# Sourced by the .ci/deps scripts that install a pinned npm package (not run by `make deps`, whose
# glob is .ci/deps/*.sh). Each script keeps its own `installed` check and messages; this is the
# install step they all share.

# npm_install DEST [npm install arguments...]: Node and npm from Debian when the machine has none,
# then the packages into DEST/node_modules without touching any package.json or lock file.
npm_install() {
  local dest="$1"
  shift
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    apt-get update
    apt-get install -y --no-install-recommends nodejs npm
  fi
  mkdir -p "$dest"
  npm install --prefix "$dest" --no-save --no-audit --no-fund "$@"
}
