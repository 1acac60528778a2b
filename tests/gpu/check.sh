#!/usr/bin/env bash
# GPU check of the CUDA launch probes, on the REAL driver: run it, as root, on a machine with an
# NVIDIA GPU, its driver (libcuda.so.1) and PyTorch built for CUDA (Triton used if installed).
#
#   sudo tests/gpu/check.sh
#
# It runs tests/gpu/workload.py (eager matmuls ended by .item(), a CUDA-graph replay, a Triton
# kernel, then 20,000 tiny launches timed on the CPU) twice: alone, then under
# `infertrace attach` with JSON-lines output, and checks that launches, graph launches and
# synchronisations were all seen, with kernel names. It prints what the agent said at attach
# (probe sites and their cost, GPU metadata) and the added CPU time per launch. Exit 0: all
# checks passed.
#
# Environment: PYTHON (default python3; its torch must see the GPU), INFERTRACE (the binary;
# default: built here with cargo: a GPU machine without Rust takes one built elsewhere, e.g.
# `cargo build --release -p infertrace && strip -o gpu-bin/infertrace target/release/infertrace`
# then `INFERTRACE=gpu-bin/infertrace tests/gpu/check.sh`), OUT (where files go; default a new
# /tmp directory).
# The tests that run everywhere (no GPU) are tests/tests/cuda_probes.rs, on a driver stand-in.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d /tmp/infertrace-gpu-check.XXXXXX)}
mkdir -p "$OUT"
say() { printf '[gpu-check] %s\n' "$*"; }
fail() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || fail "run as root (the agent loads eBPF programs)"
if [ -z "${INFERTRACE:-}" ]; then
  command -v cargo >/dev/null || fail "no cargo here: build the agent elsewhere and set INFERTRACE (see the top of this script)"
  cargo build --release -p infertrace >&2
  INFERTRACE=target/release/infertrace
fi
[ -x "$INFERTRACE" ] || fail "INFERTRACE=$INFERTRACE is not an executable"
say "kernel $(uname -r); what this host supports (infertrace doctor):"
"$INFERTRACE" doctor 2>&1 | sed 's/^/    /' || true
command -v nvidia-smi >/dev/null && nvidia-smi -L || say "nvidia-smi not found (continuing)"
"$PYTHON" -c 'import torch; assert torch.cuda.is_available(); print("torch", torch.__version__, "cuda", torch.version.cuda)' \
  || fail "$PYTHON has no PyTorch that sees a CUDA device"

# Wait until FILE contains TEXT (seconds: $3).
wait_for() {
  local file=$1 text=$2 left=$(( $3 * 10 ))
  until grep -q "$text" "$file" 2>/dev/null; do
    left=$((left - 1))
    [ "$left" -gt 0 ] || return 1
    sleep 0.1
  done
}

# Run the workload once; $1 = plain | traced.
run_workload() {
  local mode=$1 fifo="$OUT/go.$1" agent=""
  rm -f "$fifo"; mkfifo "$fifo"
  "$PYTHON" tests/gpu/workload.py <"$fifo" >"$OUT/workload.$mode.out" 2>"$OUT/workload.$mode.err" &
  local pid=$!
  exec 3>"$fifo"
  wait_for "$OUT/workload.$mode.out" ready 180 || fail "workload never got ready: $(cat "$OUT/workload.$mode.err")"
  if [ "$mode" = traced ]; then
    INFERTRACE_LOG=info NO_COLOR=1 "$INFERTRACE" attach --pid "$pid" --output "jsonl:$OUT/out.jsonl" \
      2>"$OUT/agent.log" &
    agent=$!
    # Probed, or the agent gave up (no eBPF on this kernel, say): no need to wait out the limit.
    local left=600
    until grep -q 'probes on' "$OUT/agent.log" 2>/dev/null; do
      kill -0 "$agent" 2>/dev/null || fail "the agent stopped before probing libcuda: $(cat "$OUT/agent.log")"
      left=$((left - 1))
      [ "$left" -gt 0 ] || fail "the agent never probed libcuda in 60 s: $(cat "$OUT/agent.log")"
      sleep 0.1
    done
  fi
  echo go >&3
  exec 3>&-
  wait "$pid" || fail "workload failed: $(cat "$OUT/workload.$mode.err")"
  if [ -n "$agent" ]; then
    # The agent stops by itself once the traced process has exited.
    for _ in $(seq 100); do kill -0 "$agent" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$agent" 2>/dev/null && { kill -INT "$agent"; sleep 2; }
    wait "$agent" || fail "the agent failed: $(cat "$OUT/agent.log")"
  fi
}

say "files in $OUT"
run_workload plain
run_workload traced
say "what the agent said about the driver and the GPU:"
grep -E 'CUDA|GPU|NVML' "$OUT/agent.log" | sed 's/^/    /' || true

"$PYTHON" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
plain = json.loads(open(f"{out}/workload.plain.out").read().split("\n")[1])
traced = json.loads(open(f"{out}/workload.traced.out").read().split("\n")[1])
lines = [json.loads(l) for l in open(f"{out}/out.jsonl")]
steps = [l for l in lines if l["type"] == "cuda_step"]
launches = sum(s["kernel_launches"] for s in steps)
graphs = sum(s["graph_launches"] for s in steps)
ended_by = {}
for s in steps:
    ended_by[s["ended_by"]] = ended_by.get(s["ended_by"], 0) + 1
names = {}
for s in steps:
    for k in s["kernels"]:
        if k.get("name"):
            names[k["name"]] = names.get(k["name"], 0) + k["launches"]
top = sorted(names.items(), key=lambda kv: -kv[1])[:10]
print(f"[gpu-check] device: {traced['device']}")
print(f"[gpu-check] {len(steps)} steps, {launches} kernel launches, {graphs} graph launches; ended by {ended_by}")
print(f"[gpu-check] top named kernels: {top}")
print(f"[gpu-check] CPU time per tiny launch: {plain['launch_ns']:.0f} ns alone, {traced['launch_ns']:.0f} ns traced: "
      f"+{traced['launch_ns'] - plain['launch_ns']:.0f} ns per probed launch")
problems = []
if launches < traced["launches"] + traced["steps"] * 3:
    problems.append(f"expected at least {traced['launches'] + traced['steps'] * 3} kernel launches, saw {launches}")
if graphs < traced["replays"]:
    problems.append(f"expected at least {traced['replays']} graph launches, saw {graphs}")
if not any(k in ended_by for k in ("cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize")):
    problems.append("no step ended by a synchronisation")
if ended_by.get("cuStreamSynchronize", 0) < traced["steps"]:
    problems.append(f"expected {traced['steps']} steps ended by cuStreamSynchronize (.item()), saw {ended_by}")
if not names:
    problems.append("no kernel was named")
if traced.get("triton_error"):
    print(f"[gpu-check] Triton could not run here (not checked): {traced['triton_error']}")
# Triton names the kernel after its function; some versions add a suffix.
if traced["triton"] and not any(n.startswith("infertrace_check_add") for n in names):
    problems.append("the Triton kernel infertrace_check_add was not named")
for p in problems:
    print(f"[gpu-check] FAILED: {p}")
sys.exit(1 if problems else 0)
PY
say "all checks passed"
