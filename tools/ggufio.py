"""Small, dependency-free (numpy only) GGUF reader/writer and the block quantisers used by the test tooling.

The reader is deliberately independent of the `gguf` Python package so that tools which run on machines without
it (hf_reference.py on a PyTorch box) can still read models, and so that tests can cross-check the two.

Supported tensor types: F32, F16, BF16, Q8_0, Q4_0, Q4_K, MXFP4, I32 (enough for models written by make_model.py and for
the reference fixtures written by hf_reference.py).
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# ggml tensor types
F32, F16, Q4_0, Q8_0, Q4_K, I32, BF16, MXFP4 = 0, 1, 2, 8, 12, 26, 30, 39
TYPE_NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q8_0: "Q8_0", Q4_K: "Q4_K", I32: "I32", BF16: "BF16",
              MXFP4: "MXFP4"}
# (elements per block, bytes per block)
BLOCK = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q8_0: (32, 34), Q4_K: (256, 144), I32: (1, 4), BF16: (1, 2),
         MXFP4: (32, 17)}

# gguf metadata value types
(T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64) = range(13)
_SCALAR = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i", T_F32: "<f",
           T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}


# ---------------------------------------------------------------------------------------------------------------
# quantisers (bit-exact with ggml's reference quantize_row_*_ref)

def _roundf(x: np.ndarray) -> np.ndarray:
    """C roundf: halves away from zero, exact for every float32 (no x + 0.5 rounding error)."""
    t = np.trunc(x)
    return t + np.sign(x) * (np.abs(x - t) >= 0.5)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """rows of float32 [..., k] (k % 32 == 0) -> uint8 [..., k/32*34]: per block f16 d = amax/127, int8 q."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    shape = x.shape
    b = x.reshape(-1, 32)
    d = (np.abs(b).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = _roundf(b * inv).astype(np.int8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // 32 * 34)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """rows of float32 [..., k] -> uint8 [..., k/32*18]: d = (signed value of largest magnitude)/-8,
    q = min(15, trunc(x/d + 8.5)); element j in the low nibble of byte j, element j+16 in the high nibble."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    shape = x.shape
    b = x.reshape(-1, 32)
    imax = np.abs(b).argmax(axis=1)[:, None]
    mx = np.take_along_axis(b, imax, axis=1)
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.minimum(np.trunc(b * inv + np.float32(8.5)), 15).astype(np.uint8)
    qs = q[:, :16] | (q[:, 16:] << np.uint8(4))
    out = np.concatenate([d.astype(np.float16).view(np.uint8), qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // 32 * 18)


# MXFP4: ggml's table of the 16 E2M1 codes, each value doubled (integers); the E8M0 scale is halved to match.
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> float32 2^(e - 128), from bits as ggml's GGML_E8M0_TO_FP32_HALF (subnormal for e < 2)."""
    e = np.asarray(e, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << np.minimum(e, 1), (np.maximum(e, 1) - 1) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    """rows of float32 [..., k] -> uint8 [..., k/32*17]: per block e = floor(log2(amax)) - 2 + 127 (0 for an
    all-zero block; log2 in float32 as ggml's log2f and the gguf package take it), then each
    element the code whose value (MXFP4_VALUES * e8m0_half(e)) is nearest, the first code on a tie; element j in
    the low nibble of byte j, element j+16 in the high nibble."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    shape = x.shape
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    with np.errstate(divide="ignore"):
        lg = np.floor(np.log2(np.where(amax > 0, amax, np.float32(1))))
    # below 2^-125 ggml's cast of a negative exponent to uint8 is undefined; here it is 0
    e = np.where(amax > 0, np.clip(lg.astype(np.int64) - 2 + 127, 0, 255), 0).astype(np.uint8)
    d = e8m0_half(e)
    codes = np.empty(b.shape, dtype=np.uint8)
    step = 1 << 14  # blocks at a time: the distances to all 16 values are 2 KiB a block
    for i in range(0, b.shape[0], step):
        vals = d[i:i + step, None, None] * MXFP4_VALUES[None, None, :]
        codes[i:i + step] = np.argmin(np.abs(vals - b[i:i + step, :, None]), axis=2)
    qs = codes[:, :16] | (codes[:, 16:] << np.uint8(4))
    out = np.concatenate([e[:, None], qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // 32 * 17)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """rows of float32 [..., k] (k % 256 == 0) -> uint8 [..., k/256*144]: a simple Q4_K, not ggml's searched one.
    Per sub-block of 32: scale (max - min') / 15 and min -min' (min' = min(min, 0)); per super-block of 256, f16 d and
    dmin = the largest scale and min / 63; each sub-block's 6-bit scale and min rounded against them; quants
    round((x + dmin m) / (d sc)) in 0..15. Layout as ggml's block_q4_K: d, dmin, 12 scale bytes, 128 quant bytes
    (sub-block 2k in the low nibbles of bytes 32k.., 2k + 1 in their high nibbles)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    shape = x.shape
    b = x.reshape(-1, 8, 32)
    lo = np.minimum(b.min(axis=2), 0)
    scale = (b.max(axis=2) - lo) / np.float32(15)
    mins = -lo
    d16 = (scale.max(axis=1) / np.float32(63)).astype(np.float16)
    m16 = (mins.max(axis=1) / np.float32(63)).astype(np.float16)
    d, dm = d16.astype(np.float32)[:, None], m16.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.clip(_roundf(scale / d), 0, 63), 0).astype(np.uint8)
        mn = np.where(dm > 0, np.clip(_roundf(mins / dm), 0, 63), 0).astype(np.uint8)
        eff_d = (d * sc)[:, :, None]
        eff_m = (dm * mn)[:, :, None]
        q = np.where(eff_d > 0, np.clip(_roundf((b + eff_m) / eff_d), 0, 15), 0).astype(np.uint8)
    scales = np.concatenate([(sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6), (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6),
                             (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)], axis=1).astype(np.uint8)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << np.uint8(4))).reshape(-1, 128)
    out = np.concatenate([d16[:, None].view(np.uint8), m16[:, None].view(np.uint8), scales, qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // 256 * 144)


def decode_q4_k(raw: np.ndarray) -> np.ndarray:
    """Q4_K blocks (uint8 [n, 144]) -> float32 [n * 256]."""
    b = raw.reshape(-1, 144)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    dm = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    s = b[:, 4:16].astype(np.uint8)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1).astype(np.float32)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1).astype(np.float32)
    qs = b[:, 16:].reshape(-1, 4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dm * mn)[:, :, None]).reshape(-1)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even, NaN kept quiet (as ggml_compute_fp32_to_bf16)."""
    n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    r = (n + (0x7FFF + ((n >> 16) & 1))) >> 16
    r = np.where(nan, ((n >> 16) & 0xFFFF) | 64, r)
    return r.astype(np.uint16)


def encode(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """float32 rows -> the raw bytes/values stored in the file for ggml_type."""
    if ggml_type == F32:
        return np.ascontiguousarray(x, dtype=np.float32)
    if ggml_type == F16:
        return np.ascontiguousarray(x, dtype=np.float32).astype(np.float16)
    if ggml_type == BF16:
        return to_bf16(x)
    if ggml_type == Q8_0:
        return quantize_q8_0(x)
    if ggml_type == Q4_0:
        return quantize_q4_0(x)
    if ggml_type == Q4_K:
        return quantize_q4_k(x)
    if ggml_type == MXFP4:
        return quantize_mxfp4(x)
    raise ValueError(f"unsupported type {ggml_type}")


def decode(raw: np.ndarray, ggml_type: int, n_elements: int) -> np.ndarray:
    """raw tensor bytes -> flat float32 (I32 stays int32)."""
    raw = np.ascontiguousarray(raw).view(np.uint8)
    if ggml_type == F32:
        return raw.view(np.float32)[:n_elements].copy()
    if ggml_type == I32:
        return raw.view(np.int32)[:n_elements].copy()
    if ggml_type == F16:
        return raw.view(np.float16)[:n_elements].astype(np.float32)
    if ggml_type == BF16:
        return (raw.view(np.uint16)[:n_elements].astype(np.uint32) << 16).view(np.float32)
    if ggml_type == Q8_0:
        b = raw.reshape(-1, 34)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        q = b[:, 2:].view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)[:n_elements]
    if ggml_type == Q4_0:
        b = raw.reshape(-1, 18)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        qs = b[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8
        return (d * q).reshape(-1)[:n_elements]
    if ggml_type == Q4_K:
        return decode_q4_k(raw)[:n_elements]
    if ggml_type == MXFP4:
        b = raw.reshape(-1, 17)
        qs = b[:, 1:]
        q = MXFP4_VALUES[np.concatenate([qs & 0x0F, qs >> 4], axis=1)]
        with np.errstate(over="ignore"):  # e > 252 overflows, as in ggml
            return (e8m0_half(b[:, :1]) * q).reshape(-1)[:n_elements]
    raise ValueError(f"unsupported type {ggml_type}")


def nbytes(ggml_type: int, n_elements: int) -> int:
    be, bb = BLOCK[ggml_type]
    assert n_elements % be == 0, (ggml_type, n_elements)
    return n_elements // be * bb


# ---------------------------------------------------------------------------------------------------------------
# reader

@dataclass
class Tensor:
    name: str
    ne: list[int]          # ggml order: ne[0] is the contiguous (row) dimension
    type: int
    offset: int            # relative to the data section
    data: np.ndarray = field(repr=False, default=None)  # raw bytes (memory-mapped)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne))

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy shape (reversed ne): a weight with ne = [in, out] is an [out, in] array (torch Linear layout)."""
        return tuple(reversed(self.ne))

    def numpy(self, dtype=np.float32) -> np.ndarray:
        return decode(self.data, self.type, self.n_elements).reshape(self.shape).astype(dtype, copy=False)


class Reader:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.buf = np.memmap(self.path, dtype=np.uint8, mode="r")
        self.pos = 0
        if bytes(self.buf[:4]) != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        self.pos = 4
        self.version = self._u("<I")
        if self.version not in (2, 3):
            raise ValueError(f"{path}: unsupported GGUF version {self.version}")
        n_tensors = self._u("<Q")
        n_kv = self._u("<Q")
        self.kv: dict[str, object] = {}
        for _ in range(n_kv):
            key = self._str()
            self.kv[key] = self._value(self._u("<I"))
        self.tensors: dict[str, Tensor] = {}
        for _ in range(n_tensors):
            name = self._str()
            nd = self._u("<I")
            ne = [self._u("<Q") for _ in range(nd)]
            t = Tensor(name, ne, self._u("<I"), self._u("<Q"))
            self.tensors[name] = t
        align = int(self.kv.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_offset = (self.pos + align - 1) // align * align
        for t in self.tensors.values():
            start = self.data_offset + t.offset
            t.data = self.buf[start:start + nbytes(t.type, t.n_elements)]

    def _u(self, fmt: str):
        size = struct.calcsize(fmt)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def _str(self) -> str:
        n = self._u("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="surrogateescape")
        self.pos += n
        return s

    def _value(self, vtype: int):
        if vtype == T_STR:
            return self._str()
        if vtype == T_ARR:
            itype = self._u("<I")
            n = self._u("<Q")
            if itype in _SCALAR and itype != T_BOOL:
                dt = np.dtype(_SCALAR[itype])
                arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos).copy()
                self.pos += n * dt.itemsize
                return arr
            return [self._value(itype) for _ in range(n)]
        return self._u(_SCALAR[vtype])

    def get(self, key: str, default=None):
        return self.kv.get(key, default)

    def tensor(self, name: str, dtype=np.float32) -> np.ndarray:
        return self.tensors[name].numpy(dtype)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_digest(reader: Reader) -> str:
    """sha256 over tensor names, types, shapes and bytes (independent of tokenizer metadata)."""
    h = hashlib.sha256()
    for name in sorted(reader.tensors):
        t = reader.tensors[name]
        h.update(f"{name}:{t.type}:{t.ne}\n".encode())
        h.update(memoryview(np.ascontiguousarray(t.data)))
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# minimal writer (used for reference fixtures where the `gguf` package may be missing)

def _pack_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_kv(key: str, value) -> bytes:
    out = _pack_str(key)
    if isinstance(value, bool):
        return out + struct.pack("<I?", T_BOOL, value)
    if isinstance(value, int):
        return out + struct.pack("<Iq", T_I64, value) if value < 0 or value >= 2**32 else \
            out + struct.pack("<II", T_U32, value)
    if isinstance(value, float):
        return out + struct.pack("<If", T_F32, value)
    if isinstance(value, str):
        return out + struct.pack("<I", T_STR) + _pack_str(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return out + struct.pack("<IIQ", T_ARR, T_STR, len(value)) + b"".join(_pack_str(v) for v in value)
    arr = np.asarray(value)
    code = {np.dtype(np.int32): T_I32, np.dtype(np.float32): T_F32, np.dtype(np.uint32): T_U32}[arr.dtype]
    return out + struct.pack("<IIQ", T_ARR, code, arr.size) + arr.astype(arr.dtype.newbyteorder("<")).tobytes()


def write_simple(path: str | Path, kv: dict, tensors: dict[str, np.ndarray]) -> None:
    """Write a GGUF v3 with F32 / I32 tensors (numpy shape [.., rows, cols] -> ne = reversed)."""
    head = GGUF_MAGIC + struct.pack("<IQQ", 3, len(tensors), len(kv))
    head += b"".join(_pack_kv(k, v) for k, v in kv.items())
    blobs, offset = [], 0
    for name, arr in tensors.items():
        if arr.dtype == np.int32:
            t = I32
        else:
            arr, t = arr.astype(np.float32), F32
        head += _pack_str(name) + struct.pack("<I", arr.ndim)
        head += b"".join(struct.pack("<Q", d) for d in reversed(arr.shape))
        head += struct.pack("<IQ", t, offset)
        b = np.ascontiguousarray(arr).tobytes()
        pad = (-len(b)) % DEFAULT_ALIGNMENT
        blobs.append(b + b"\0" * pad)
        offset += len(b) + pad
    head += b"\0" * ((-len(head)) % DEFAULT_ALIGNMENT)
    with open(path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)
