#!/usr/bin/env bash
# Best-effort installer for the headless Chromium the web page's browser tests drive
# (tests/plugins/ui; Playwright for Python is pointed at it, no browser download).
# Idempotent and never fatal: it always exits 0, and the browser tests skip with a message
# where there is no Chromium. Installs Debian's chromium when running as root with apt-get.
# MLXCORE_SKIP_CHROMIUM=1 skips it.

log() { echo "install-chromium: $*"; }

if [ "${MLXCORE_SKIP_CHROMIUM:-0}" = "1" ]; then
    log "skipped: MLXCORE_SKIP_CHROMIUM=1"
    exit 0
fi
for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
        log "already installed: $(command -v "$name")"
        exit 0
    fi
done
if [ "$(uname -s 2>/dev/null)" != "Linux" ]; then
    log "skipped: not Linux (set MLXCORE_CHROMIUM to a Chromium or Chrome binary to run the browser tests)"
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    log "skipped: not root (install it with: sudo apt-get install chromium)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    log "skipped: no apt-get on this machine (the browser tests will be skipped)"
    exit 0
fi

log "installing chromium with apt-get"
if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1; then
    log "installed chromium"
else
    log "apt-get failed; the browser tests will be skipped"
fi
exit 0
