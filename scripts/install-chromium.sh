#!/usr/bin/env bash
# Best-effort installer for the headless Chromium the web page's browser tests drive
# (tests/plugins/ui; Playwright for Python is pointed at it, no browser download).
# Idempotent and never fatal: it always exits 0, and the browser tests skip with a message
# where there is no Chromium. Installs Debian's chromium when running as root with apt-get.
# MLXCORE_SKIP_CHROMIUM=1 skips it.

if [ "${MLXCORE_SKIP_CHROMIUM:-0}" = "1" ]; then
    echo "install-chromium: skipped: MLXCORE_SKIP_CHROMIUM=1"
    exit 0
fi
for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
        echo "install-chromium: already installed: $(command -v "$name")"
        exit 0
    fi
done
source "$(dirname "$0")/apt-install.sh"
apt_install chromium chromium "the browser tests will be skipped; MLXCORE_CHROMIUM=PATH names another Chromium or Chrome"
exit 0
