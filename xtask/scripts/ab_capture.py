#!/usr/bin/env python3
"""The in-kernel cost of the capture, two agent builds side by side (BENCHMARKS.md).

As root, after `cargo build --release -p infertrace -p xtask`:

    python3 xtask/scripts/ab_capture.py BEFORE_BIN AFTER_BIN [--messages N] [--rounds R]

Each round runs `xtask bench-load N 100` (N ZMTP frames of 100 B over a unix socket pair, one
write and one read each) untraced, under BEFORE_BIN and under AFTER_BIN (`attach --output none`,
a 256 MiB ring drained every 5 s, so the agent's own work does not compete with the load), in
a shuffled order, and prints per configuration the median and range of the load's wall time
and of its own CPU (user + system, from its rusage) per message: the system part is where the
kernel programs run.
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import time

XTASK = os.path.join(os.path.dirname(__file__), "..", "..", "target", "release", "xtask")


def run(agent, messages):
    load = subprocess.Popen([XTASK, "bench-load", str(messages), "100"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    traced = None
    if agent:
        traced = subprocess.Popen(
            [agent, "attach", "--pid", str(load.pid), "--output", "none", "--ring-mib", "256",
             "--poll-ms", "5000"],
            env={**os.environ, "INFERTRACE_LOG": "error"}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        time.sleep(1.5)  # attached once its programs are loaded
    load.stdin.write("go\n")
    load.stdin.flush()
    wall_ns = float(load.stdout.readline())
    load.stdin.close()
    _, _, usage = os.wait4(load.pid, 0)
    if traced and traced.wait() != 0:
        sys.exit(f"{agent} failed")
    return wall_ns, (usage.ru_utime + usage.ru_stime) * 1e9 / messages


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    configs = {"untraced": None, "before": args.before, "after": args.after}
    results = {name: [] for name in configs}
    for _ in range(args.rounds):
        order = list(configs)
        random.shuffle(order)
        for name in order:
            results[name].append(run(configs[name], args.messages))
    for name, runs in results.items():
        wall = [r[0] for r in runs]
        cpu = [r[1] for r in runs]
        print(f"{name}: wall {statistics.median(wall):.0f} ns/message [{min(wall):.0f}-"
              f"{max(wall):.0f}], load CPU {statistics.median(cpu):.0f} ns/message "
              f"[{min(cpu):.0f}-{max(cpu):.0f}]")


if __name__ == "__main__":
    main()
