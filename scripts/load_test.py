#!/usr/bin/env python3
"""Load test of a running `wgllm serve` (or of one it starts): N requests from C concurrent clients.

Requests mix chat and completions, streamed and not, prompts and max_tokens of several lengths; a fraction of the
streamed ones disconnect after a few chunks. Everything runs at temperature 0, so each (prompt, max_tokens) has one
right answer: it is fetched first, alone, and every response under load must equal it (a disconnected stream: a
prefix of it). Afterwards /metrics must show no sequence active or queued. Prints one JSON object:

  requests, completed, cancelled (disconnected on purpose), failures (HTTP errors, broken streams), wrong (text
  different from the lone run), leaked (sequences still active or queued afterwards), ttft_p50_ms / ttft_p99_ms
  (time to the first streamed text), itl_p50_ms / itl_p99_ms (inter-token latency: the gaps between a stream's
  successive text chunks, a token each), tokens_per_s (completion tokens received / wall time), wall_s

and exits 1 when failures, wrong or leaked is not 0.

    scripts/load_test.py --url http://127.0.0.1:8080 -n 400 -c 32
    scripts/load_test.py --start build/bin/wgllm --parallel 16 -n 400 -c 32    # starts and stops its own server
    scripts/load_test.py --start build/bin/wgllm --long-prompt 2000 ...  # and one request with a long prompt mid-way
    scripts/load_test.py --start build/bin/wgllm --system-words 500 ...   # every prompt begins with one system text

With --system-words the report adds the server's cached and shared prompt tokens over the run (/metrics).
"""
import argparse
import json
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import requests

LINES = ["ROMEO:", "JULIET:", "First Citizen:", "MENENIUS:", "KING RICHARD III:", "GLOUCESTER:", "LADY ANNE:",
         "Second Servingman:"]


def system_text(words):
    """A system prompt of about `words` words that every request begins with (a deployment's instructions)."""
    vocab = ["speak", "plainly", "to", "the", "citizens", "of", "Verona", "and", "answer", "in", "verse", "when",
             "asked", "by", "a", "lord", "or", "lady"]
    return " ".join(vocab[(i * 7 + i // len(vocab)) % len(vocab)] for i in range(words))


def workload(max_tokens, system_words=0):
    """The distinct requests: (endpoint, body without stream) of short and long prompts, several max_tokens; with
    system_words, each beginning with the same system text (chat: a system message)."""
    out = []
    system = system_text(system_words) if system_words else ""
    for i, line in enumerate(LINES):
        words = "and thus I say " * (1 + 6 * (i % 4))  # 4 prompt lengths
        for n in max_tokens:
            prompt = f"{system}\n{line}\n{words}" if system else f"{line}\n{words}"
            messages = ([{"role": "system", "content": system}] if system else []) + \
                [{"role": "user", "content": f"{line} {words}"}]
            out.append(("completions", {"prompt": prompt, "max_tokens": n, "temperature": 0}))
            out.append(("chat/completions", {"messages": messages, "max_tokens": n, "temperature": 0}))
    return out


def text_of(endpoint, obj, streamed):
    c = obj["choices"]
    if not c:
        return ""
    if endpoint == "completions":
        return c[0]["text"]
    return (c[0]["delta"].get("content") or "") if streamed else c[0]["message"]["content"]


class Client:
    def __init__(self, url, headers):
        self.url, self.headers = url, headers
        self.http = requests.Session()

    def whole(self, endpoint, body):
        r = self.http.post(f"{self.url}/v1/{endpoint}", json=body, headers=self.headers, timeout=300)
        r.raise_for_status()
        j = r.json()
        return text_of(endpoint, j, False), j["usage"]["completion_tokens"]

    def stream(self, endpoint, body, disconnect_after=None, gaps=None):
        """(text, tokens, seconds to the first text, disconnected). Tokens: the usage's, or chunks seen. The seconds
        between successive text chunks are appended to gaps."""
        t0 = last = time.perf_counter()
        r = self.http.post(f"{self.url}/v1/{endpoint}", headers=self.headers, timeout=300, stream=True,
                           json={**body, "stream": True, "stream_options": {"include_usage": True}})
        r.raise_for_status()
        text, chunks, ttft, tokens, done = "", 0, None, None, False
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            obj = json.loads(data)
            if "error" in obj:
                raise RuntimeError(obj["error"]["message"])
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
            piece = text_of(endpoint, obj, True)
            if piece:
                now = time.perf_counter()
                if ttft is not None and gaps is not None:
                    gaps.append(now - last)
                last = now
                ttft = ttft if ttft is not None else now - t0
                text += piece
                chunks += 1
                if disconnect_after is not None and chunks >= disconnect_after:
                    r.close()  # the connection goes; the server cancels the request
                    return text, chunks, ttft, True
        if not done:
            raise RuntimeError("the stream ended without [DONE]")
        return text, tokens if tokens is not None else chunks, ttft, False


def metrics(url, headers):
    out = {}
    for line in requests.get(url + "/metrics", headers=headers, timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def percentile(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def run(args):
    headers = {"Authorization": "Bearer " + args.api_key} if args.api_key else {}
    kinds = workload([int(x) for x in args.max_tokens.split(",")], args.system_words)
    # The right answers: each distinct request alone.
    ref_client = Client(args.url, headers)
    reference = {i: ref_client.whole(ep, body)[0] for i, (ep, body) in enumerate(kinds)}

    rng = random.Random(args.seed)
    jobs = []  # (kind index, stream, disconnect after n chunks or None)
    for _ in range(args.requests):
        stream = rng.random() < 0.7
        cut = rng.randint(1, 3) if stream and rng.random() < args.cancel_fraction else None
        jobs.append((rng.randrange(len(kinds)), stream, cut))
    lock = threading.Lock()
    results = {"completed": 0, "cancelled": 0, "failures": [], "wrong": [], "ttft": [], "itl": [], "tokens": 0}
    next_job = iter(range(len(jobs)))

    def worker():
        client = Client(args.url, headers)
        while True:
            with lock:
                j = next(next_job, None)
            if j is None:
                return
            k, stream, cut = jobs[j]
            endpoint, body = kinds[k]
            gaps = []
            try:
                if stream:
                    text, tokens, ttft, gone = client.stream(endpoint, body, cut, gaps)
                else:
                    (text, tokens), ttft, gone = client.whole(endpoint, body), None, False
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    results["failures"].append(f"request {j} ({endpoint}): {e}")
                continue
            ok = reference[k].startswith(text) if gone else text == reference[k]
            with lock:
                results["tokens"] += tokens
                if ttft is not None:
                    results["ttft"].append(ttft)
                results["itl"] += gaps
                results["cancelled" if gone else "completed"] += 1
                if not ok:
                    results["wrong"].append({"request": j, "endpoint": endpoint, "want": reference[k], "got": text})

    long_result = {}

    def long_request():  # one prompt of --long-prompt tokens, sent once the clients are under way
        time.sleep(0.5)
        body = {"prompt": "and " * args.long_prompt, "max_tokens": 1, "temperature": 0}
        t = time.perf_counter()
        try:
            r = requests.post(f"{args.url}/v1/completions", json=body, headers=headers, timeout=600)
            long_result["status"] = r.status_code
            long_result["prompt_tokens"] = r.json().get("usage", {}).get("prompt_tokens")
        except Exception as e:  # noqa: BLE001 - reported
            long_result["error"] = str(e)
        long_result["seconds"] = round(time.perf_counter() - t, 2)

    before = metrics(args.url, headers)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    if args.long_prompt:
        threads.append(threading.Thread(target=long_request))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    # Nothing may stay active or queued once every client is done (cancelled ones stop at their next token).
    deadline = time.time() + 10
    while True:
        m = metrics(args.url, headers)
        leaked = int(m["wgllm_requests_active"] + m["wgllm_requests_queued"])
        if leaked == 0 or time.time() > deadline:
            break
        time.sleep(0.05)
    ttft, itl = results["ttft"], results["itl"]
    return {
        "requests": args.requests,
        "clients": args.clients,
        "completed": results["completed"],
        "cancelled": results["cancelled"],
        "failures": len(results["failures"]),
        "wrong": len(results["wrong"]),
        "leaked": leaked,
        "ttft_p50_ms": round(1e3 * statistics.median(ttft), 1) if ttft else None,
        "ttft_p99_ms": round(1e3 * percentile(ttft, 99), 1) if ttft else None,
        "itl_p50_ms": round(1e3 * statistics.median(itl), 1) if itl else None,
        "itl_p99_ms": round(1e3 * percentile(itl, 99), 1) if itl else None,
        **({"long_prompt": long_result} if args.long_prompt else {}),
        **({name: int(m.get(f"wgllm_{name}_total", 0) - before.get(f"wgllm_{name}_total", 0))
            for name in ("prompt_tokens", "prompt_tokens_cached", "prompt_tokens_shared")} if args.system_words else {}),
        "tokens": results["tokens"],
        "tokens_per_s": round(results["tokens"] / wall, 1),
        "wall_s": round(wall, 2),
        "server_cancelled": m['wgllm_requests_total{outcome="cancelled"}'],
        "failure_samples": results["failures"][:5],
        "wrong_samples": results["wrong"][:3],
    }


def start_server(binary, parallel, queue, extra):
    proc = subprocess.Popen(
        [binary, "serve", "--port", "0", "--parallel", str(parallel), "--queue", str(queue), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep it drained
            return proc, m.group(1)
    raise RuntimeError(f"{binary} serve did not start (exit {proc.wait()})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (http://HOST:PORT)")
    ap.add_argument("--start", metavar="WGLLM", help="start `WGLLM serve --port 0` for the test and stop it after")
    ap.add_argument("--parallel", type=int, default=16, help="with --start: its --parallel")
    ap.add_argument("--queue", type=int, default=64, help="with --start: its --queue")
    ap.add_argument("-n", "--requests", type=int, default=400)
    ap.add_argument("-c", "--clients", type=int, default=32)
    ap.add_argument("--max-tokens", default="4,8,16,24", help="the max_tokens values mixed (comma-separated)")
    ap.add_argument("--cancel-fraction", type=float, default=0.1, help="streams that disconnect mid-way")
    ap.add_argument("--api-key")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--long-prompt", type=int, default=0, metavar="N",
                    help="also send one completion of an N-token prompt mid-way (the running streams' itl shows what "
                         "its prefill costs them)")
    ap.add_argument("--system-words", type=int, default=0, metavar="N",
                    help="every request's prompt begins with the same system text of N words (the prompt cache "
                         "across sequences shows in ttft and in the cached and shared tokens reported)")
    ap.add_argument("--serve-args", default="", help="with --start: more arguments for serve (-m FILE -c N "
                                                    "--batch-tokens N ...), space-separated")
    args = ap.parse_args()
    if bool(args.url) == bool(args.start):
        ap.error("give --url or --start")
    proc = None
    if args.start:
        proc, args.url = start_server(args.start, args.parallel, args.queue, args.serve_args.split())
    try:
        report = run(args)
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
    if proc and code != 0:
        report["server_exit"] = code
    print(json.dumps(report, indent=1))
    bad = report["failures"] or report["wrong"] or report["leaked"] or report.get("server_exit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
