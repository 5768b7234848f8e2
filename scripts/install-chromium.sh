#!/usr/bin/env bash
# Installs Debian's chromium for the UI browser test (tests/ui/test_browser.py), once.
# Idempotent and fast when it is already there. Needs root (or sudo) and apt-get.
set -euo pipefail
if [[ -x /usr/bin/chromium ]]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: apt-get not found; install Chromium so that /usr/bin/chromium exists" \
       "(the UI browser test needs it)" >&2
  exit 1
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-chromium: run as root (or install sudo) to apt-get install chromium" >&2
    exit 1
  fi
fi
echo "installing Debian's chromium for the UI browser test (once)..." >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
test -x /usr/bin/chromium
