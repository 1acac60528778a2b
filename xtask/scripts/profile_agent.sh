#!/usr/bin/env bash
# Where the agent's and the kernel programs' time goes during one traced load (BENCHMARKS.md,
# "The agent's cost, measured and cut"). As root, with the engine started by
# `cargo xtask engine <vllm|sglang> start --port PORT -- <no prefix cache flag>`:
#
#   ENGINE=vllm PORT=18472 [PERF=1] [FREQ=499] [N=256] [WARMUP=0] [AGENT_FLAGS=...] \
#     xtask/scripts/profile_agent.sh [BIN]
#
# Attaches BIN (default target/release/infertrace) with --output none (and AGENT_FLAGS), waits for it to settle,
# runs the engine's own serving benchmark (N streamed requests, 256 tokens in, 64 out) and
# prints the agent's CPU per request over the load's window and during the benchmark itself (as
# `cargo xtask bench-overhead` counts it: its idle rate, measured for 5 s before, left out over
# the client's start and exit), the API server's CPU, and the runs and
# time of each kernel program (kernel.bpf_stats_enabled). WARMUP=M first runs a load of M
# requests with the agent attached, not measured: what an agent that has run a while costs
# (the Python code objects and stacks it names once are named by then). PERF=1 also records the agent with
# `perf record --call-graph dwarf` into /tmp/infertrace-profile/perf.data.
set -euo pipefail
ENGINE=${ENGINE:-vllm}; PORT=${PORT:-18472}; N=${N:-256}; PERF=${PERF:-0}; FREQ=${FREQ:-499}
WARMUP=${WARMUP:-0}
AGENT=${1:-target/release/infertrace}
for tool in bpftool perf; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install bpftool linux-perf" >&2; exit 1; }
done
HOME_DIR=/var/tmp/infertrace-$ENGINE
OUT=/tmp/infertrace-profile
mkdir -p "$OUT"
PID=$(cat "$HOME_DIR/logs/$ENGINE-$PORT.pid")
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The agent's CPU in nanoseconds (its threads' run time; they live as long as it does): its
# 10 ms ticks were +-15 % of a 256-request load's 0.06-0.09 s.
cpu_ns() { cat /proc/"$1"/task/*/schedstat | awk '{ns += $1} END {printf "%.0f\n", ns}'; }
# Offline, as bench-overhead runs the clients: without it each client waits tens of seconds
# for the model hub, which this machine cannot reach, inside the measured window.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
serve() {
  local n=${1:-$N}
  local common=(--model tiny --tokenizer "$HOME_DIR/tiny-llama" --base-url "http://127.0.0.1:$PORT"
    --random-input-len 256 --random-output-len 64 --num-prompts "$n" --seed 1 --disable-tqdm)
  if [ "$ENGINE" = vllm ]; then
    "$HOME_DIR/venv/bin/vllm" bench serve --backend vllm --ignore-eos --dataset-name random "${common[@]}"
  else
    "$HOME_DIR/venv/bin/python" -m sglang.bench_serving --backend sglang-oai --random-range-ratio 1 \
      --output-file "$OUT/bench.jsonl" \
      --dataset-name random-ids "${common[@]}"
  fi 2>&1 | grep -E 'Benchmark duration|Output token throughput|Mean TTFT'
}
prog_stats() {
  bpftool prog show -j | python3 -c 'import json, sys
for p in json.load(sys.stdin):
    print(p["id"], p.get("run_time_ns", 0), p.get("run_cnt", 0), p.get("name", "?"))'
}
sysctl -qw kernel.bpf_stats_enabled=1
# shellcheck disable=SC2086 # AGENT_FLAGS is a list of flags.
INFERTRACE_LOG=warn "$AGENT" attach --pid "$PID" --output none ${AGENT_FLAGS:-} 2>"$OUT/agent.err" &
AGENT_PID=$!
# The agent is stopped whatever happens below (it holds the caller's stdout).
trap 'kill -TERM $AGENT_PID 2>/dev/null || true' EXIT
sleep 4
if [ "$WARMUP" -gt 0 ]; then serve "$WARMUP" >/dev/null; fi
# The attached agent's CPU while the engine is idle (its timers, Python sampling): the
# measured window below also holds the benchmark client's start, some 13 s for SGLang's here.
IDLE_S=5
i0=$(cpu_ns $AGENT_PID); sleep $IDLE_S; i1=$(cpu_ns $AGENT_PID)
prog_stats | sort >"$OUT/before"
a0=$(cpu_ns $AGENT_PID); s0=$(cpu_ticks "$PID"); t0=$(date +%s.%N)
if [ "$PERF" = 1 ]; then
  perf record -F "$FREQ" --call-graph dwarf,16384 -o "$OUT/perf.data" -p $AGENT_PID 2>/dev/null &
  PERF_PID=$!
fi
serve | tee "$OUT/serve.txt"
a1=$(cpu_ns $AGENT_PID); s1=$(cpu_ticks "$PID"); t1=$(date +%s.%N)
if [ "$PERF" = 1 ]; then kill -INT $PERF_PID; wait $PERF_PID || true; fi
prog_stats | sort >"$OUT/after"
kill -TERM $AGENT_PID; wait $AGENT_PID || true
sysctl -qw kernel.bpf_stats_enabled=0
bench_s=$(awk '/Benchmark duration/ {print $NF}' "$OUT/serve.txt")
python3 - "$a0" "$a1" "$s0" "$s1" "$t0" "$t1" "$N" "$(getconf CLK_TCK)" "$i0" "$i1" "$IDLE_S" "${bench_s:-nan}" <<'PY'
import sys
a0, a1, s0, s1, t0, t1, n, tck, i0, i1, idle_s, bench_s = map(float, sys.argv[1:])
agent = (a1 - a0) / 1e9
idle = (i1 - i0) / 1e9 / idle_s
print(f"load {t1 - t0:.1f} s; agent {agent:.3f} s of CPU = {agent / n * 1000:.3f} ms per request; "
      f"API server {(s1 - s0) / tck:.2f} s of CPU")
# As bench-overhead's load_cpu_seconds (xtask/src/bench_engine.rs).
outside = max(t1 - t0 - bench_s, 0.0)
during = max(agent - idle * outside, 0.0)
print(f"agent idle {idle * 1e6:.0f} us of CPU per second; during the benchmark ({bench_s:.1f} s, "
      f"its idle rate left out over the other {outside:.1f} s): {during / n * 1000:.3f} ms per request")
PY
echo "kernel programs (all processes):"
join "$OUT/before" "$OUT/after" | awk '{ms = ($5 - $2) / 1e6; runs = $6 - $3;
  if (runs > 0) printf "  %s: %d runs, %.2f us per run, %.1f ms\n", $4, runs, ms * 1000 / runs, ms}'
tail -1 "$OUT/agent.err"
