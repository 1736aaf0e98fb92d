#!/usr/bin/env python3
"""The tables of scripts/bench_vs_llamacpp.sh, from the JSON that `wgllm bench --json` and llama.cpp's benches write.

  bench_report.py compare LLAMA_JSON WGLLM_JSON NAME          one row: pp and tg, wgllm beside llama-bench
  bench_report.py batched LLAMA_JSONL WGLLM_JSON NAME P N     llama-batched-bench beside wgllm bench --parallel
  bench_report.py table DIR P N [--sampling TEXT] ID=LABEL...  the wgllm / CUDA / Vulkan table of `table`

`table` reads, for each ID, DIR/ID.wgllm.json (greedy pp and tg), DIR/ID.wgllm-sampled.json (tg while sampling),
DIR/ID.cuda.json and DIR/ID.vulkan.json (llama-bench -o json); a missing file leaves its cells at "-".
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

NAN = float("nan")


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Stat:
    """A median tok/s with its min and max (NaN when not measured)."""

    def __init__(self, median=NAN, lo=NAN, hi=NAN):
        self.median, self.lo, self.hi = median, lo, hi

    @staticmethod
    def of(samples):
        return Stat(statistics.median(samples), min(samples), max(samples)) if samples else Stat()

    def ok(self):
        return not math.isnan(self.median)

    def __str__(self):
        return f"{num(self.median)} [{num(self.lo)}, {num(self.hi)}]" if self.ok() else "-"


def num(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x:,.0f}" if x >= 1000 else f"{x:,.1f}"


def ratio(a: Stat, b: Stat) -> str:
    return f"{a.median / b.median:.2f}" if a.ok() and b.ok() and b.median > 0 else "-"


def llama_stat(tests, kind: str) -> Stat:
    """The pp (n_gen 0) or tg (n_prompt 0) test of a llama-bench JSON list: samples_ts median, min, max."""
    for t in tests or []:
        if (kind == "pp" and t["n_prompt"] > 0 and t["n_gen"] == 0) or \
           (kind == "tg" and t["n_gen"] > 0 and t["n_prompt"] == 0):
            return Stat.of(t["samples_ts"])
    return Stat()


def wgllm_stat(j, kind: str) -> Stat:
    e = (j or {}).get(kind)
    return Stat(e["tokens_per_s"], e["min"], e["max"]) if e else Stat()


def compare(argv):
    llama, wg, name = load(Path(argv[0])), load(Path(argv[1])), argv[2]
    pw, pl = wgllm_stat(wg, "pp"), llama_stat(llama, "pp")
    tw, tl = wgllm_stat(wg, "tg"), llama_stat(llama, "tg")
    print(f"| {name} | {pw.median:,.0f} | {pl.median:,.0f} | {ratio(pw, pl)} | {tw.median:,.1f} | {tl.median:,.1f} "
          f"| {ratio(tw, tl)} |")


def host_us(v):
    return "-" if v != v else f"{v:,.0f}"  # (nan: a JSON from before the engine timed its steps)


def batched(argv):
    path, wg_path, name, p, n = argv
    llama = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            llama[j["pl"]] = j["speed_tg"]
    runs = (load(Path(wg_path)) or {}).get("parallel", [])
    wg = {e["streams"]: e["tokens_per_s"] for e in runs}
    host = {e["streams"]: e.get("host_us_per_step", NAN) for e in runs}
    print(f"\n{name}: pp{p} + tg{n} per stream, aggregate generation t/s")
    print("| streams | wgllm | vs 1 stream | llama.cpp S_TG | vs 1 stream | wgllm / llama.cpp | wgllm host us / step |")
    print("|---|---|---|---|---|---|---|")
    w1, l1 = wg.get(1), llama.get(1)
    for k in sorted(set(wg) | set(llama)):
        w, l = wg.get(k, NAN), llama.get(k, NAN)
        print(f"| {k} | {w:,.1f} | {w / w1 if w1 else NAN:.2f}x | {l:,.1f} | {l / l1 if l1 else NAN:.2f}x "
              f"| {w / l:.2f} | {host_us(host.get(k, NAN))} |")


def table(argv):
    d, p, n = Path(argv[0]), argv[1], argv[2]
    rest = argv[3:]
    sampling = "--temp 0.8 --top-p 0.9 --top-k 40"
    if rest[:1] == ["--sampling"]:
        sampling, rest = rest[1], rest[2:]
    rows = [r.split("=", 1) for r in rest]

    data = {}
    for rid, _ in rows:
        wg, ws = load(d / f"{rid}.wgllm.json"), load(d / f"{rid}.wgllm-sampled.json")
        cu, vk = load(d / f"{rid}.cuda.json"), load(d / f"{rid}.vulkan.json")
        data[rid] = dict(pp=wgllm_stat(wg, "pp"), tg=wgllm_stat(wg, "tg"), ts=wgllm_stat(ws, "tg"),
                         cpp=llama_stat(cu, "pp"), ctg=llama_stat(cu, "tg"),
                         vpp=llama_stat(vk, "pp"), vtg=llama_stat(vk, "tg"), raw=(wg, ws, cu, vk))

    print(f"| model | pp{p} wgllm | ÷ CUDA | ÷ Vulkan | tg{n} wgllm (greedy) | ÷ CUDA | ÷ Vulkan "
          f"| tg{n} sampled ({sampling}) | ÷ CUDA |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rid, label in rows:
        s = data[rid]
        print(f"| {label} | {num(s['pp'].median)} | {ratio(s['pp'], s['cpp'])} | {ratio(s['pp'], s['vpp'])} "
              f"| {num(s['tg'].median)} | {ratio(s['tg'], s['ctg'])} | {ratio(s['tg'], s['vtg'])} "
              f"| {num(s['ts'].median)} | {ratio(s['ts'], s['ctg'])} |")
    print(f"\nRatios are wgllm ÷ llama.cpp (medians; above 1: wgllm faster). llama-bench samples no token, so the "
          f"sampled column is divided by the same CUDA tg{n}.")

    print("\nllama.cpp, tok/s median [min, max]:\n")
    print(f"| model | pp{p} CUDA | pp{p} Vulkan | tg{n} CUDA | tg{n} Vulkan |")
    print("|---|---|---|---|---|")
    for rid, label in rows:
        s = data[rid]
        print(f"| {label} | {s['cpp']} | {s['vpp']} | {s['ctg']} | {s['vtg']} |")

    print("\nwgllm, tok/s median [min, max]:\n")
    print(f"| model | pp{p} | tg{n} greedy | tg{n} sampled |")
    print("|---|---|---|---|")
    for rid, label in rows:
        s = data[rid]
        print(f"| {label} | {s['pp']} | {s['tg']} | {s['ts']} |")

    # where it ran, from the first row that has each
    seen = {}
    for rid, _ in rows:
        wg, ws, cu, vk = data[rid]["raw"]
        for key, j in (("wgllm", wg or ws), ("CUDA", cu), ("Vulkan", vk)):
            if key in seen or not j:
                continue
            if key == "wgllm":
                seen[key] = f"wgllm: {j.get('adapter', '?')}"
                if ws and "tg" in ws:
                    seen[key] += f"; sampled: {ws['tg'].get('sampling', '?')}"
            elif j:
                t = j[0]
                seen[key] = (f"llama.cpp {key}: build {t.get('build_commit', '?')}, backends {t.get('backends', '?')}, "
                             f"{t.get('gpu_info', '') or t.get('cpu_info', '')}, flash_attn {t.get('flash_attn')}, "
                             f"n_ubatch {t.get('n_ubatch')}")
    if seen:
        print()
        for key in ("wgllm", "CUDA", "Vulkan"):
            if key in seen:
                print(f"- {seen[key]}")


def main():
    cmds = {"compare": (compare, 3), "batched": (batched, 5), "table": (table, 4)}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds or len(sys.argv) - 2 < cmds[sys.argv[1]][1]:
        sys.exit(__doc__)
    cmds[sys.argv[1]][0](sys.argv[2:])


if __name__ == "__main__":
    main()
