#!/usr/bin/env python3
"""`wgllm serve --chat-template FILE`: what a request holds reaches the template as transformers hands it over:
messages with tool calls and tool results, tools (schemas in the client's key order), chat_template_kwargs; a template
that raises is a 400 carrying its message."""
import json
import pathlib
import tempfile
import unittest

import requests

from server_util import MODEL, Server

# ChatML that prints the tools when there are some; with `probe` set it raises, describing what it was given.
TEMPLATE = r"""{%- if probe is defined and probe -%}
{{- raise_exception('tools=' ~ (tools | map(attribute='function.name') | join(',')) ~ ' roles=' ~ (messages | map(attribute='role') | join(',')) ~ ' call=' ~ messages[1].tool_calls[0].function.name ~ '(' ~ messages[1].tool_calls[0].function.arguments ~ ') thinking=' ~ enable_thinking ~ ' keys=' ~ (tools[0].function.parameters.properties | list | join(','))) -}}
{%- endif -%}
{%- if tools %}<|im_start|>system
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content if m.content is string else '' }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]
MESSAGES = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "get_weather", "arguments": "{\"zeta\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]


# A template that opens the reply's thinking itself, as Qwen3's and DeepSeek-R1's do.
THINKING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


class Templates(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        path = pathlib.Path(cls.tmp.name) / "probe.jinja"
        path.write_text(TEMPLATE, encoding="utf-8")
        cls.server = Server("--parallel", "2", "--chat-template", str(path))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def post(self, body):
        raw = json.dumps({"model": MODEL, "max_tokens": 2, "temperature": 0, **body})
        return requests.post(self.server.base_url + "/chat/completions", data=raw,
                             headers={"Content-Type": "application/json"}, timeout=60)

    def test_request_reaches_the_template(self):
        r = self.post({"messages": MESSAGES, "tools": TOOLS,
                       "chat_template_kwargs": {"probe": True, "enable_thinking": False}})
        self.assertEqual(r.status_code, 400, r.text)
        err = r.json()["error"]
        self.assertEqual(err["param"], "messages")
        self.assertIn("tools=get_weather,search roles=user,assistant,tool call=get_weather({\"zeta\": \"Paris\"}) "
                      "thinking=False keys=zeta,alpha", err["message"])

    def test_tools_are_rendered(self):
        plain = self.post({"messages": MESSAGES})
        with_tools = self.post({"messages": MESSAGES, "tools": TOOLS})
        self.assertEqual((plain.status_code, with_tools.status_code), (200, 200), plain.text + with_tools.text)
        self.assertGreater(with_tools.json()["usage"]["prompt_tokens"], plain.json()["usage"]["prompt_tokens"] + 20)

    def test_tool_choice_none_leaves_the_tools_out(self):
        plain = self.post({"messages": MESSAGES})
        none = self.post({"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"})
        self.assertEqual(none.status_code, 200, none.text)
        self.assertEqual(none.json()["usage"]["prompt_tokens"], plain.json()["usage"]["prompt_tokens"])

    def test_reply_without_calls_is_content(self):
        """The built-in model writes no tool call: with tools, its reply comes back as content, streamed alike."""
        client = self.server.client()
        kw = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=12, temperature=0)
        whole = client.chat.completions.create(**kw).choices[0]
        self.assertTrue(whole.message.content)
        self.assertFalse(whole.message.tool_calls)
        self.assertIn(whole.finish_reason, ("stop", "length"))
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                           if c.choices)
        self.assertEqual(streamed, whole.message.content)

    def test_bad_shapes(self):
        for body, param in [({"messages": MESSAGES, "tools": {"x": 1}}, "tools"),
                            ({"messages": MESSAGES, "chat_template_kwargs": [1]}, "chat_template_kwargs"),
                            ({"messages": MESSAGES, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
                            ({"messages": MESSAGES, "tools": TOOLS, "tool_choice": 3}, "tool_choice")]:
            with self.subTest(body=body):
                r = self.post(body)
                self.assertEqual(r.status_code, 400, r.text)
                self.assertEqual(r.json()["error"]["param"], param)


class Reasoning(unittest.TestCase):
    """The built-in model never writes </think>: after a prompt that opened <think>, its whole reply is reasoning."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = pathlib.Path(cls.tmp.name) / "thinking.jinja"
        cls.path.write_text(THINKING, encoding="utf-8")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_reasoning_apart_and_streamed_alike(self):
        with Server("--parallel", "2", "--chat-template", str(self.path)) as server:
            client = server.client()
            kw = dict(model=MODEL, messages=[{"role": "user", "content": "Speak."}], max_tokens=16, temperature=0)
            whole = client.chat.completions.create(**kw).choices[0].message
            reasoning = whole.model_extra.get("reasoning_content")
            self.assertTrue(reasoning, whole)
            self.assertEqual(whole.content, "")
            parts = {"reasoning_content": "", "content": ""}
            for chunk in client.chat.completions.create(stream=True, **kw):
                if chunk.choices:
                    d = chunk.choices[0].delta
                    parts["content"] += d.content or ""
                    parts["reasoning_content"] += (d.model_extra or {}).get("reasoning_content") or ""
            self.assertEqual(parts, {"reasoning_content": reasoning, "content": ""})
        with Server("--parallel", "2", "--chat-template", str(self.path), "--reasoning-format", "none") as server:
            inline = server.client().chat.completions.create(**kw).choices[0].message
            self.assertEqual(inline.content, reasoning)
            self.assertIsNone(inline.model_extra.get("reasoning_content"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
