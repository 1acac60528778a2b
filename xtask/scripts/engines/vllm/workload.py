#!/usr/bin/env python3
"""Deterministic workload against an OpenAI-compatible server (vLLM / SGLang), stdlib only.

usage: workload.py [--base http://127.0.0.1:8000] [--model tiny] [--out summary.json] [--seed 0]
                   [--burst 12] [--burst-max-tokens 480] [--crowd 0] [--crowd-max-tokens 32]
                   [--long 3] [--long-tokens 1000] [--quick]

Phases, in order (each request gets explicit max_tokens and "ignore_eos": true, so output
lengths are known; greedy sampling except the n=2 requests, which carry a fixed seed):
  basic    one keep-alive connection: chat (non-stream, stream, stream+include_usage),
           completions (non-stream, stream+include_usage), n=2 on both endpoints
           (chat non-stream, completions stream); every other request has a `traceparent`
  burst    --burst concurrent requests (more than the server's --max-num-seqs) from as many
           threads, mixed endpoints / stream flags, ~150-token prompts, --burst-max-tokens each:
           queueing, and preemption when the KV cache is small
  crowd    --crowd requests released at once from as many threads (a barrier), mixed chat /
           completions and stream / non-stream, ~60-token prompts, --crowd-max-tokens each,
           sampled (temperature 0.7, top_p 0.9): the server's frontend busy with arrivals while
           the first outputs come back, and requests queued behind the engine's running limit
           (none when --crowd is 0, the default)
  long     --long sequential ~--long-tokens-token prompts, 8 output tokens: chunked prefill
           when --max-num-batched-tokens is small
  abort    a streaming request whose socket is closed after the first SSE event; a
           non-stream request (large max_tokens) whose socket is closed after 50 ms
  invalid  unknown model (404), max_tokens beyond the context (400), malformed JSON (400)

The summary (--out) lists every request: phase, endpoint, stream, n, status, response ids,
usage as the server reported it, aborted_by_client, and client-side t_start / t_end
(time.time(), seconds), plus t_first (first response byte) where there was one.
"""
import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time
import urllib.parse

WORDS = (
    "the quick brown fox jumps over lazy dog a tiny language model answers questions hello how "
    "are you today i am fine thank what is capital of france paris engine core schedules requests "
    "runs forward pass returns tokens to api server which streams them back client"
).split()
CHARS_PER_TOKEN = 3.25  # measured with the tiny model's tokenizer on WORDS text


def text(rng, tokens, tag):
    """About `tokens` tokens of text; `tag` makes the start unique (no prefix-cache hits)."""
    out, size = [f"[{tag}]"], 0
    while size < tokens * CHARS_PER_TOKEN:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


class Client:
    def __init__(self, base, model, seed):
        u = urllib.parse.urlparse(base)
        self.host, self.port = u.hostname, u.port or 80
        self.model = model
        self.seed = seed
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.records = []
        self.trace_n = 0

    def traceparent(self):
        with self.lock:
            self.trace_n += 1
            r = random.Random(f"{self.seed}/trace/{self.trace_n}")
        return f"00-{r.getrandbits(128):032x}-{r.getrandbits(64):016x}-01"

    def connect(self):
        c = http.client.HTTPConnection(self.host, self.port, timeout=300)
        c.connect()
        return c

    def body(self, endpoint, prompt, max_tokens, stream=False, usage=False, n=1, seed=None):
        b = {"model": self.model, "max_tokens": max_tokens, "ignore_eos": True}
        if endpoint == "/v1/chat/completions":
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        if n != 1:
            b["n"] = n
        if seed is None:
            b["temperature"] = 0.0
        else:
            b["temperature"], b["seed"] = 0.8, seed
        if stream:
            b["stream"] = True
            if usage:
                b["stream_options"] = {"include_usage": True}
        return b

    def request(self, phase, endpoint, body, conn=None, traceparent=False, raw=None,
                abort=None):
        """One POST. `raw`: bytes sent as is (malformed JSON). `abort`: "first_event" closes
        the socket after the first SSE event, a float closes it after that many seconds."""
        rec = {
            "phase": phase, "endpoint": endpoint,
            "stream": bool(body.get("stream")) if body else False,
            "include_usage": bool(body and body.get("stream_options", {}).get("include_usage")),
            "n": body.get("n", 1) if body else 1,
            "max_tokens": body.get("max_tokens") if body else None,
            "prompt_chars": len(body.get("prompt") or (body.get("messages") or [{}])[0]
                                .get("content", "")) if body else None,
            "traceparent": self.traceparent() if traceparent else None,
            "status": None, "ids": [], "usage": None, "finish_reasons": [],
            "completion_chars": None, "sse_events": None,
            "aborted_by_client": False, "abort_mode": None, "error": None,
        }
        data = raw if raw is not None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
        if rec["traceparent"]:
            headers["traceparent"] = rec["traceparent"]
        own = conn is None
        if own:
            conn = self.connect()
        rec["t_start"] = time.time()
        rec["t_first"] = None
        try:
            conn.request("POST", endpoint, body=data, headers=headers)
            if isinstance(abort, float):
                conn.sock.settimeout(abort)
                try:
                    resp = conn.getresponse()
                    rec["status"] = resp.status  # finished within the delay: not an abort
                    self._read_body(resp, rec)
                except socket.timeout:
                    rec["aborted_by_client"], rec["abort_mode"] = True, f"close_after_{abort}s"
                    self._close(conn)
            else:
                resp = conn.getresponse()
                rec["t_first"] = time.time()
                rec["status"] = resp.status
                if rec["stream"] and resp.status == 200:
                    self._read_sse(resp, rec, conn, abort)
                else:
                    self._read_body(resp, rec)
        except (OSError, http.client.HTTPException) as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        rec["t_end"] = time.time()
        if own or rec["aborted_by_client"]:
            conn.close()
        with self.lock:
            rec["idx"] = len(self.records)
            self.records.append(rec)
        print(f"[{rec['idx']:3}] {phase:7} {endpoint:21} stream={int(rec['stream'])} n={rec['n']} "
              f"-> {rec['status']} {','.join(rec['ids'])} usage={rec['usage'] and rec['usage'].get('completion_tokens')}"
              f"{' ABORTED' if rec['aborted_by_client'] else ''} {rec['t_end'] - rec['t_start']:.3f}s",
              flush=True)
        return rec

    @staticmethod
    def _close(conn):
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()

    def _read_body(self, resp, rec):
        raw = resp.read()
        if rec["t_first"] is None:
            rec["t_first"] = time.time()
        try:
            d = json.loads(raw)
        except ValueError:
            rec["error"] = raw[:300].decode(errors="replace")
            return
        if resp.status != 200:
            rec["error"] = d
            return
        rec["ids"] = [d.get("id")]
        rec["usage"] = d.get("usage")
        rec["finish_reasons"] = [c.get("finish_reason") for c in d.get("choices", [])]
        rec["completion_chars"] = [len(c.get("text") or (c.get("message") or {}).get("content") or "")
                                   for c in d.get("choices", [])]

    def _read_sse(self, resp, rec, conn, abort):
        events, ids, finish, chars = 0, [], {}, {}
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            events += 1
            if payload == b"[DONE]":
                break
            d = json.loads(payload)
            if d.get("id") not in ids:
                ids.append(d.get("id"))
            if d.get("usage"):
                rec["usage"] = d["usage"]
            for c in d.get("choices", []):
                i = c.get("index", 0)
                piece = c.get("text") or (c.get("delta") or {}).get("content") or ""
                chars[i] = chars.get(i, 0) + len(piece)
                if c.get("finish_reason"):
                    finish[i] = c["finish_reason"]
            if abort == "first_event":
                rec["aborted_by_client"], rec["abort_mode"] = True, "close_after_first_sse_event"
                self._close(conn)
                break
        if not rec["aborted_by_client"]:
            resp.read()  # the rest (last chunk), so that a keep-alive connection can go on
        rec["sse_events"], rec["ids"] = events, ids
        rec["finish_reasons"] = [finish.get(i) for i in sorted(chars)]
        rec["completion_chars"] = [chars[i] for i in sorted(chars)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--out", default="workload-summary.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--burst", type=int, default=12, help="concurrent requests (> --max-num-seqs)")
    ap.add_argument("--burst-max-tokens", type=int, default=480)
    ap.add_argument("--crowd", type=int, default=0, help="requests released at once (0: none)")
    ap.add_argument("--crowd-max-tokens", type=int, default=32)
    ap.add_argument("--long", type=int, default=3, help="number of long-prompt requests")
    ap.add_argument("--long-tokens", type=int, default=1000)
    ap.add_argument("--context", type=int, default=2048, help="the server's max model len")
    ap.add_argument("--quick", action="store_true", help="smaller burst and outputs")
    a = ap.parse_args()
    if a.quick:
        a.burst, a.burst_max_tokens, a.long = 6, 64, 1

    cl = Client(a.base, a.model, a.seed)
    rng = cl.rng
    t0 = time.time()
    chat, comp = "/v1/chat/completions", "/v1/completions"

    # basic: one keep-alive connection, every other request with a traceparent
    conn = cl.connect()
    basic = [
        (chat, dict(stream=False)), (chat, dict(stream=True)),
        (chat, dict(stream=True, usage=True)), (comp, dict(stream=False)),
        (comp, dict(stream=True, usage=True)), (chat, dict(stream=False, n=2, seed=1234)),
        (comp, dict(stream=True, usage=True, n=2, seed=4321)),
    ]
    for i, (ep, kw) in enumerate(basic):
        body = cl.body(ep, text(rng, 20, f"basic{i}"), 16 + 4 * i, **kw)
        rec = cl.request("basic", ep, body, conn=conn, traceparent=(i % 2 == 0))
        if rec["error"]:
            conn.close()
            conn = cl.connect()
    conn.close()

    # burst: more concurrent requests than the engine runs at once
    bodies = []
    for i in range(a.burst):
        ep = chat if i % 2 else comp
        bodies.append((ep, cl.body(ep, text(rng, 150, f"burst{i}"), a.burst_max_tokens,
                                   stream=(i % 3 != 0), usage=(i % 3 == 1)), i % 4 == 0))
    threads = [threading.Thread(target=cl.request, args=("burst", ep, b),
                                kwargs=dict(traceparent=tp)) for ep, b, tp in bodies]
    for t in threads:
        t.start()
        time.sleep(0.005)
    for t in threads:
        t.join()

    # crowd: many requests released at once, sampled
    if a.crowd:
        gate = threading.Barrier(a.crowd)

        def crowd_request(ep, body, tp):
            gate.wait()
            cl.request("crowd", ep, body, traceparent=tp)

        crowd = []
        for i in range(a.crowd):
            ep = comp if i % 2 else chat
            body = cl.body(ep, text(rng, 60, f"crowd{i}"), a.crowd_max_tokens,
                           stream=(i % 4 in (1, 2)), usage=(i % 4 == 2))
            body["temperature"], body["top_p"] = 0.7, 0.9
            crowd.append(threading.Thread(target=crowd_request, args=(ep, body, i % 5 == 0)))
        for t in crowd:
            t.start()
        for t in crowd:
            t.join()

    # long prompts: chunked prefill
    for i in range(a.long):
        ep = comp if i % 2 == 0 else chat
        body = cl.body(ep, text(rng, a.long_tokens, f"long{i}"), 8, stream=(i == 1), usage=True)
        cl.request("long", ep, body, traceparent=(i == 0))

    # client aborts
    cl.request("abort", chat, cl.body(chat, text(rng, 30, "abort0"), 1000, stream=True),
               abort="first_event", traceparent=True)
    cl.request("abort", comp, cl.body(comp, text(rng, 30, "abort1"), 1500, stream=True, usage=True),
               abort="first_event")
    cl.request("abort", comp, cl.body(comp, text(rng, 30, "abort2"), 1500), abort=0.05)
    cl.request("abort", chat, cl.body(chat, text(rng, 30, "abort3"), 1500), abort=0.05,
               traceparent=True)
    time.sleep(1.0)  # let the server notice the aborts before the next phase

    # invalid requests
    b = cl.body(comp, "hello", 8)
    b["model"] = "no-such-model"
    cl.request("invalid", comp, b)
    cl.request("invalid", chat, cl.body(chat, "hello", a.context + 100))
    cl.request("invalid", comp, {}, raw=b'{"model": "tiny", "prompt": "hello", "max_tokens": ')

    # one last ordinary request after all that
    cl.request("basic", comp, cl.body(comp, text(rng, 20, "final"), 16), traceparent=True)

    summary = {
        "base": a.base, "model": a.model, "seed": a.seed, "argv": sys.argv[1:],
        "t_start": t0, "t_end": time.time(),
        "counts": {
            "requests": len(cl.records),
            "status_200": sum(r["status"] == 200 for r in cl.records),
            "aborted_by_client": sum(r["aborted_by_client"] for r in cl.records),
            "invalid": sum(r["phase"] == "invalid" for r in cl.records),
            # one engine request (and one vLLM llm_request span) per choice of a completed request
            "engine_requests_completed": sum(
                r["n"] for r in cl.records if r["status"] == 200 and not r["aborted_by_client"]),
        },
        "requests": sorted(cl.records, key=lambda r: r["idx"]),
    }
    with open(a.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary["counts"]))


if __name__ == "__main__":
    main()
