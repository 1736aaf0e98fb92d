#!/usr/bin/env python3
"""Checks that includes only point down the layers of wgllm (docs/ARCHITECTURE.md).

Each folder of the code belongs to a layer; a file may include headers of its own folder or of a lower layer, never
of a higher one nor of another folder of its own layer. Exits 1 and prints every offending include ("file:line:
includes 'x' (layer of x) from layer of file") when one points up or sideways; 0 otherwise.

    scripts/check_layers.py [ROOT]      ROOT: the repository (default: this script's parent folder)
"""
import pathlib
import re
import sys

# Bottom to top. A folder's key is its path from the repository root; `include/wgllm/error.h` is the floor.
LAYERS = [
    ["include/wgllm/error.h"],
    ["src/gguf", "src/jinja"],
    ["src/gpu"],
    ["src/kernels", "src/cpu", "src/tokenizer"],
    ["src/model"],
    ["src/api", "include/wgllm"],
    ["server"],
    ["tools/wgllm", "bench"],
]
# Folders that are one unit: the public headers and the library code that implements them.
SAME_UNIT = {"include/wgllm": "src/api"}
# Folders that may include only these (besides themselves and the floor): the public headers stand alone, the HTTP
# server is a user of the public API like any other, and the command-line tool uses the public API and the server.
ONLY = {"include/wgllm": ["include/wgllm"], "server": ["include/wgllm"], "tools/wgllm": ["include/wgllm", "server"]}
# Where quoted includes are looked up: the include directories of the build (CMakeLists.txt); "." is the repository
# root, through which the CLI names the server's headers ("server/server.h").
INCLUDE_DIRS = ["include", "src", "."]
SOURCE_DIRS = ["include", "src", "server", "tools/wgllm", "bench"]
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def unit_of(rel: str):
    """(layer index, folder key) of a repository-relative path, or None outside the layered code."""
    best = None
    for i, keys in enumerate(LAYERS):
        for key in keys:
            if rel == key or rel.startswith(key + "/"):
                if best is None or len(key) > len(best[1]):
                    best = (i, key)
    return best


def resolve(root: pathlib.Path, src: pathlib.Path, name: str):
    for base in [src.parent] + [root / d for d in INCLUDE_DIRS]:
        p = base / name
        if p.is_file():
            return p.relative_to(root).as_posix()
    return None


def check(root: pathlib.Path) -> list:
    problems = []
    for d in SOURCE_DIRS:
        for path in sorted((root / d).rglob("*")):
            if path.suffix not in (".h", ".cpp") or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            me = unit_of(rel)
            if me is None:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                target = resolve(root, path, m.group(1))
                if target is None:
                    continue  # generated or third-party: not ours to layer
                other = unit_of(target)
                if other is None or SAME_UNIT.get(other[1], other[1]) == SAME_UNIT.get(me[1], me[1]):
                    continue
                if me[1] in ONLY and other[0] > 0 and other[1] not in ONLY[me[1]]:
                    problems.append(f"{rel}:{n}: includes '{m.group(1)}' ({other[1]}); {me[1]} may include only "
                                    + ", ".join(ONLY[me[1]]))
                elif other[0] > me[0]:
                    problems.append(f"{rel}:{n}: includes '{m.group(1)}' ({other[1]}, a higher layer) from {me[1]}")
                elif other[0] == me[0]:
                    problems.append(f"{rel}:{n}: includes '{m.group(1)}' ({other[1]}, a peer of the same layer) "
                                    f"from {me[1]}")
    return problems


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) point up or sideways; the layers, bottom to top: "
              + " -> ".join(" | ".join(k) for k in LAYERS))
        return 1
    print("check_layers: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
