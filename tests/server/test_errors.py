#!/usr/bin/env python3
"""Every error of `wgllm serve` has its HTTP status and OpenAI's body {"error": {message, type, param, code}}:
malformed JSON, wrong types, bad values, unknown model, n > 1, a prompt past the context, an oversized body, routes
and methods, the API key, a full queue, and bad limits on the command line."""
import concurrent.futures
import unittest

import openai
import requests

import server_util
from server_util import MODEL, N_CTX, Server


class ErrorsBase(unittest.TestCase):
    def post(self, path, body=None, raw=None, headers=None, server=None):
        server = server or self.server
        if raw is not None:
            return requests.post(server.base_url + path, data=raw, timeout=30,
                                 headers={"Content-Type": "application/json", **(headers or {})})
        return requests.post(server.base_url + path, json=body, headers=headers, timeout=30)

    def assertError(self, r, status, param=None, code=None, words=None):
        self.assertEqual(r.status_code, status, r.text)
        self.assertTrue(r.headers["Content-Type"].startswith("application/json"), r.headers)
        err = r.json()["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"})
        self.assertTrue(err["message"] and "\n" not in err["message"], err)
        self.assertIsInstance(err["type"], str)
        if param is not None:
            self.assertEqual(err["param"], param, err)
        if code is not None:
            self.assertEqual(err["code"], code, err)
        if words is not None:
            self.assertIn(words, err["message"])
        return err


class Errors(ErrorsBase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--parallel", "2")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_malformed_json(self):
        for raw in (b'{"prompt": "x",', b"not json", b"", b'{"prompt": "\xff\xfe"}'):
            self.assertError(self.post("/completions", raw=raw), 400, code="invalid_json")
        self.assertError(self.post("/chat/completions", raw=b"[1, 2]"), 400, code="invalid_json")

    def test_wrong_types(self):
        base = {"prompt": "ROMEO:", "max_tokens": 2}
        for key, value in [("max_tokens", "5"), ("max_tokens", 2.5), ("temperature", "hot"), ("top_p", [1]),
                           ("stream", "yes"), ("stop", 5), ("stop", ["a", 1]), ("seed", "x"), ("logprobs", True),
                           ("prompt", {"text": "x"}), ("prompt", [1, "a", 2]), ("presence_penalty", "x"),
                           ("model", 7), ("stream_options", "usage"), ("n", "1")]:
            with self.subTest(key=key, value=value):
                err = self.assertError(self.post("/completions", {**base, key: value}), 400, param=key)
                if key != "prompt":
                    self.assertIn(key, err["message"])
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for body in [{**chat, "messages": "hi"}, {**chat, "messages": ["hi"]}, {**chat, "logprobs": 1},
                     {**chat, "messages": [{"role": 1, "content": "x"}]},
                     {**chat, "messages": [{"role": "user", "content": 5}]}]:
            with self.subTest(body=body):
                self.assertError(self.post("/chat/completions", body), 400)

    def test_bad_values(self):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for body, param in [({**chat, "messages": []}, "messages"),
                            ({**chat, "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
                            ({**chat, "messages": [{"content": "x"}]}, "messages"),
                            ({"max_tokens": 2}, "messages"),
                            ({**chat, "temperature": -1}, "temperature"),
                            ({**chat, "top_p": 1.5}, "top_p"),
                            ({**chat, "presence_penalty": 3}, "presence_penalty"),
                            ({**chat, "top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
                            ({**chat, "logprobs": True, "top_logprobs": 21}, "top_logprobs")]:
            with self.subTest(body=body):
                self.assertError(self.post("/chat/completions", body), 400, param=param)
        self.assertError(self.post("/completions", {"prompt": [1, 99999]}), 400, param="prompt", words="vocabulary")
        self.assertError(self.post("/completions", {"prompt": [-1]}), 400, param="prompt")
        self.assertError(self.post("/completions", {"prompt": []}), 400, param="prompt")
        self.assertError(self.post("/completions", {"prompt": ["a", "b"]}), 400, param="prompt")

    def test_unknown_fields_are_ignored(self):
        r = self.post("/completions", {"prompt": "ROMEO:", "max_tokens": 2, "frobnicate": {"x": 1}, "user": "u"})
        self.assertEqual(r.status_code, 200, r.text)

    def test_unknown_model(self):
        # As llama-server: the one model served answers a request naming another, and says so in `model`.
        r = self.post("/completions", {"prompt": "x", "model": "gpt-4o", "max_tokens": 1})
        self.assertEqual((r.status_code, r.json()["model"]), (200, MODEL), r.text)
        reply = self.server.client().chat.completions.create(model="gpt-4o-mini", max_tokens=1,
                                                             messages=[{"role": "user", "content": "hi"}])
        self.assertEqual(reply.model, MODEL)
        # --strict-model: 404 model_not_found naming it.
        with Server("--parallel", "1", "--strict-model") as strict:
            r = requests.post(strict.base_url + "/completions", json={"prompt": "x", "model": "gpt-4o"}, timeout=60)
            self.assertEqual(r.status_code, 404, r.text)
            err = r.json()["error"]
            self.assertEqual((err["param"], err["code"]), ("model", "model_not_found"))
            self.assertIn("gpt-4o", err["message"])
            with self.assertRaises(openai.NotFoundError):
                strict.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])

    def test_n_above_one(self):
        err = self.assertError(self.post("/completions", {"prompt": "x", "n": 2}), 400, param="n")
        self.assertIn("'n' must be 1", err["message"])
        self.assertEqual(self.post("/completions", {"prompt": "x", "n": 1, "max_tokens": 1}).status_code, 200)

    def test_max_tokens_not_positive(self):
        for key in ("max_tokens", "max_completion_tokens"):
            for value in (0, -5):
                self.assertError(self.post("/completions", {"prompt": "x", key: value}), 400, param=key)
        with self.assertRaises(openai.BadRequestError):
            self.server.client().completions.create(model=MODEL, prompt="x", max_tokens=0)

    def test_prompt_too_long(self):
        self.assertError(self.post("/completions", {"prompt": [1] * N_CTX}), 400, param="prompt",
                         code="context_length_exceeded", words=str(N_CTX))
        long_text = "ROMEO: " * 400
        self.assertError(self.post("/chat/completions", {"messages": [{"role": "user", "content": long_text}]}),
                         400, param="messages", code="context_length_exceeded")
        # one token short of the context still runs: one token is generated
        r = self.post("/completions", {"prompt": [1] * (N_CTX - 1), "max_tokens": 5})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["usage"]["completion_tokens"], 1)

    def test_oversized_body(self):
        big = b'{"prompt": "' + b"a" * (5 << 20) + b'"}'  # over the default limit of 4 MiB
        self.assertError(self.post("/completions", raw=big), 413, words="limit")

    def test_routes_and_methods(self):
        r = requests.get(self.server.url + "/v1/nothing", timeout=10)
        self.assertError(r, 404)
        r = requests.get(self.server.base_url + "/chat/completions", timeout=10)
        self.assertError(r, 405)
        self.assertEqual(r.headers["Allow"], "POST")
        self.assertError(requests.delete(self.server.base_url + "/models", timeout=10), 405)
        self.assertError(requests.post(self.server.url + "/health", timeout=10), 405)


class Auth(ErrorsBase):
    KEY = "sk-test-123"

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--api-key", cls.KEY)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_missing_or_wrong_key(self):
        url = self.server.url
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": self.KEY}):
            with self.subTest(headers=headers):
                self.assertError(requests.get(url + "/v1/models", headers=headers, timeout=10), 401,
                                 code="invalid_api_key")
                self.assertError(requests.get(url + "/metrics", headers=headers, timeout=10), 401)
                self.assertError(self.post("/chat/completions", {"messages": [{"role": "user", "content": "x"}]},
                                           headers=headers), 401)
                self.assertError(self.post("/completions", {"prompt": "x"}, headers=headers), 401)
        with self.assertRaises(openai.AuthenticationError):
            self.server.client(api_key="wrong").models.list()

    def test_health_needs_no_key(self):
        r = requests.get(self.server.url + "/health", timeout=10)
        self.assertEqual((r.status_code, r.json()["status"]), (200, "ok"))

    def test_right_key(self):
        client = self.server.client(api_key=self.KEY)
        self.assertEqual(client.models.list().data[0].id, MODEL)
        r = client.completions.create(model=MODEL, prompt="ROMEO:", max_tokens=3)
        self.assertTrue(r.choices[0].text)
        headers = {"Authorization": "Bearer " + self.KEY}
        self.assertIn("wgllm_requests_active", server_util.metrics(self.server.url, headers))


class BadServeOptions(unittest.TestCase):
    def test_bad_limits_refused_with_one_line(self):
        # each bad value: exit status 1 before anything listens, one line naming the option
        import subprocess
        for args, flag in [(["--max-connections", "0"], "--max-connections"),
                           (["--request-timeout", "0"], "--request-timeout"),
                           (["--request-timeout", "nan"], "--request-timeout"),
                           (["--batch-tokens", "0"], "--batch-tokens"),
                           (["--max-body", "0"], "--max-body")]:
            p = subprocess.run([server_util.WGLLM, "serve", "--port", "0", *args], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(p.returncode, 1, (args, p.stderr))
            lines = p.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, (args, p.stderr))
            self.assertIn(flag, lines[0])
            self.assertNotIn("listening", p.stderr)


class QueueFull(ErrorsBase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--parallel", "1", "--queue", "1")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_queue_full(self):
        # One slot and one place in the queue: of 6 long requests sent together, at least the 3rd on are refused
        # with 503 (each takes a good part of a second; they arrive within milliseconds).
        body = {"prompt": [1, 2, 3], "max_tokens": 200, "temperature": 0}

        def send(_):
            return self.post("/completions", body)

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(send, range(6)))
        codes = sorted(r.status_code for r in responses)
        self.assertGreaterEqual(codes.count(200), 1, codes)
        self.assertGreaterEqual(codes.count(503), 1, codes)
        self.assertEqual(codes.count(200) + codes.count(503), 6, codes)
        for r in responses:
            if r.status_code == 503:
                self.assertError(r, 503, code="queue_full", words="queue")
        m = server_util.wait_idle(self.server.url)
        self.assertEqual((m["wgllm_requests_active"], m["wgllm_requests_queued"]), (0, 0))
        self.assertEqual(m['wgllm_http_requests_total{endpoint="/v1/completions",code="503"}'], codes.count(503))
        # the server still answers once the queue has room
        self.assertEqual(self.post("/completions", {"prompt": "x", "max_tokens": 1}).status_code, 200)


if __name__ == "__main__":
    server_util.main(__name__)
