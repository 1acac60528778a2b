#!/usr/bin/env python3
"""SGLang's native API (/generate), stdlib only: the part of a fixture workload that workload.py
(OpenAI-compatible endpoints) does not cover.

usage: native_workload.py [--base http://127.0.0.1:30000] [--out native.json] [--merge INTO.json]
       native_workload.py --pd-decode N [--base ...] [--out ...]

--pd-decode N: for a PD decode server on SGLang's fake transfer backend (`--disaggregation-mode
decode --disaggregation-transfer-backend fake`): N /generate requests that name its fake
bootstrap host (2.2.2.2: no prefill server, nothing transferred), each with its own
bootstrap_room, streamed and not in turn, 8 to 23 new tokens, two at a time.

Requests, in order (greedy, "ignore_eos": true, so output lengths are known):
  0  /generate text prompt, non-stream, 12 new tokens, body "rid": "native-rid-0"
  1  /generate input_ids, non-stream, 8 new tokens, return_logprob (top 2)
  2  /generate text prompt, stream, 10 new tokens
  3  /generate text prompt, stream, 1500 new tokens: the socket is closed after the first SSE
     event (client abort)
Each record: the body sent, status, rid (meta_info.id), meta_info of the last response (prompt /
completion / cached tokens, finish_reason, e2e_latency), SSE event count, client t_start / t_first
/ t_end (time.time()). --merge adds the records under "native" to a workload.py summary.
"""
import argparse
import http.client
import json
import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

PROMPT = "the quick brown fox jumps over the lazy dog and a tiny language model answers"


def post(host, port, body, abort_after_first=False):
    rec = {"body": body, "stream": bool(body.get("stream")), "status": None, "rid": None,
           "meta_info": None, "text_chars": None, "sse_events": None,
           "aborted_by_client": False, "error": None, "t_first": None}
    conn = http.client.HTTPConnection(host, port, timeout=300)
    data = json.dumps(body).encode()
    rec["t_start"] = time.time()
    try:
        conn.request("POST", "/generate", body=data,
                     headers={"Content-Type": "application/json", "Content-Length": str(len(data))})
        resp = conn.getresponse()
        rec["t_first"] = time.time()
        rec["status"] = resp.status
        if rec["stream"] and resp.status == 200:
            events, last = 0, None
            for line in resp:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                events += 1
                if payload == b"[DONE]":
                    break
                last = json.loads(payload)
                if abort_after_first:
                    rec["aborted_by_client"] = True
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    break
            rec["sse_events"] = events
            if last:
                rec["meta_info"] = last.get("meta_info")
                rec["text_chars"] = len(last.get("text") or "")
        else:
            d = json.loads(resp.read())
            if resp.status != 200:
                rec["error"] = d
            else:
                rec["meta_info"] = d.get("meta_info")
                rec["text_chars"] = len(d.get("text") or "")
        if rec["meta_info"]:
            rec["rid"] = rec["meta_info"].get("id")
            # logprobs are long lists: keep their lengths only
            for k, v in list(rec["meta_info"].items()):
                if "logprobs" in k and isinstance(v, list):
                    rec["meta_info"][k] = f"<{len(v)} entries>"
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["t_end"] = time.time()
    conn.close()
    m = rec["meta_info"] or {}
    print(f"native /generate stream={int(rec['stream'])} -> {rec['status']} rid={rec['rid']} "
          f"prompt={m.get('prompt_tokens')} completion={m.get('completion_tokens')} "
          f"finish={m.get('finish_reason')}{' ABORTED' if rec['aborted_by_client'] else ''} "
          f"{rec['t_end'] - rec['t_start']:.3f}s", flush=True)
    return rec


# SGLang's fake bootstrap host (sglang/srt/disaggregation/utils.py: FAKE_BOOTSTRAP_HOST).
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


def pd_decode(host, port, n):
    def one(i):
        body = {"text": f"[pd{i}] " + PROMPT, "stream": i % 2 == 1,
                "sampling_params": dict(max_new_tokens=8 + i % 16, temperature=0.0, ignore_eos=True),
                "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_port": 8998,
                "bootstrap_room": 1000 + i}
        return post(host, port, body)
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, range(n)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:30000")
    ap.add_argument("--out", default=None)
    ap.add_argument("--merge", default=None, help="a workload.py summary to add the records to")
    ap.add_argument("--pd-decode", type=int, default=0, metavar="N")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.base)
    host, port = u.hostname, u.port or 80
    if a.pd_decode:
        records = pd_decode(host, port, a.pd_decode)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(records, f, indent=1)
        failed = [r for r in records if r["status"] != 200 or r["error"]]
        raise SystemExit(f"{len(failed)} requests failed" if failed else 0)
    sp = lambda n, **kw: dict(max_new_tokens=n, temperature=0.0, ignore_eos=True, **kw)  # noqa: E731
    records = [
        post(host, port, {"text": "[native0] " + PROMPT, "sampling_params": sp(12), "rid": "native-rid-0"}),
        post(host, port, {"input_ids": [5, 17, 42, 99, 123, 200, 7, 64], "sampling_params": sp(8),
                          "return_logprob": True, "top_logprobs_num": 2}),
        post(host, port, {"text": "[native2] " + PROMPT, "sampling_params": sp(10), "stream": True}),
        post(host, port, {"text": "[native3] " + PROMPT, "sampling_params": sp(1500), "stream": True},
             abort_after_first=True),
    ]
    time.sleep(1.0)  # let the server notice the abort
    if a.out:
        with open(a.out, "w") as f:
            json.dump(records, f, indent=1)
    if a.merge:
        with open(a.merge) as f:
            summary = json.load(f)
        summary["native"] = records
        with open(a.merge, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
