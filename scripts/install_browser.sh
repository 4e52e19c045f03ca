#!/usr/bin/env bash
# Idempotent: installs Debian's chromium for the chat-page browser test (tests/server/), only
# when /usr/bin/chromium is missing. Needs root (or sudo) and the package index; the browser
# test skips with a clear reason when this cannot succeed.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo -n"
    else
        echo "install_browser.sh: not root and no sudo; cannot install chromium" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
test -x /usr/bin/chromium
