#!/usr/bin/env python3
"""`wgllm serve --parallel 16` under concurrent streams: 16 clients with different prompts each get exactly the text
their request gives alone (temperature 0); a client that disconnects mid-stream has its request cancelled, shown in
/metrics, with no sequence left active; SIGTERM lets a request in flight finish before the server exits 0."""
import json
import signal
import threading
import time
import unittest

import requests

import server_util
from server_util import MODEL, Server

# 16 prompts of different lengths, half chat and half completions.
LINES = ["ROMEO:", "JULIET:", "First Citizen:", "MENENIUS:", "KING RICHARD III:", "GLOUCESTER:", "Second Citizen:",
         "LADY ANNE:"]
REQUESTS = ([("completions", {"prompt": line + "\n" + "Speak, " * i}) for i, line in enumerate(LINES)] +
            [("chat", {"messages": [{"role": "user", "content": line + " tell me of " + "the war " * i}]})
             for i, line in enumerate(LINES)])
MAX_TOKENS = 40


def text_of(kind, chunk):
    c = chunk["choices"]
    if not c:
        return ""
    return (c[0]["delta"].get("content") or "") if kind == "chat" else c[0]["text"]


class Concurrency(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--parallel", "16")
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def run_alone(self, kind, body):
        if kind == "chat":
            r = self.client.chat.completions.create(model=MODEL, max_tokens=MAX_TOKENS, temperature=0, **body)
            return r.choices[0].message.content
        return self.client.completions.create(model=MODEL, max_tokens=MAX_TOKENS, temperature=0, **body).choices[0].text

    def test_16_streams_match_lone_runs(self):
        alone = [self.run_alone(kind, body) for kind, body in REQUESTS]
        self.assertEqual(len(set(alone)), len(alone), "the prompts should give different texts")
        got = [None] * len(REQUESTS)
        errors = []
        start = threading.Barrier(len(REQUESTS))

        def client(i):
            kind, body = REQUESTS[i]
            try:
                c = self.server.client()
                start.wait()
                if kind == "chat":
                    stream = c.chat.completions.create(model=MODEL, max_tokens=MAX_TOKENS, temperature=0,
                                                       stream=True, **body)
                    got[i] = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
                else:
                    stream = c.completions.create(model=MODEL, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                                  **body)
                    got[i] = "".join(ch.choices[0].text for ch in stream)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"client {i}: {e!r}")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(REQUESTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])
        for i, (a, g) in enumerate(zip(alone, got)):
            self.assertEqual(g, a, f"request {i} ({REQUESTS[i][0]}) streamed beside 15 others")
        m = server_util.wait_idle(self.server.url)
        self.assertEqual(m["wgllm_requests_active"], 0)

    def test_disconnect_cancels(self):
        before = server_util.metrics(self.server.url)
        # A long generation, read for a few chunks, then the connection is closed.
        r = requests.post(self.server.base_url + "/completions", stream=True, timeout=30,
                          json={"prompt": "ROMEO:", "max_tokens": 250, "temperature": 0, "stream": True})
        self.assertEqual(r.status_code, 200)
        lines = r.iter_lines()
        seen = 0
        for line in lines:
            if line.startswith(b"data: "):
                seen += 1
                if seen == 3:
                    break
        r.close()  # the socket closes: the server's next write fails
        m = server_util.wait_idle(self.server.url)
        key = 'wgllm_requests_total{outcome="cancelled"}'
        self.assertEqual(m[key], before[key] + 1)
        self.assertEqual(m["wgllm_client_disconnects_total"], before["wgllm_client_disconnects_total"] + 1)
        self.assertEqual((m["wgllm_requests_active"], m["wgllm_requests_queued"]), (0, 0))
        self.assertLess(m["wgllm_generated_tokens_total"] - before["wgllm_generated_tokens_total"], 250)
        self.assertEqual(m["wgllm_http_completions_in_flight"], 0)


class Shutdown(unittest.TestCase):
    def test_sigterm_finishes_requests_in_flight(self):
        server = Server("--parallel", "2")
        r = requests.post(server.base_url + "/completions", stream=True, timeout=60,
                          json={"prompt": "ROMEO:", "max_tokens": 200, "temperature": 0, "stream": True})
        events = r.iter_lines()
        first = next(e for e in events if e.startswith(b"data: "))
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        # A new request is refused while the server drains (or finds the port closed once it is done).
        try:
            refused = requests.post(server.base_url + "/completions", json={"prompt": "x"}, timeout=10)
            self.assertEqual(refused.status_code, 503)
        except requests.ConnectionError:
            pass
        rest = [e for e in events if e.startswith(b"data: ")]
        self.assertEqual(rest[-1], b"data: [DONE]")  # the stream in flight ended normally
        chunks = [json.loads(e[6:]) for e in [first] + rest[:-1]]
        self.assertIsNotNone(chunks[-1]["choices"][0]["finish_reason"])
        server.stop()  # exit status 0


if __name__ == "__main__":
    server_util.main(__name__)
