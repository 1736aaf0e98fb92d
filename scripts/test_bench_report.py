#!/usr/bin/env python3
"""scripts/bench_report.py on JSON shaped as `wgllm bench --json` and `llama-bench -o json` write it."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPORT = Path(__file__).resolve().parent / "bench_report.py"


def llama_bench(pp_samples, tg_samples, depth=0):
    common = dict(build_commit="0c1e570", backends="CUDA", gpu_info="NVIDIA H200", cpu_info="x", flash_attn=True,
                  n_ubatch=512, n_depth=depth)
    return [dict(common, n_prompt=512, n_gen=0, samples_ts=pp_samples, avg_ts=sum(pp_samples) / len(pp_samples)),
            dict(common, n_prompt=0, n_gen=128, samples_ts=tg_samples, avg_ts=sum(tg_samples) / len(tg_samples))]


def wgllm_bench(pp=None, tg=None, sampling=None):
    j = {"adapter": "NVIDIA H200", "depth": 0}
    if pp:
        j["pp"] = {"n": 512, "tokens_per_s": pp[0], "min": pp[1], "max": pp[2]}
    if tg:
        j["tg"] = {"n": 128, "tokens_per_s": tg[0], "min": tg[1], "max": tg[2]}
        if sampling:
            j["tg"]["sampling"] = sampling
    return j


def report(*args) -> str:
    return subprocess.run([sys.executable, str(REPORT), *map(str, args)], check=True, capture_output=True,
                          text=True).stdout


class Table(unittest.TestCase):
    def test_medians_ratios_and_missing_cells(self):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            # the slow first pp repeat does not move the median
            (d / "a.cuda.json").write_text(json.dumps(llama_bench([40000, 80000, 81000, 79000, 80500],
                                                                   [800, 790, 810])))
            (d / "a.vulkan.json").write_text(json.dumps(llama_bench([60000, 62000, 61000], [700, 690, 705])))
            (d / "a.wgllm.json").write_text(json.dumps(wgllm_bench(pp=(8000, 7900, 8100), tg=(880, 870, 890))))
            (d / "a.wgllm-sampled.json").write_text(json.dumps(wgllm_bench(tg=(400, 390, 410), sampling="temp 0.8")))
            (d / "b.wgllm.json").write_text(json.dumps(wgllm_bench(pp=(5000, 4900, 5100), tg=(700, 690, 710))))
            out = report("table", d, 512, 128, "a=Model A", "b=Model B, depth 4096").splitlines()
            rows = [line for line in out if line.startswith("| Model")]
            self.assertEqual(rows[0], "| Model A | 8,000 | 0.10 | 0.13 | 880.0 | 1.10 | 1.26 | 400.0 | 0.50 |")
            self.assertEqual(rows[1], "| Model B, depth 4096 | 5,000 | - | - | 700.0 | - | - | - | - |")
            self.assertIn("| Model A | 80,000 [40,000, 81,000] | 61,000 [60,000, 62,000] | 800.0 [790.0, 810.0] "
                          "| 700.0 [690.0, 705.0] |", out)
            self.assertIn("| Model A | 8,000 [7,900, 8,100] | 880.0 [870.0, 890.0] | 400.0 [390.0, 410.0] |", out)
            self.assertIn("| Model B, depth 4096 | - | - | - | - |", out)
            self.assertIn("- wgllm: NVIDIA H200; sampled: temp 0.8", out)
            self.assertTrue(any(line.startswith("- llama.cpp CUDA: build 0c1e570, backends CUDA") for line in out))


class Compare(unittest.TestCase):
    def test_row(self):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            (d / "l.json").write_text(json.dumps(llama_bench([1000, 2000, 3000], [100, 200, 300])))
            (d / "w.json").write_text(json.dumps(wgllm_bench(pp=(1000, 900, 1100), tg=(300, 290, 310))))
            self.assertEqual(report("compare", d / "l.json", d / "w.json", "m").strip(),
                             "| m | 1,000 | 2,000 | 0.50 | 300.0 | 200.0 | 1.50 |")


if __name__ == "__main__":
    unittest.main()
