#!/usr/bin/env bash
# Best-effort installer for the system OpenBLAS that mlxcore preloads under MLX's CPU backend
# (see core/src/mlxcore/blas.py). Idempotent and never fatal: it always exits 0.
# Installs Debian's libopenblas0 when running as root on a Linux machine with apt-get.

log() { echo "install-openblas: $*"; }

if [ "$(uname -s 2>/dev/null)" != "Linux" ]; then
    log "skipped: not Linux (MLX uses Accelerate on macOS)"
    exit 0
fi

for lib in /usr/lib/*-linux-gnu/libopenblas.so.0 /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 \
           /usr/lib64/libopenblas.so.0 /usr/lib64/libopenblasp.so.0; do
    if [ -e "$lib" ]; then
        log "already installed: $lib"
        exit 0
    fi
done

if [ "$(id -u)" != "0" ]; then
    log "skipped: not root (install it with: sudo apt-get install libopenblas0)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    log "skipped: no apt-get on this machine (install OpenBLAS with your package manager)"
    exit 0
fi

log "installing libopenblas0 with apt-get"
if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas0) >/dev/null 2>&1; then
    log "installed libopenblas0"
else
    log "apt-get failed; continuing without OpenBLAS (float32 matmul will be slower)"
fi
exit 0
