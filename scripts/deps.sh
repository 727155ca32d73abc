#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build kvcore, its CLI and tests.
# Idempotent: does nothing when everything is present. Needs root (or sudo) only to install.
set -euo pipefail
need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in build-essential cmake ninja-build git libgtest-dev googletest libcli11-dev nlohmann-json3-dev libdlpack-dev libomp-dev python3 libhwy-dev python3-venv libxxhash-dev pkg-config libhiredis-dev redis-server redis-tools; do
  have_pkg "$p" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
