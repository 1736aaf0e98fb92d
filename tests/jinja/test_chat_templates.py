#!/usr/bin/env python3
"""Conformance of wgllm's Jinja interpreter with Python's jinja2 on real chat templates.

Every template of llama.cpp's models/templates/ (the llama-cpp-python 0.3.36 sdist that tools/llamacpp.sh unpacks)
is rendered for a set of conversations by `wgllm template` and by jinja2 in the environment transformers'
apply_chat_template renders in (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the
generation tag; tojson, raise_exception and strftime_now as transformers defines them). Each pair must give the same
bytes, or both must refuse. Exits 0 when all match, 1 otherwise (each mismatch shown), 77 (skipped) when the
templates or jinja2 are absent.

    tests/jinja/test_chat_templates.py [--bin build/bin/wgllm] [--templates DIR] [-k NAME_PART] [-v]
"""
import argparse
import datetime
import difflib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATE = "2025-03-07"
BOS, EOS = "<s>", "</s>"

SYSTEM = "You are a helpful assistant. Réponds brièvement — 日本語も可。"
USER = "What's the weather like in \"Paris\" today?\nAnswer in one line."
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "Forecast days", "default": 1},
            },
            "required": ["city"],
        },
    },
}, {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}]
CALL = {"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}

# name -> (messages, tools, add_generation_prompt[, template variables])
CONVERSATIONS = {
    "system_user": ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}], None, True),
    "user_only": ([{"role": "user", "content": "Hello!"}], None, True),
    "multi_turn": ([{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "Hi, who are you?"},
                    {"role": "assistant", "content": "I am an assistant. How can I help?"},
                    {"role": "user", "content": USER}], None, True),
    "prefill": ([{"role": "user", "content": "Write a haiku about the sea."},
                 {"role": "assistant", "content": "Waves fold into foam"}], None, False),
    "tools_list": ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}], TOOLS, True),
    "tool_calls": ([{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": USER},
                    {"role": "assistant", "content": "", "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
                     "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
                    {"role": "assistant", "content": "It is 21.5 °C and clear in Paris."},
                    {"role": "user", "content": "And tomorrow?"}], TOOLS, True),
    # OpenAI's wire form: arguments as a JSON string, content null beside tool calls.
    "tool_calls_string_args": ([{"role": "user", "content": USER},
                                {"role": "assistant", "content": None,
                                 "tool_calls": [dict(CALL, function={"name": "get_weather",
                                                                     "arguments": "{\"city\": \"Paris\"}"})]},
                                {"role": "tool", "tool_call_id": "call12345", "content": "21.5 °C, clear"}],
                               TOOLS, True),
    "reasoning": ([{"role": "user", "content": "What is 2+2?"},
                   {"role": "assistant", "content": "<think>\nSimple: 2+2=4.\n</think>\n\nThe answer is 4.",
                    "reasoning_content": "Simple: 2+2=4."},
                   {"role": "user", "content": "And 3+3?"}], None, True),
    "content_parts": ([{"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
                       {"role": "user", "content": [{"type": "text", "text": "Describe "},
                                                    {"type": "text", "text": "the sea."}]}], None, True),
    # chat_template_kwargs as clients send them to thinking models
    "no_thinking": ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}], TOOLS, True,
                    {"enable_thinking": False, "reasoning_effort": "low", "thinking": False}),
}


def jinja_env():
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """transformers' {% generation %} tag (its AssistantTracker) without the tracking: the body as is."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.strptime(DATE, "%Y-%m-%d").strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_python(env, source, messages, tools, gen, variables):
    try:
        tpl = env.from_string(source)
        return True, tpl.render(messages=messages, tools=tools, documents=None, add_generation_prompt=gen,
                                bos_token=BOS, eos_token=EOS, **variables)
    except Exception as e:  # noqa: BLE001 - any refusal counts as one
        return False, f"{type(e).__name__}: {e}"


def render_wgllm(binary, template, messages_file, tools_file, gen, variables):
    cmd = [binary, "template", "--template", str(template), "--messages", messages_file,
           "--bos-token", BOS, "--eos-token", EOS, "--date", DATE]
    if variables:
        cmd += ["--vars", json.dumps(variables)]
    if tools_file:
        cmd += ["--tools", tools_file]
    if not gen:
        cmd.append("--no-generation-prompt")
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode == 0:
        return True, r.stdout.decode("utf-8")
    return False, r.stderr.decode("utf-8", "replace").strip()


def find_templates(explicit):
    if explicit:
        return pathlib.Path(explicit)
    r = subprocess.run([str(ROOT / "tools" / "llamacpp.sh"), "--src-path"], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return pathlib.Path(r.stdout.strip()) / "models" / "templates"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("WGLLM_BIN", str(ROOT / "build" / "bin" / "wgllm")))
    ap.add_argument("--templates")
    ap.add_argument("-k", default="")
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args()
    try:
        env = jinja_env()
    except ImportError:
        print("skipped: jinja2 is not installed in this Python (scripts/setup.sh puts it in .venv)")
        return 77
    tdir = find_templates(args.templates)
    if tdir is None or not tdir.is_dir():
        print("skipped: llama.cpp's models/templates/ is absent: run tools/llamacpp.sh --src (scripts/test.sh does)")
        return 77
    templates = sorted(p for p in tdir.glob("*.jinja") if args.k in p.name)
    passed = refused = 0
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, (messages, tools, *_) in CONVERSATIONS.items():
            m = os.path.join(tmp, name + ".messages.json")
            pathlib.Path(m).write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
            t = None
            if tools is not None:
                t = os.path.join(tmp, name + ".tools.json")
                pathlib.Path(t).write_text(json.dumps(tools, ensure_ascii=False), encoding="utf-8")
            files[name] = (m, t)
        for path in templates:
            source = path.read_text(encoding="utf-8")
            for name, (messages, tools, gen, *rest) in CONVERSATIONS.items():
                variables = rest[0] if rest else {}
                ok_py, out_py = render_python(env, source, json.loads(json.dumps(messages)), tools, gen, variables)
                ok_wg, out_wg = render_wgllm(args.bin, path, files[name][0], files[name][1], gen, variables)
                if ok_py and ok_wg and out_py == out_wg:
                    passed += 1
                elif not ok_py and not ok_wg:
                    passed += 1
                    refused += 1
                    if args.v:
                        print(f"both refuse {path.name} × {name}: jinja2 {out_py!r} / wgllm {out_wg!r}")
                else:
                    failures.append((path.name, name, ok_py, out_py, ok_wg, out_wg))
    total = len(templates) * len(CONVERSATIONS)
    for tname, cname, ok_py, out_py, ok_wg, out_wg in failures:
        print(f"MISMATCH {tname} × {cname}")
        if ok_py and ok_wg:
            diff = difflib.unified_diff(out_py.splitlines(True), out_wg.splitlines(True), "jinja2", "wgllm", n=1)
            print("".join(list(diff)[:40]))
        else:
            print(f"  jinja2: {'ok' if ok_py else out_py[:300]}\n  wgllm:  {'ok' if ok_wg else out_wg[:300]}")
    print(f"{passed}/{total} renderings identical to jinja2 ({refused} refused by both) over {len(templates)} "
          f"templates × {len(CONVERSATIONS)} conversations")
    # The comparison means something only where jinja2 renders: most pairs must be renderings, not refusals.
    if total == 0 or (passed - refused) < 0.7 * total:
        print(f"too few renderings: {passed - refused} of {total} pairs rendered (the conversations are broken?)")
        return 1
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
