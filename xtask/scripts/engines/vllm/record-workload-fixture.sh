#!/usr/bin/env bash
# Record the vLLM ground-truth fixture: vLLM's own OTLP spans + an infertrace recording + the
# client's view + /metrics before/after, for one run of workload.py, on a fresh engine (so the
# prefix cache is empty and the counters start at zero).
# usage: record-workload-fixture.sh OUT_DIR [NAME]      (run from the repo root, as root)
# env:   VLLM_HOME (/var/tmp/infertrace-vllm)  PORT (8000)  KV_BLOCKS (18)  DURATION (60)
#        INFERTRACE (target/release/infertrace)
set -euo pipefail
OUT=$(realpath "${1:?usage: $0 OUT_DIR [NAME]}"); NAME=${2:-vllm-0.32.0-workload}
export VLLM_HOME=${VLLM_HOME:-/var/tmp/infertrace-vllm}
PORT=${PORT:-8000}; DURATION=${DURATION:-60}; INFERTRACE=${INFERTRACE:-target/release/infertrace}
export KV_BLOCKS=${KV_BLOCKS:-18}
HERE=$(dirname "$(realpath "$0")")
mkdir -p "$OUT"; P="$OUT/$NAME"
rm -f "$P.rec" "$P.otlp.jsonl" "$P.client.json" "$P.metrics-before.txt" "$P.metrics-after.txt"

cargo xtask engine vllm stop --port "$PORT"
"$VLLM_HOME/venv/bin/python" "$HERE/otlp_receiver.py" "$P.otlp.jsonl" 14318 14317 > "$OUT/otlp-receiver.log" 2>&1 &
RECV=$!
trap 'kill $RECV 2>/dev/null || true' EXIT
sleep 2
cargo xtask engine vllm start --port "$PORT" -- \
  --otlp-traces-endpoint http://127.0.0.1:14317 --max-num-seqs 4 --max-num-batched-tokens 256
API=$(cat "$VLLM_HOME/logs/vllm-$PORT.pid")
sleep 6   # vLLM's start-up spans are exported (batch processor, 5 s)

curl -sf "http://127.0.0.1:$PORT/metrics" > "$P.metrics-before.txt"
"$INFERTRACE" record --pid "$API" -o "$P.rec" --duration "$DURATION" > "${TMPDIR:-/tmp}/$NAME.record.log" 2>&1 &
REC=$!
sleep 3
python3 "$HERE/workload.py" --base "http://127.0.0.1:$PORT" --model tiny --seed 0 --out "$P.client.json"
wait $REC
curl -sf "http://127.0.0.1:$PORT/metrics" > "$P.metrics-after.txt"
sleep 6   # the last llm_request spans are exported
cargo xtask engine vllm stop --port "$PORT"
sleep 1

python3 - "$P" <<'PY'
import json, re, sys
p = sys.argv[1]
spans = [json.loads(l) for l in open(p + ".otlp.jsonl")]
llm = [s for s in spans if s["name"] == "llm_request"]
client = json.load(open(p + ".client.json"))
def metric(f, name):
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", open(f).read(), re.M))
d = {k: metric(p + ".metrics-after.txt", k) - metric(p + ".metrics-before.txt", k) for k in
     ("vllm:num_preemptions_total", "vllm:request_success_total", "vllm:request_queue_time_seconds_sum",
      "vllm:request_prefill_time_seconds_count")}
print(json.dumps({"client": client["counts"], "llm_request_spans": len(llm), "metrics_delta": d}, indent=1))
PY
tail -n1 "${TMPDIR:-/tmp}/$NAME.record.log"; ls -la "$OUT"
