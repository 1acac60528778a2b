#!/usr/bin/env bash
# Record the SGLang ground-truth fixture: SGLang's own OTLP spans (--enable-trace, SGLANG_TRACE_LEVEL=3)
# + an infertrace recording + the client's view + /metrics before/after, for one run of workload.py
# (OpenAI-compatible API) and native_workload.py (/generate), on a fresh engine.
# usage: record-workload-fixture.sh OUT_DIR pickle|msgpack      (run from the repo root, as root)
#   pickle:  SGLang's default IPC encoding;  msgpack: SGLANG_USE_PICKLE_IPC=0
# env:   SGLANG_HOME (/var/tmp/infertrace-sglang)  PORT (30000)  DURATION (240: cap; the recording is
#        stopped with SIGTERM when the workload is done)  INFERTRACE (target/release/infertrace)
#        PY_OTLP (target/test-venv/bin/python: a python with grpcio + opentelemetry-proto)
#        WORKLOAD_ARGS (--quick --long-tokens 450: this tokenizer makes ~910 tokens of it; workload.py's
#        default 1000 gives 2063, over the 2048 context)  OTLP_HTTP_PORT / OTLP_GRPC_PORT (24528 / 24527)
#        ENGINE_ARGS (more arguments for SGLang, e.g. --max-running-requests 8)  NAME (the files' stem)
set -euo pipefail
OUT=$(realpath "${1:?usage: $0 OUT_DIR pickle|msgpack}"); MODE=${2:?usage: $0 OUT_DIR pickle|msgpack}
export SGLANG_HOME=${SGLANG_HOME:-/var/tmp/infertrace-sglang}
PORT=${PORT:-30000}; DURATION=${DURATION:-240}; INFERTRACE=${INFERTRACE:-target/release/infertrace}
PY_OTLP=${PY_OTLP:-target/test-venv/bin/python}
HTTP_P=${OTLP_HTTP_PORT:-24528}; GRPC_P=${OTLP_GRPC_PORT:-24527}
HERE=$(dirname "$(realpath "$0")"); VLLM_SCRIPTS="$HERE/../vllm"
case "$MODE" in
  pickle) unset SGLANG_USE_PICKLE_IPC ;;
  msgpack) export SGLANG_USE_PICKLE_IPC=0 ;;
  *) echo "mode: pickle or msgpack" >&2; exit 2 ;;
esac
cargo xtask engine sglang stop --port "$PORT"
# the version is known once the venv exists (the start installs it on first use)
SGLANG_HOME="$SGLANG_HOME" "$HERE/install-venv.sh"
VER=$("$SGLANG_HOME/venv/bin/python" -c "import importlib.metadata as m; print(m.version('sglang'))")
NAME=${NAME:-sglang-$VER-$MODE}
mkdir -p "$OUT"; P="$OUT/$NAME"; LOGS=${TMPDIR:-/tmp}/$NAME
mkdir -p "$LOGS"
rm -f "$P.rec" "$P.otlp.jsonl" "$P.client.json" "$P.metrics-before.txt" "$P.metrics-after.txt"

"$PY_OTLP" "$VLLM_SCRIPTS/otlp_receiver.py" "$P.otlp.jsonl" "$HTTP_P" "$GRPC_P" > "$LOGS/otlp-receiver.log" 2>&1 &
RECV=$!
trap 'kill $RECV 2>/dev/null || true' EXIT
sleep 2
kill -0 "$RECV" 2>/dev/null || { echo "the OTLP receiver died:"; cat "$LOGS/otlp-receiver.log"; exit 1; }
# shellcheck disable=SC2086
TRACE=1 OTLP=127.0.0.1:$GRPC_P SGLANG_TRACE_LEVEL=3 cargo xtask engine sglang start --port "$PORT" -- --enable-metrics ${ENGINE_ARGS:-}
MAIN=$(cat "$SGLANG_HOME/logs/sglang-$PORT.pid")
sleep 3
curl -sf "http://127.0.0.1:$PORT/metrics" > "$P.metrics-before.txt"
"$INFERTRACE" record --pid "$MAIN" -o "$P.rec" --duration "$DURATION" --output none > "$LOGS/record.log" 2>&1 &
REC=$!
sleep 3
# shellcheck disable=SC2086
python3 "$VLLM_SCRIPTS/workload.py" --base "http://127.0.0.1:$PORT" --model tiny --seed 0 ${WORKLOAD_ARGS---quick --long-tokens 450} \
  --out "$P.client.json" | tee "$LOGS/workload.log"
python3 "$HERE/native_workload.py" --base "http://127.0.0.1:$PORT" --merge "$P.client.json" | tee -a "$LOGS/workload.log"
sleep 2
kill -TERM "$REC"; wait "$REC" || true
curl -sf "http://127.0.0.1:$PORT/metrics" > "$P.metrics-after.txt"
sleep 7   # the last spans are exported (batch span processor)
cargo xtask engine sglang stop --port "$PORT"
sleep 1
tail -n3 "$LOGS/record.log"; ls -la "$P".*
