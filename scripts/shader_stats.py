#!/usr/bin/env python3
"""What the driver makes of our kernels: runs a command under the Vulkan layer VK_LAYER_WGLLM_shader_stats
(tools/shader_stats/layer.cpp, built as build/shader_stats/) and tabulates what it captured.

    scripts/shader_stats.py OUT_DIR -- build/bin/wgllm-bench ops --types Q4_K --shapes 4096x14336 --no-matmul
    scripts/shader_stats.py --table OUT_DIR        # the table again, from what an earlier run left in OUT_DIR

OUT_DIR receives module-<n>.spv (the SPIR-V naga made of each WGSL module, as the driver got it), pipeline-<n>.txt
(the entry point and, where the driver has VK_KHR_pipeline_executable_properties, every executable's statistics:
registers, shared memory, spills, instruction counts, as the driver names them), pipeline-<n>.<e>.<i>.txt (the
driver's internal representations, where it gives them) and wgsl/ (every WGSL source as compiled: WGLLM_DUMP_SHADERS).
The table has a row per pipeline: its entry point, the WGSL file it came from (paired by creation order), the SPIR-V
size and each statistic. The layer's directory is build/shader_stats unless --layer-dir says otherwise.
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPIRV_MAGIC = 0x07230203


def number(path):
    return int(re.search(r"-(\d+)\.", path.name).group(1))


def read_pipeline(path):
    """{'entry', 'module', 'stats': {name: value}, 'note'} of a pipeline-<n>.txt."""
    out = {"entry": "", "module": "", "stats": {}, "note": ""}
    executable = ""
    for line in path.read_text().splitlines():
        if line.startswith("entry: "):
            out["entry"] = line[7:]
        elif line.startswith("module: "):
            out["module"] = line[8:]
        elif line.startswith("statistics: "):
            out["note"] = line[12:]
        elif line.startswith("executable: "):
            executable = line[12:].split(" | ")[0]
        elif line.startswith("stat "):
            name, value = line[5:].split("  # ")[0].split(" = ", 1)
            key = f"{executable}: {name}" if executable and executable.lower() not in ("compute", "cs") else name
            out["stats"][key] = value
    return out


def table(out_dir):
    out_dir = pathlib.Path(out_dir)
    pipelines = sorted(out_dir.glob("pipeline-*[0-9].txt"), key=number)
    if not pipelines:
        raise SystemExit(f"shader_stats: no pipeline-*.txt in {out_dir} (was the layer loaded?)")
    wgsl = sorted((out_dir / "wgsl").glob("*.wgsl"), key=lambda p: p.stat().st_mtime_ns)
    modules = sorted(out_dir.glob("module-*.spv"), key=number)
    by_module = {m.name: i for i, m in enumerate(modules)}
    rows = [read_pipeline(p) for p in pipelines]
    names = []
    for r in rows:
        names += [k for k in r["stats"] if k not in names]
    header = ["pipeline", "entry", "wgsl", "spirv bytes"] + names
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p, r in zip(pipelines, rows):
        i = by_module.get(r["module"])
        source = wgsl[i].name if i is not None and len(wgsl) == len(modules) else "?"
        size = (out_dir / r["module"]).stat().st_size if (out_dir / r["module"]).exists() else 0
        cells = [p.stem, r["entry"], source, str(size)] + [r["stats"].get(n, "") for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    notes = sorted({r["note"] for r in rows if r["note"]})
    return "\n".join(lines + [f"\n{n}" for n in notes])


def check_spirv(out_dir):
    for m in pathlib.Path(out_dir).glob("module-*.spv"):
        data = m.read_bytes()
        if len(data) < 20 or int.from_bytes(data[:4], "little") != SPIRV_MAGIC:
            raise SystemExit(f"shader_stats: {m} is not SPIR-V")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    ap.add_argument("--layer-dir", default=str(ROOT / "build" / "shader_stats"))
    ap.add_argument("--table", action="store_true", help="only print the table of what OUT_DIR holds")
    args = ap.parse_args()
    if not args.table:
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            ap.error("give a command after --, or --table")
        manifest = pathlib.Path(args.layer_dir) / "VkLayer_wgllm_shader_stats.json"
        if not manifest.exists():
            raise SystemExit(f"shader_stats: no {manifest} (build the target wgllm_shader_stats_layer; it needs "
                             "libvulkan-dev)")
        out = pathlib.Path(args.out_dir)
        (out / "wgsl").mkdir(parents=True, exist_ok=True)
        for old in list(out.glob("module-*.spv")) + list(out.glob("pipeline-*")) + list((out / "wgsl").glob("*")):
            old.unlink()
        env = dict(os.environ, VK_LAYER_PATH=str(manifest.parent), VK_INSTANCE_LAYERS="VK_LAYER_WGLLM_shader_stats",
                   WGLLM_SHADER_STATS_DIR=str(out), WGLLM_DUMP_SHADERS=str(out / "wgsl"))
        code = subprocess.run(command, env=env).returncode
        if code != 0:
            raise SystemExit(f"shader_stats: the command exited with {code}")
    check_spirv(args.out_dir)
    print(table(args.out_dir))


if __name__ == "__main__":
    sys.exit(main())
