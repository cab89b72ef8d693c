#!/usr/bin/env bash
# Best-effort installer for the system OpenBLAS that mlxcore preloads under MLX's CPU backend
# (see core/src/mlxcore/blas.py). Idempotent and never fatal: it always exits 0.
# Installs Debian's libopenblas0 when running as root on a Linux machine with apt-get.

for lib in /usr/lib/*-linux-gnu/libopenblas.so.0 /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 \
           /usr/lib64/libopenblas.so.0 /usr/lib64/libopenblasp.so.0; do
    if [ -e "$lib" ]; then
        echo "install-openblas: already installed: $lib"
        exit 0
    fi
done
source "$(dirname "$0")/apt-install.sh"
apt_install openblas libopenblas0 "continuing without OpenBLAS: float32 matmul will be slower; MLX uses Accelerate on macOS"
exit 0
