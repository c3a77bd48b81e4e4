#!/usr/bin/env bash
# Installs what the tests need when it is missing: Debian packages through
# apt-get (as root, or with sudo) and Go modules. Safe to run repeatedly.
set -euo pipefail

need_pkgs=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need_pkgs+=(mosquitto)
command -v mosquitto_sub >/dev/null 2>&1 || need_pkgs+=(mosquitto-clients)

if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "ensure-deps: installing ${need_pkgs[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
fi

# The Debian package starts a system-wide mosquitto on :1883 on some
# machines; tests never use it (they start their own on free ports), but it
# would keep `make run` from binding :1883.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet mosquitto 2>/dev/null; then
  systemctl stop mosquitto || true
fi

go mod download
