#!/usr/bin/env bash
# Reusable, idempotent: (1) venv with the real SGLang (install-venv.sh), (2) tiny local Llama model,
# (3) start `python -m sglang.launch_server` on CPU on 127.0.0.1:$PORT in the background.
# usage: run-tiny-sglang.sh [extra sglang args...]      e.g. --enable-metrics
# env:   SGLANG_HOME (/var/tmp/infertrace-sglang)  PORT (30000)  WAIT_S (300)
#        MAX_TOTAL_TOKENS (4096: the KV cache, in tokens; small values force retraction)
#        TRACE=1: SGLang's own tracing (--enable-trace) to the OTLP gRPC endpoint $OTLP
#        (default 127.0.0.1:24317; start otlp_receiver.py there first), SGLANG_TRACE_LEVEL (3)
#        FOREGROUND=1: exec in the foreground instead of background + wait
#        WRAPPER: a command the server is started under (e.g. "in-pod.sh CGROUP_DIR", as a pod's
#        container); the pid file then holds the main process's own pid (the wrapper's child)
# The main process (uvicorn + TokenizerManager) pid goes to $SGLANG_HOME/logs/sglang-$PORT.pid, its log
# next to it; its children are `sglang::scheduler` and `sglang::detokenizer`. SIGTERM to the main
# process tears the children down.
set -euo pipefail
D=${SGLANG_HOME:-/var/tmp/infertrace-sglang}; PORT=${PORT:-30000}; WAIT_S=${WAIT_S:-300}
HERE=$(dirname "$(realpath "$0")")
mkdir -p "$D/logs"; cd "$D"

# ---- step 1: venv ---------------------------------------------------------
SGLANG_HOME="$D" "$HERE/install-venv.sh"

# ---- step 2: tiny model (config + locally trained tokenizer, no hub) ------
[ -f tiny-llama/config.json ] && [ -f tiny-llama/tokenizer.json ] || venv/bin/python "$HERE/make_tiny_model.py" "$D/tiny-llama"

# ---- step 3: serve --------------------------------------------------------
if curl -sf -m 5 "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then echo "something already serves on :$PORT"; exit 1; fi
export SGLANG_USE_CPU_ENGINE=1            # without it sglang takes the CUDA code paths
export PYTHONPATH="$HERE/shim${PYTHONPATH:+:$PYTHONPATH}"   # pure-torch stand-in for the CPU sgl-kernel build
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1
export SGLANG_TRACE_LEVEL=${SGLANG_TRACE_LEVEL:-3}
# keep side files under $D: ZeroMQ ipc:// socket files (tempfile -> $TMPDIR; stale ones are left behind on
# shutdown), torch/triton caches
rm -rf "$D/tmp/$PORT"; mkdir -p "$D/tmp/$PORT" "$D/cache"
export TMPDIR="$D/tmp/$PORT" TORCHINDUCTOR_CACHE_DIR="$D/cache/inductor" TRITON_CACHE_DIR="$D/cache/triton"
extra=()
if [ "${TRACE:-0}" = 1 ]; then extra+=(--enable-trace --otlp-traces-endpoint "${OTLP:-127.0.0.1:24317}"); fi
ARGS=(-m sglang.launch_server --model-path "$D/tiny-llama" --served-model-name tiny
      --load-format dummy --dtype bfloat16 --device cpu --attention-backend torch_native
      --disable-cuda-graph --mem-fraction-static 0.05 --max-total-tokens "${MAX_TOTAL_TOKENS:-4096}"
      --max-running-requests 16 --skip-server-warmup --sleep-on-idle --host 127.0.0.1 --port "$PORT"
      "${extra[@]}" "$@")
if [ "${FOREGROUND:-0}" = 1 ]; then exec venv/bin/python "${ARGS[@]}"; fi
LOG="$D/logs/sglang-$PORT.log"
t0=$(date +%s)
# shellcheck disable=SC2086 # WRAPPER is a command and its arguments
nohup ${WRAPPER:-} venv/bin/python "${ARGS[@]}" > "$LOG" 2>&1 &
PID=$!; echo $PID > "$D/logs/sglang-$PORT.pid"
for _ in $(seq 1 "$WAIT_S"); do
  if curl -sf -m 5 "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
    if [ -n "${WRAPPER:-}" ]; then PID=$(pgrep -P "$PID" | head -1); echo "$PID" > "$D/logs/sglang-$PORT.pid"; fi
    echo "sglang up: pid=$PID port=$PORT startup=$(( $(date +%s) - t0 ))s log=$LOG"
    KIDS=$(pgrep -P "$PID" | paste -sd, || true)
    ps -o pid,ppid,rss,nlwp,args -p "$PID${KIDS:+,$KIDS}" | cut -c1-120
    exit 0
  fi
  kill -0 "$PID" 2>/dev/null || { echo "sglang died; tail of $LOG:"; tail -30 "$LOG"; exit 1; }
  sleep 1
done
echo "timeout waiting for sglang (pid $PID)"; exit 1
