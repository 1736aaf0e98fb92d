#!/usr/bin/env python3
"""`wgllm serve` through the official openai client: chat and completions, streamed and not, usage, log-probabilities,
stop strings, sampling parameters, /v1/models, /health, /metrics and the chat page."""
import unittest

import requests

import server_util
from server_util import MODEL, N_CTX, Server

PROMPTS = ["ROMEO:", "JULIET:\nO Romeo, Romeo", "First Citizen:\nBefore we proceed any further, hear me speak."]


class Api(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--parallel", "4")
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def chat(self, content, **kw):
        return self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)

    def complete(self, prompt, **kw):
        return self.client.completions.create(model=MODEL, prompt=prompt, **kw)

    def test_models(self):
        models = self.client.models.list().data
        self.assertEqual([m.id for m in models], [MODEL])
        self.assertEqual(models[0].object, "model")

    def test_health(self):
        r = requests.get(self.server.url + "/health", timeout=10)
        self.assertEqual((r.status_code, r.json()), (200, {"status": "ok"}))

    def test_chat(self):
        r = self.chat("Hello there", max_tokens=12, temperature=0)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.model, MODEL)
        self.assertTrue(r.id.startswith("chatcmpl-"))
        c = r.choices[0]
        self.assertEqual(c.message.role, "assistant")
        self.assertTrue(c.message.content)
        self.assertIn(c.finish_reason, ("stop", "length"))
        if c.finish_reason == "length":
            self.assertEqual(r.usage.completion_tokens, 12)
        self.assertGreater(r.usage.prompt_tokens, 3)  # the template's markers and the message
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)

    def test_multi_turn_chat(self):
        r = self.client.chat.completions.create(
            model=MODEL, max_tokens=8, temperature=0,
            messages=[{"role": "system", "content": "You are a player."}, {"role": "user", "content": "Speak."},
                      {"role": "assistant", "content": "I will."}, {"role": "user", "content": "Now!"}])
        one = self.chat("Now!", max_tokens=8, temperature=0)
        self.assertGreater(r.usage.prompt_tokens, one.usage.prompt_tokens)  # every turn is in the prompt

    def test_model_may_be_omitted(self):
        r = requests.post(self.server.base_url + "/completions", json={"prompt": "ROMEO:", "max_tokens": 2},
                          timeout=30)
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["model"], MODEL)

    def test_completion_with_token_ids(self):
        ids = [1, 50, 60, 70, 80]
        r = self.complete(ids, max_tokens=5, temperature=0)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.usage.prompt_tokens, len(ids))
        self.assertEqual(r.usage.completion_tokens, 5 if r.choices[0].finish_reason == "length" else
                         r.usage.completion_tokens)

    def test_prompt_cache(self):
        # a prompt that continues an earlier one keeps its positions (the slot that holds them is chosen)
        ids = [1] + [40 + (7 * i) % 300 for i in range(80)]
        r = self.complete(ids, max_tokens=4, temperature=0)
        self.assertEqual(r.usage.prompt_tokens_details.cached_tokens, 0)
        again = self.complete(ids + [33, 34, 35], max_tokens=4, temperature=0)
        self.assertGreaterEqual(again.usage.prompt_tokens_details.cached_tokens, len(ids))
        self.assertEqual(again.usage.prompt_tokens, len(ids) + 3)
        metrics = requests.get(self.server.url + "/metrics", timeout=10).text
        self.assertIn("wgllm_prompt_tokens_cached_total", metrics)
        self.assertIn("wgllm_prompt_tokens_shared_total", metrics)
        self.assertRegex(metrics, r"\nwgllm_kv_pages [1-9]")  # the built-in model's sequences share one pool

    def test_stream_equals_whole_chat(self):
        for p in PROMPTS:
            whole = self.chat(p, max_tokens=24, temperature=0)
            chunks = list(self.chat(p, max_tokens=24, temperature=0, stream=True,
                                    stream_options={"include_usage": True}))
            self.assertEqual(chunks[0].object, "chat.completion.chunk")
            self.assertEqual(chunks[0].choices[0].delta.role, "assistant")  # the role comes first
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            self.assertEqual(text, whole.choices[0].message.content, p)
            finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
            self.assertEqual(finishes[-1], whole.choices[0].finish_reason)
            self.assertTrue(all(f is None for f in finishes[:-1]))
            self.assertEqual(chunks[-1].choices, [])  # the usage chunk is last
            # the streamed request may keep the whole one's cached positions (the prompt cache, from 16 tokens): only
            # that count may differ
            usage = chunks[-1].usage.model_dump()
            usage["prompt_tokens_details"].pop("cached_tokens")
            want = whole.usage.model_dump()
            want["prompt_tokens_details"].pop("cached_tokens")
            self.assertEqual(usage, want)
            self.assertEqual(len({c.id for c in chunks}), 1)

    def test_stream_equals_whole_completions(self):
        for p in PROMPTS:
            whole = self.complete(p, max_tokens=24, temperature=0)
            chunks = list(self.complete(p, max_tokens=24, temperature=0, stream=True))
            self.assertEqual(chunks[0].object, "text_completion")
            self.assertEqual("".join(c.choices[0].text for c in chunks), whole.choices[0].text, p)
            self.assertEqual(chunks[-1].choices[0].finish_reason, whole.choices[0].finish_reason)
            self.assertTrue(all(c.usage is None for c in chunks))  # no usage chunk unless asked

    def test_stream_ends_with_done(self):
        r = requests.post(self.server.base_url + "/completions", stream=True, timeout=30,
                          json={"prompt": "ROMEO:", "max_tokens": 4, "stream": True})
        self.assertEqual(r.headers["Content-Type"], "text/event-stream")
        events = [line for line in r.iter_lines(decode_unicode=True) if line]
        self.assertEqual(events[-1], "data: [DONE]")
        self.assertTrue(all(e.startswith("data: ") for e in events))

    def test_max_tokens_past_the_context_is_clamped(self):
        r = self.complete("ROMEO:", max_tokens=1_000_000, temperature=0)
        self.assertLessEqual(r.usage.prompt_tokens + r.usage.completion_tokens, N_CTX)
        r = self.chat("Hi", max_completion_tokens=3, temperature=0)  # the newer name
        self.assertLessEqual(r.usage.completion_tokens, 3)

    def test_usage_counts_tokens(self):
        r = self.complete("ROMEO:", max_tokens=10, temperature=0, logprobs=0)
        lp = r.choices[0].logprobs
        n = len(lp.tokens)
        if r.choices[0].finish_reason == "length":
            self.assertEqual((r.usage.completion_tokens, n), (10, 10))
        else:  # the end-of-generation token counts as generated but has no text
            self.assertEqual(r.usage.completion_tokens, n + 1)

    def test_chat_logprobs(self):
        r = self.chat("Speak", max_tokens=10, temperature=0, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertGreater(len(content), 0)
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        for t in content:
            self.assertLessEqual(t.logprob, 0)
            self.assertEqual(bytes(t.bytes), t.token.encode())
            self.assertEqual(len(t.top_logprobs), 3)
            tops = [a.logprob for a in t.top_logprobs]
            self.assertEqual(tops, sorted(tops, reverse=True))
            self.assertAlmostEqual(t.logprob, tops[0], places=5)  # greedy: the chosen token is the most likely
            self.assertEqual(t.top_logprobs[0].token, t.token)
        streamed = [t for c in self.chat("Speak", max_tokens=10, temperature=0, logprobs=True, top_logprobs=3,
                                         stream=True) if c.choices and c.choices[0].logprobs
                    for t in c.choices[0].logprobs.content]
        # the streamed request may keep the first one's cached positions (the prompt cache), computed in other
        # chunks: the same tokens, log-probabilities equal but for the last bits
        self.assertEqual([(t.token, [a.token for a in t.top_logprobs]) for t in streamed],
                         [(t.token, [a.token for a in t.top_logprobs]) for t in content])
        for a, b in zip(streamed, content):
            self.assertAlmostEqual(a.logprob, b.logprob, places=4)
        plain = self.chat("Speak", max_tokens=4, temperature=0)
        self.assertIsNone(plain.choices[0].logprobs)

    def test_completion_logprobs(self):
        r = self.complete("ROMEO:", max_tokens=8, temperature=0, logprobs=2)
        lp = r.choices[0].logprobs
        n = len(lp.tokens)
        self.assertGreater(n, 0)
        self.assertEqual([len(lp.token_logprobs), len(lp.top_logprobs), len(lp.text_offset)], [n, n, n])
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        self.assertEqual(lp.text_offset, sorted(lp.text_offset))
        for tok, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertEqual(len(top), 2)
            self.assertIn(tok, top)
            self.assertAlmostEqual(logprob, max(top.values()), places=5)

    def test_stop_strings(self):
        full = self.complete("ROMEO:", max_tokens=40, temperature=0).choices[0].text
        words = full.split()
        self.assertGreater(len(words), 3, full)
        stop = words[2]
        want = full[:full.index(stop)]
        for stream in (False, True):
            for s in (stop, ["zzzz-never", stop]):
                if stream:
                    chunks = list(self.complete("ROMEO:", max_tokens=40, temperature=0, stop=s, stream=True))
                    text, finish = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
                else:
                    r = self.complete("ROMEO:", max_tokens=40, temperature=0, stop=s)
                    text, finish = r.choices[0].text, r.choices[0].finish_reason
                    self.assertLess(r.usage.completion_tokens, 40)  # cancelled at the stop string
                self.assertEqual((text, finish), (want, "stop"), (stream, s))
        # a stop string that never appears changes nothing
        r = self.complete("ROMEO:", max_tokens=40, temperature=0, stop="\u00a7never\u00a7")
        self.assertEqual(r.choices[0].text, full)

    def test_seeded_sampling_repeats(self):
        extra = {"top_k": 50, "min_p": 0.01}  # llama.cpp's parameters, beside OpenAI's
        a = self.complete("ROMEO:", max_tokens=16, temperature=0.9, seed=1234, top_p=0.9, extra_body=extra)
        b = self.complete("ROMEO:", max_tokens=16, temperature=0.9, seed=1234, top_p=0.9, extra_body=extra)
        self.assertEqual(a.choices[0].text, b.choices[0].text)

    def test_penalties(self):
        plain = self.complete("ROMEO:", max_tokens=40, temperature=0).choices[0].text
        penalised = self.complete("ROMEO:", max_tokens=40, temperature=0, frequency_penalty=2.0,
                                  presence_penalty=2.0).choices[0].text
        self.assertNotEqual(plain, penalised)

    def test_chat_page(self):
        r = requests.get(self.server.url + "/", timeout=10)
        self.assertEqual(r.status_code, 200)
        self.assertTrue(r.headers["Content-Type"].startswith("text/html"))
        for element in ('id="input"', 'id="send"', 'id="messages"', "v1/chat/completions"):
            self.assertIn(element, r.text)
        self.assertNotIn("http://", r.text.split("<script>")[0])  # no external assets

    def test_metrics(self):
        self.complete("ROMEO:", max_tokens=3)
        r = requests.get(self.server.url + "/metrics", timeout=10)
        self.assertTrue(r.headers["Content-Type"].startswith("text/plain"))
        m = server_util.parse_metrics(r.text)
        self.assertGreaterEqual(m['wgllm_http_requests_total{endpoint="/v1/completions",code="200"}'], 1)
        self.assertGreaterEqual(m["wgllm_generated_tokens_total"], 3)
        self.assertGreater(m["wgllm_prompt_tokens_total"], 0)
        self.assertGreater(m["wgllm_engine_steps_total"], 0)
        self.assertGreater(m["wgllm_generated_tokens_per_second"], 0)
        self.assertEqual(m["wgllm_parallel_slots"], 4)
        self.assertGreaterEqual(m["wgllm_time_to_first_token_seconds_count"], 1)
        for name in ("wgllm_requests_active", "wgllm_requests_queued", 'wgllm_requests_total{outcome="cancelled"}'):
            self.assertIn(name, m)
        idle = server_util.wait_idle(self.server.url)
        self.assertEqual(idle["wgllm_requests_active"], 0)


if __name__ == "__main__":
    server_util.main(__name__)
