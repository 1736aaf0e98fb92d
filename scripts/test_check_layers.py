#!/usr/bin/env python3
"""Tests of check_layers.py: the repository passes, and a planted upward, sideways or CLI-internal include fails."""
import pathlib
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
CHECK = HERE / "check_layers.py"


def run(root) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True)


def planted(file: str, include: str) -> subprocess.CompletedProcess:
    """check_layers on a copy of the code with `#include "include"` added to `file`."""
    with tempfile.TemporaryDirectory() as tmp:
        for d in ("include", "src", "server", "tools/wgllm", "bench"):
            if (ROOT / d).is_dir():
                shutil.copytree(ROOT / d, pathlib.Path(tmp) / d)
        path = pathlib.Path(tmp) / file
        path.write_text(f'#include "{include}"\n' + path.read_text(encoding="utf-8"), encoding="utf-8")
        return run(tmp)


def main() -> int:
    failures = []
    clean = run(ROOT)
    if clean.returncode != 0:
        failures.append("the repository itself fails:\n" + clean.stdout)
    for file, include, words in [
        ("src/gguf/file.h", "model/config.h", "higher layer"),       # the file format reaching up to the model
        ("src/kernels/norm.h", "model/transformer.h", "higher layer"),
        ("src/kernels/matmul.h", "cpu/ops.h", "peer"),                # kernels and their CPU references are peers
        ("src/jinja/value.h", "tokenizer/chat.h", "higher layer"),    # the template language knows no tokenizer
        ("src/jinja/template.h", "gguf/file.h", "peer"),              # nor the file format
        ("src/model/config.h", "api/sampling.h", "higher layer"),
        ("src/gpu/context.h", "wgllm/wgllm.h", "higher layer"),       # below the API, nothing includes it
        ("include/wgllm/wgllm.h", "gguf/file.h", "may include only"),  # public headers stand alone
        ("tools/wgllm/main.cpp", "model/config.h", "may include only"),  # the CLI uses the public API only
        ("server/server.cpp", "model/config.h", "may include only"),     # so does the HTTP server
        ("server/openai.h", "api/sampling.h", "may include only"),
        ("src/api/wgllm.cpp", "server/server.h", "higher layer"),        # the library knows nothing of the server
    ]:
        r = planted(file, include)
        if r.returncode != 1 or words not in r.stdout or file not in r.stdout:
            failures.append(f"planted '{include}' in {file}: exit {r.returncode}, output:\n{r.stdout}{r.stderr}")
    for f in failures:
        print("FAIL:", f)
    print(f"test_check_layers: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
