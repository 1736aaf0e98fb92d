"""Starts the real `wgllm serve` on loopback for the server's tests, and small helpers they share.

The binary comes from $WGLLM_BIN (CTest sets it), else build/bin/wgllm of this checkout. The server picks a free port
(--port 0) and names it on stderr ("listening on http://HOST:PORT"); its log is kept for failure messages.
"""
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
WGLLM = os.environ.get("WGLLM_BIN") or str(ROOT / "build" / "bin" / "wgllm")
# Where tests leave files worth looking at (screenshots): $WGLLM_ARTIFACTS, else build/test-artifacts.
ARTIFACTS = pathlib.Path(os.environ.get("WGLLM_ARTIFACTS") or ROOT / "build" / "test-artifacts")
MODEL = "shakespeare-tiny"  # the built-in model's id
N_CTX = 256  # its context


class Server:
    """`wgllm serve --port 0 ARGS...`; a context manager. stop() sends SIGTERM and checks the exit status is 0."""

    def __init__(self, *args, start_timeout=60):
        self.args = [WGLLM, "serve", "--port", "0", *args]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        found = threading.Event()

        def read():  # keeps the pipe drained for the server's life
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                m = re.search(r"listening on (http://\S+)", line)
                if m:
                    self.url = m.group(1)
                    found.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        deadline = time.time() + start_timeout
        while not found.wait(0.1):
            if self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                raise RuntimeError(f"{' '.join(self.args)} did not start:\n" + "\n".join(self.log))
        self.base_url = self.url + "/v1"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self, timeout=60):
        """SIGTERM, then the exit status must be 0 (in-flight requests finish first)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise RuntimeError(f"the server did not stop within {timeout} s of SIGTERM")
        self.reader.join(5)
        self.proc.stderr.close()
        if self.proc.returncode != 0:
            raise RuntimeError(f"the server exited with {self.proc.returncode}:\n" + "\n".join(self.log[-30:]))

    def client(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.base_url, api_key=kw.pop("api_key", "none"), max_retries=0, **kw)


def parse_metrics(text):
    """Prometheus text -> {'name{labels}': value}; every sample line must parse."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)', line)
        if not m:
            raise AssertionError(f"not a Prometheus sample line: {line!r}")
        out[m.group(1)] = float(m.group(2))
    return out


def metrics(url, headers=None):
    import requests
    r = requests.get(url + "/metrics", headers=headers, timeout=10)
    r.raise_for_status()
    return parse_metrics(r.text)


def wait_idle(url, timeout=10.0, headers=None):
    """The metrics once no sequence is active or queued (or the last seen after `timeout` seconds)."""
    deadline = time.time() + timeout
    while True:
        m = metrics(url, headers)
        if (m["wgllm_requests_active"] == 0 and m["wgllm_requests_queued"] == 0) or time.time() > deadline:
            return m
        time.sleep(0.05)


def main(test_module_name):
    """unittest's main with the log of every server printed on failure; exit status 1 on failure."""
    import unittest
    result = unittest.main(module=test_module_name, exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
