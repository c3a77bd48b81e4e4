#!/usr/bin/env bash
# Installs what the tests need when it is missing: Debian packages through
# apt-get (as root, or with sudo) and Go modules. Safe to run repeatedly.
set -euo pipefail

need_pkgs=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need_pkgs+=(mosquitto)
command -v mosquitto_sub >/dev/null 2>&1 || need_pkgs+=(mosquitto-clients)
[ -x /usr/bin/chromium ] || need_pkgs+=(chromium) # dashboard browser test (chromedp)
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need_pkgs+=(rabbitmq-server)
# Interop tests (broker/interop_clients_test.go): Python paho members run on
# Debian's own Python; MQTT.js members need node and npm.
/usr/bin/python3 -c 'import paho.mqtt.client' >/dev/null 2>&1 || need_pkgs+=(python3-paho-mqtt)
command -v node >/dev/null 2>&1 || need_pkgs+=(nodejs npm)

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

# Likewise the package's system-wide RabbitMQ (:5672, :25672) is never used:
# tests start their own nodes (internal/rabbitharness). Stop and disable it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet rabbitmq-server 2>/dev/null; then
  systemctl stop rabbitmq-server || true
  systemctl disable rabbitmq-server >/dev/null 2>&1 || true
elif command -v update-rc.d >/dev/null 2>&1 && [ -e /etc/init.d/rabbitmq-server ]; then
  update-rc.d rabbitmq-server disable >/dev/null 2>&1 || true
fi

# MQTT.js for the interop tests, pinned by the committed package-lock.json,
# into a git-ignored node_modules beside it; reinstalled when the lock changes.
interop_dir="$(cd "$(dirname "$0")/.." && pwd)/broker/testdata/interop"
if [ ! -f "$interop_dir/node_modules/.package-lock.json" ] ||
  [ "$interop_dir/package-lock.json" -nt "$interop_dir/node_modules/.package-lock.json" ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "ensure-deps: installing MQTT.js into $interop_dir/node_modules"
    npm ci --prefix "$interop_dir" --no-audit --no-fund --loglevel=error
  else
    echo "ensure-deps: npm not found; the MQTT.js interop tests cannot run" >&2
  fi
fi

go mod download
