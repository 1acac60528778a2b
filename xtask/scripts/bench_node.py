"""The node agent's own cost (BENCHMARKS.md, "Node agent"): `infertrace run` started first,
then measured idle with no engine, with a real vLLM and a real SGLang idle, and under load;
and how soon after a server's exec it is traced.

usage (as root, engines installed by `cargo xtask engine ... start` once):
  python3 xtask/scripts/bench_node.py BIN [--seconds 20] [--requests 64] [--attach]

--attach: the same load under `infertrace attach --pid <vLLM> --pid <SGLang>` (started after
the engines), to compare node mode's cost with attach's.

Prints one line per figure. CPU is the agent's utime+stime over the window (/proc/PID/stat),
memory its VmRSS at the end of the window and VmHWM (peak) at the end of the run.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
TICK = os.sysconf("SC_CLK_TCK")
VLLM_PORT, SGLANG_PORT = 18495, 18497


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_kib(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def window(pid, seconds, what, action=None):
    """The agent's CPU over `seconds` (or over `action`), and its RSS after."""
    t0, c0 = time.time(), cpu_seconds(pid)
    result = action() if action else time.sleep(seconds)
    dt, dc = time.time() - t0, cpu_seconds(pid) - c0
    rss = status_kib(pid, "VmRSS") / 1024
    print(f"{what}: agent CPU {dc:.3f} s over {dt:.1f} s ({100 * dc / dt:.2f} % of a core), "
          f"RSS {rss:.1f} MiB", flush=True)
    return dc, result


def engine(kind, port, *args):
    subprocess.run(["cargo", "xtask", "engine", kind, "stop", "--port", str(port)], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cargo", "xtask", "engine", kind, "start", "--port", str(port), "--", *args],
                   check=True, stdout=subprocess.DEVNULL)
    home = os.environ.get(f"{kind.upper()}_HOME", f"/var/tmp/infertrace-{kind}")
    return int(open(f"{home}/logs/{kind}-{port}.pid").read())


def stop(kind, port):
    subprocess.run(["cargo", "xtask", "engine", kind, "stop", "--port", str(port)],
                   stdout=subprocess.DEVNULL)


def request(port, i):
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": f"load {i}"}],
                       "max_tokens": 64, "stream": True, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        r.read()


def load(ports, n, concurrency=8):
    jobs = [(p, i) for i in range(n) for p in ports]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not jobs:
                    return
                port, i = jobs.pop()
            request(port, i)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def start_time_unix(pid):
    """When process `pid` started (its exec, for a process that exec'd once), in Unix seconds."""
    ticks = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
    uptime = float(open("/proc/uptime").read().split()[0])
    return time.time() - uptime + ticks / TICK


def traced_at(log, pid):
    """When the agent's log said it traces server `pid`, in Unix seconds."""
    m = re.search(rf"^(\S+)Z .*tracing \S+ \S+ server pid {pid}\b", log, re.M)
    if not m:
        return None
    return datetime.fromisoformat(m.group(1)).replace(tzinfo=timezone.utc).timestamp()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--attach", action="store_true")
    a = ap.parse_args()
    stop("vllm", VLLM_PORT)
    stop("sglang", SGLANG_PORT)
    log_path = "/tmp/infertrace-bench-node.log"
    common = ["--output", "none", "--no-python-sampling"]
    env = {**os.environ, "INFERTRACE_LOG": "info"}

    def started(agent):
        while "attached:" not in open(log_path).read():
            if agent.poll() is not None:
                sys.exit(f"the agent exited: {open(log_path).read()}")
            time.sleep(0.2)
        return agent

    if a.attach:
        vllm = engine("vllm", VLLM_PORT)
        sglang = engine("sglang", SGLANG_PORT, "--enable-metrics")
        agent = started(subprocess.Popen(
            [a.bin, "attach", "--pid", str(vllm), "--pid", str(sglang), *common],
            stderr=open(log_path, "w"), env=env))
    else:
        agent = started(subprocess.Popen([a.bin, "run", *common], stderr=open(log_path, "w"),
                                         env=env))
    try:
        if not a.attach:
            window(agent.pid, a.seconds, "idle, no engine")
            vllm = engine("vllm", VLLM_PORT)
            sglang = engine("sglang", SGLANG_PORT, "--enable-metrics")
        log = open(log_path).read()
        for name, pid in (("vLLM", vllm), ("SGLang", sglang)) if not a.attach else ():
            at = traced_at(log, pid)
            if at is None:
                print(f"{name}: never traced", flush=True)
            else:
                print(f"{name}: traced {1000 * (at - start_time_unix(pid)):.0f} ms after its exec "
                      f"(/proc start time, 10 ms ticks)", flush=True)
        window(agent.pid, a.seconds, "two idle engines")
        n = a.requests
        cpu, _ = window(agent.pid, 0, f"load: {n} streamed chats of 64 tokens to each engine",
                        lambda: load([VLLM_PORT, SGLANG_PORT], n))
        print(f"agent CPU per request under load: {1000 * cpu / (2 * n):.3f} ms", flush=True)
        print(f"agent peak RSS: {status_kib(agent.pid, 'VmHWM') / 1024:.1f} MiB", flush=True)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        stop("vllm", VLLM_PORT)
        stop("sglang", SGLANG_PORT)


if __name__ == "__main__":
    sys.exit(main())
