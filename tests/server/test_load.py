#!/usr/bin/env python3
"""The bounded load test: scripts/load_test.py, 400 requests from 32 clients (mixed endpoints and lengths, some
disconnecting mid-stream) against `wgllm serve --parallel 16`: no failures, every text equal to its lone run (or a
prefix of it when cut), no sequence left active or queued, and the server exits 0 on SIGTERM."""
import json
import subprocess
import sys
import unittest

import server_util


class Load(unittest.TestCase):
    def test_400_requests_from_32_clients(self):
        script = server_util.ROOT / "scripts" / "load_test.py"
        p = subprocess.run([sys.executable, str(script), "--start", server_util.WGLLM, "--parallel", "16",
                            "-n", "400", "-c", "32", "--max-tokens", "4,8,16,24", "--cancel-fraction", "0.1"],
                           capture_output=True, text=True, timeout=600)
        print(p.stdout, p.stderr)
        report = json.loads(p.stdout)
        self.assertEqual((report["failures"], report["wrong"], report["leaked"]), (0, 0, 0), report)
        self.assertNotIn("server_exit", report)
        self.assertEqual(report["completed"] + report["cancelled"], 400)
        self.assertGreater(report["cancelled"], 0)
        self.assertGreater(report["tokens_per_s"], 0)
        self.assertEqual(p.returncode, 0)


if __name__ == "__main__":
    server_util.main(__name__)
