"""The agent's memory per request in flight (BENCHMARKS.md, issue 19): a real vLLM that
runs few sequences at a time (`--max-num-seqs 4`), `infertrace attach` to it, then N streamed
chat requests sent at once, so that nearly all of them wait in the engine's queue; the agent's
RSS once they are all in flight, against its RSS before, per request.

usage (as root, vLLM installed by `cargo xtask engine vllm start` once):
  VLLM_HOME=/var/tmp/infertrace-vllm python3 xtask/scripts/bench_in_flight.py BIN [--requests 2000]

The client is the engine venv's Python (aiohttp); each request is a chat of about 1 KB of text
asking for 64 tokens.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PORT = 18499
HOME = os.environ.get("VLLM_HOME", "/var/tmp/infertrace-vllm")

CLIENT = r'''
import asyncio, json, sys, aiohttp
port, n = int(sys.argv[1]), int(sys.argv[2])
async def one(session, i):
    body = {"model": "tiny", "stream": True, "max_tokens": 64,
            "messages": [{"role": "user", "content": f"request {i} " + "lorem ipsum " * 80}]}
    async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
        async for _ in r.content:
            pass
async def main():
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as s:
        tasks = [asyncio.create_task(one(s, i)) for i in range(n)]
        print("sent", flush=True)
        await asyncio.gather(*tasks)
asyncio.run(main())
'''


def status_kib(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def in_flight(port):
    """vLLM's own gauges: requests running and waiting."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin")
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    subprocess.run(["cargo", "xtask", "engine", "vllm", "stop", "--port", str(PORT)], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cargo", "xtask", "engine", "vllm", "start", "--port", str(PORT), "--",
                    "--max-num-seqs", "4"], check=True, stdout=subprocess.DEVNULL)
    server = int(open(f"{HOME}/logs/vllm-{PORT}.pid").read())
    agent = subprocess.Popen([args.bin, "attach", "--pid", str(server), "--output", "none"],
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "INFERTRACE_LOG": "warn"})
    try:
        time.sleep(8)
        before = status_kib(agent.pid, "VmRSS")
        client = subprocess.Popen([f"{HOME}/venv/bin/python", "-c", CLIENT, str(PORT),
                                   str(args.requests)], stdout=subprocess.PIPE, text=True)
        client.stdout.readline()
        deadline = time.time() + 120
        held = 0
        while time.time() < deadline:
            held = in_flight(PORT)
            if held >= args.requests * 0.95:
                break
            time.sleep(1)
        time.sleep(3)
        held = in_flight(PORT)
        during = status_kib(agent.pid, "VmRSS")
        print(f"{held} requests in flight in vLLM: agent RSS {before / 1024:.1f} MiB before, "
              f"{during / 1024:.1f} MiB with them, "
              f"{(during - before) * 1024 / max(held, 1) / 1024:.1f} KiB per request in flight",
              flush=True)
        client.kill()
    finally:
        agent.terminate()
        _, err = agent.communicate(timeout=60)
        print(err.strip().splitlines()[-1][-200:] if err.strip() else "(no summary)")
        subprocess.run(["cargo", "xtask", "engine", "vllm", "stop", "--port", str(PORT)],
                       stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
