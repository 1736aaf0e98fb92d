"""The gguf Python package's dequantisation, for tests/gguf/test_dequant.cpp.

  dequant_reference.py blocks IN OUT   IN: u32 type id, u32 block count, then the blocks' bytes;
                                       OUT: the dequantised values as little-endian f32
  dequant_reference.py sizes OUT       OUT: one line "id elements bytes" per type of GGML_QUANT_SIZES
"""
import sys
import warnings

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize


def main() -> None:
    if sys.argv[1] == "sizes":
        with open(sys.argv[2], "w") as out:
            for qtype, (elems, nbytes) in GGML_QUANT_SIZES.items():
                out.write(f"{int(qtype)} {elems} {nbytes}\n")
        return
    raw = open(sys.argv[2], "rb").read()
    type_id, n_blocks = np.frombuffer(raw[:8], dtype="<u4")
    qtype = GGMLQuantizationType(int(type_id))
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    blocks = np.frombuffer(raw[8:], dtype=np.uint8)
    assert blocks.size == n_blocks * nbytes, (blocks.size, n_blocks, nbytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # infinite scales make inf * 0: NaN, as in ggml
        with np.errstate(all="ignore"):
            values = dequantize(blocks.reshape(int(n_blocks), nbytes), qtype)
    np.asarray(values, dtype="<f4").reshape(-1).tofile(sys.argv[3])


if __name__ == "__main__":
    main()
