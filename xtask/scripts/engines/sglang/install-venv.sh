#!/usr/bin/env bash
# Idempotent: creates $SGLANG_HOME/venv with the real SGLang ($SGLANG_VERSION, default 0.5.23) and its
# tracing extra, on the CPU build of torch when download.pytorch.org is reachable, else on PyPI's torch
# (the CUDA build: it runs on CPU, but its nvidia-* wheels make the venv ~11 GB).
# PyPI's sglang-kernel is GPU-only: run-tiny-sglang.sh puts the pure-torch stand-in in shim/ first on
# PYTHONPATH (this script checks that sglang imports with it).
set -euo pipefail
D=${SGLANG_HOME:-/var/tmp/infertrace-sglang}
V=${SGLANG_VERSION:-0.5.23}
HERE=$(dirname "$(realpath "$0")")
PY=$(command -v python3)
mkdir -p "$D"; cd "$D"
check() {
  PYTHONPATH="$HERE/shim" SGLANG_USE_CPU_ENGINE=1 venv/bin/python - "$V" <<'PY'
import sys, importlib.metadata as m
assert m.version("sglang") == sys.argv[1], m.version("sglang")
import torch, sglang, sgl_kernel, opentelemetry.sdk
import sglang.srt.managers.io_struct
assert sgl_kernel.__version__.endswith("cpu-stand-in"), sgl_kernel.__file__
print("sglang", m.version("sglang"), "torch", torch.__version__)
PY
}
installed() {   # quick: package metadata only (importing sglang takes ~20 s)
  venv/bin/python - "$V" <<'PY'
import sys, importlib.metadata as m
assert m.version("sglang") == sys.argv[1]
for dist in ("torch", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc", "py-spy"):
    m.version(dist)
PY
}
if [ -x venv/bin/python ] && installed 2>/dev/null; then echo "venv ok (sglang $V)"; exit 0; fi
t0=$(date +%s)
[ -x venv/bin/python ] || "$PY" -m venv venv
venv/bin/pip install -q -U pip   # pip's own cache (~/.cache/pip) is reused across installs
mkdir -p wheels
ls wheels/sglang-"$V"-*.whl >/dev/null 2>&1 || venv/bin/pip download -q --no-deps -d wheels "sglang==$V"
CPU_INDEX=https://download.pytorch.org/whl/cpu
if curl -sf -m 10 -o /dev/null "$CPU_INDEX/torch/"; then
  # torch / torchvision / torchaudio pins from sglang's metadata; the +cpu builds satisfy them (PEP 440)
  pins=$(unzip -p wheels/sglang-"$V"-*.whl "sglang-$V.dist-info/METADATA" | sed -n 's/^Requires-Dist: //p' \
    | grep -v 'extra ==' | grep -E '^torch(vision|audio)?[ =<>;]*' | sed 's/;.*//; s/ //g' || true)
  echo "CPU torch index reachable: installing ${pins:-torch} from it"
  # shellcheck disable=SC2086
  venv/bin/pip install -q --index-url "$CPU_INDEX" ${pins:-torch}
else
  echo "$CPU_INDEX unreachable: PyPI's torch (CUDA build, runs on CPU)"
fi
venv/bin/pip install -q --find-links wheels "sglang[tracing]==$V"
# debugging and measuring tools
venv/bin/pip install -q py-spy opentelemetry-proto grpcio
check
echo "installed in $(( $(date +%s) - t0 )) s; $(du -sh venv | cut -f1) venv"
