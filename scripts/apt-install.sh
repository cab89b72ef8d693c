#!/usr/bin/env bash
# Shared by the best-effort installers (install-openblas.sh, install-chromium.sh):
# `apt_install NAME PACKAGE HINT` installs a Debian package when running as root on Linux
# with apt-get, else says why not (HINT: how to do without it). Never fatal.

apt_install() {
    local name="$1" package="$2" hint="$3"
    log() { echo "install-$name: $*"; }
    if [ "$(uname -s 2>/dev/null)" != "Linux" ]; then
        log "skipped: not Linux ($hint)"
        return 0
    fi
    if [ "$(id -u)" != "0" ]; then
        log "skipped: not root (install it with: sudo apt-get install $package)"
        return 0
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        log "skipped: no apt-get on this machine ($hint)"
        return 0
    fi
    log "installing $package with apt-get"
    if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package") >/dev/null 2>&1; then
        log "installed $package"
    else
        log "apt-get failed; $hint"
    fi
    return 0
}
