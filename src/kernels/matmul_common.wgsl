// Shared by the weight kernels (matvec.wgsl, matmul.wgsl, embedding.wgsl; each pipeline compiles this
// file followed by one of them): y = x W^T + bias and the embedding gather, with the weight kept in its
// GGUF type and dequantised in the shader; activations and accumulation are f32. The kernel files
// are separate modules, so each entry point's module holds only its own workgroup memory.
//
// Weights (upload_weight in kernels/weight.cpp) live in row-range pieces, one storage binding each; a
// dispatch sees one piece as `w` (array<vec4<u32>>). Every row is padded to nb blocks of 32
// elements (zeros past n_in) and read in units of 8 elements (4 units per block):
//   F32:  block = 8 vec4 of f32 bits, row-major [rows][nb][32]
//   F16:  block = 4 vec4 of packed f16 pairs
//   BF16: block = 4 vec4 of packed bf16 pairs
//   Q8_0: quants [rows][nb] of 2 vec4 (32 int8), then from vec4 scale_off4 the f16
//         scales [rows][nb] packed two per u32
//   Q4_0: quants [rows][nb] of 1 vec4 (16 bytes as in GGUF: element j = low nibble of
//         byte j, element j + 16 = its high nibble), then the f16 scales as for Q8_0
// The other block types keep GGUF's block bytes (gguf/dequant.h), one block after the other in words:
//   Q4_1: 5 words (d|m, qs)           Q5_0: 5 words (qh, qs), d in the scale array as Q4_0's
//   Q5_1: 6 words (d|m, qh, qs)
// and the K-quants, 256-element super-blocks (nb / 8 per row) whose every sub-block of 32 is one of our blocks:
//   Q2_K: 20 words (scales, qs), then from vec4 scale_off4 one u32 d|dmin per super-block
//   Q3_K: 28 words (hmask, qs, scales, d, 2 bytes of padding)
//   Q4_K: 36 words (d|dmin, scales, qs)    Q5_K: 44 words (d|dmin, scales, qh, qs)
//   Q6_K: 52 words (ql, qh, scales), d in the scale array
// Each super-block starts at a multiple of 4 words, so the header (d|dmin and the scales of Q4_K/Q5_K) is
// one vec4 and every pair of quant words a load reads is one half of a vec4.
// The host prepends `const WTYPE: u32` (the GGUF type id: one of the T_* below), `const NT: u32`
// (matvec tokens per dispatch) and, for matvec.wgsl, the shape MV_T, MV_R, MV_G and XV4,
// mv_lane_sum() (a butterfly of subgroup shuffles, or the identity without subgroups) and the
// `matvec` entry point, which passes the subgroup size to matvec_main (1 without subgroups). Barriers are reached in uniform control flow.
//
// Epilogues (flags; matvec and matmul alike): bias, RMSNorm of x folded in (the sum of x^2 is
// gathered while x streams past, the row's dot is scaled at the end), residual accumulation,
// SwiGLU over interleaved (gate, up) row pairs, and rows split across three outputs (q, k, v);
// for one token the matvec can instead rotate q and k (RoPE) and write k and v into the KV cache.

// GGUF (ggml) type ids of the weight types (gguf/types.h).
const T_F32: u32 = 0u;
const T_F16: u32 = 1u;
const T_Q4_0: u32 = 2u;
const T_Q4_1: u32 = 3u;
const T_Q5_0: u32 = 6u;
const T_Q5_1: u32 = 7u;
const T_Q8_0: u32 = 8u;
const T_Q2_K: u32 = 10u;
const T_Q3_K: u32 = 11u;
const T_Q4_K: u32 = 12u;
const T_Q5_K: u32 = 13u;
const T_Q6_K: u32 = 14u;
const T_BF16: u32 = 30u;

struct MatmulParams {
  n_in: u32, n_out: u32, n_tokens: u32, nb: u32,
  row_begin: u32, n_rows: u32, scale_off4: u32, flags: u32,
  x_off: u32, y_off: u32, grid_x: u32, row_tiles: u32,
  split1: u32, split2: u32, y1_off: u32, y2_off: u32,
  eps: f32, y_stride: u32, pos: u32, head_dim: u32,
  rope_dim: u32, kv_f16: u32, kv_k_off: u32, kv_v_off: u32,
}
const FLAG_BIAS: u32 = 1u;        // add bias[row]
const FLAG_LAST_PIECE: u32 = 2u;  // embedding: ids past the table write zero rows
const FLAG_NORM: u32 = 4u;        // RMSNorm x first: y = (x / rms(x) * norm) W^T
const FLAG_ACCUM: u32 = 8u;       // y += result (the residual add)
const FLAG_SWIGLU: u32 = 16u;     // rows are (gate, up) pairs: y[t][i] = silu(row 2i) * row 2i+1
const FLAG_SPLIT: u32 = 32u;      // rows [split1, split2) go to y1, [split2, n_out) to y2
const FLAG_ROPE_KV: u32 = 64u;    // matvec, one token: q (rows < split1) and k rotated, k and v to the cache
const FLAG_NEOX: u32 = 128u;      // with FLAG_ROPE_KV: neox RoPE, pairs (i, i + rope_dim / 2)
const FLAG_GELU: u32 = 256u;      // with FLAG_SWIGLU: gelu_tanh(row 2i) * row 2i+1 (GeGLU, gemma)

@group(0) @binding(0) var<uniform> p: MatmulParams;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> ids: array<u32>;
@group(0) @binding(6) var<storage, read> norm: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> y1: array<f32>;
@group(0) @binding(8) var<storage, read_write> y2: array<f32>;
@group(0) @binding(9) var<storage, read> x4: array<vec4<f32>>;  // x again, as vec4 (matvec with XV4)

struct W8 { lo: vec4<f32>, hi: vec4<f32>, }

fn q_scale(blk: u32) -> f32 {
  let word = w[p.scale_off4 + (blk >> 3u)][(blk >> 1u) & 3u];
  return unpack2x16float(word)[blk & 1u];
}

fn i8x4(a: u32) -> vec4<f32> {
  let s = bitcast<vec4<i32>>(vec4<u32>(a << 24u, a << 16u, a << 8u, a)) >> vec4<u32>(24u);
  return vec4<f32>(s);
}

fn nib4(a: u32) -> vec4<f32> {
  let n = (vec4<u32>(a) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
  return vec4<f32>(n) - vec4<f32>(8.0);
}

// Eight f16 (four packed pairs) to f32 with integer ops: the f16 exponent and mantissa moved into
// f32 position and rescaled by 2^112 (exact for normals and subnormals; weights are finite).
fn f16x8(v: vec4<u32>) -> W8 {
  let lo = bitcast<vec4<f32>>(((v & vec4<u32>(0x7FFFu)) << vec4<u32>(13u)) | ((v & vec4<u32>(0x8000u)) << vec4<u32>(16u)));
  let hi = bitcast<vec4<f32>>(((v >> vec4<u32>(3u)) & vec4<u32>(0x0FFFE000u)) | (v & vec4<u32>(0x80000000u)));
  let a = lo * 5.192296858534828e33;
  let b = hi * 5.192296858534828e33;
  return W8(vec4<f32>(a.x, b.x, a.y, b.y), vec4<f32>(a.z, b.z, a.w, b.w));
}

fn bf2(a: u32) -> vec2<f32> { return vec2<f32>(bitcast<f32>(a << 16u), bitcast<f32>(a & 0xFFFF0000u)); }

// Word i of the piece, and words i, i + 1 (i even: one half of a vec4).
fn wd(i: u32) -> u32 { return w[i >> 2u][i & 3u]; }
fn wd2(i: u32) -> vec2<u32> {
  let v = w[i >> 2u];
  return select(v.xy, v.zw, (i & 2u) != 0u);
}

// The four bytes of a, each shifted right by sh and masked.
fn bytes4(a: u32, sh: u32, mask: u32) -> vec4<u32> {
  return (vec4<u32>(a) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(sh))) & vec4<u32>(mask);
}

// Byte i (0..15) of a vec4.
fn byte_of(v: vec4<u32>, i: u32) -> u32 { return (v[i >> 2u] >> (8u * (i & 3u))) & 255u; }

// The 5th bits of unit q's 8 elements from qh (bit e of element e), as 16s.
fn high8(qh: u32, q: u32) -> array<vec4<u32>, 2> {
  let b = qh >> (8u * q);
  return array<vec4<u32>, 2>(((vec4<u32>(b) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(4u),
                             ((vec4<u32>(b) >> vec4<u32>(4u, 5u, 6u, 7u)) & vec4<u32>(1u)) << vec4<u32>(4u));
}

// Elements [8 q, + 8) of 32-element block blk (a Q4_1 / Q5_0 / Q5_1 GPU block).
fn load8_q45(blk: u32, q: u32) -> W8 {
  if (WTYPE == T_Q4_1) {
    let b = blk * 5u;
    let dm = unpack2x16float(wd(b));
    let i = b + 1u + 2u * (q & 1u);
    let sh = 4u * (q >> 1u);
    return W8(dm.x * vec4<f32>(bytes4(wd(i), sh, 15u)) + dm.y, dm.x * vec4<f32>(bytes4(wd(i + 1u), sh, 15u)) + dm.y);
  } else if (WTYPE == T_Q5_0) {
    let b = blk * 5u;
    let d = q_scale(blk);
    let hb = high8(wd(b), q);
    let i = b + 1u + 2u * (q & 1u);
    let sh = 4u * (q >> 1u);
    return W8(d * (vec4<f32>(bytes4(wd(i), sh, 15u) | hb[0]) - 16.0),
              d * (vec4<f32>(bytes4(wd(i + 1u), sh, 15u) | hb[1]) - 16.0));
  }
  // T_Q5_1
  let b = blk * 6u;
  let dm = unpack2x16float(wd(b));
  let hb = high8(wd(b + 1u), q);
  let v = wd2(b + 2u + 2u * (q & 1u));
  let sh = 4u * (q >> 1u);
  return W8(dm.x * vec4<f32>(bytes4(v.x, sh, 15u) | hb[0]) + dm.y,
            dm.x * vec4<f32>(bytes4(v.y, sh, 15u) | hb[1]) + dm.y);
}

// Elements [8 q, + 8) of sub-block j (of 8) of K-quant super-block sb. In Q2_K / Q3_K / Q6_K sub-block j is half
// h = j / 4, quarter k = j % 4 of the super-block: its 2-bit quants at bytes 32 h + 8 q .. of the 2-bit array
// (shift 2 k), its two 16-element scales numbers 8 h + 2 k and + 1.
fn load8_k(sb: u32, j: u32, q: u32) -> W8 {
  let h = j >> 2u;
  let k = j & 3u;
  let si = 8u * h + 2u * k + (q >> 1u);  // the 16-element scale of this unit
  if (WTYPE == T_Q2_K) {
    let b = sb * 20u;
    let dm = unpack2x16float(w[p.scale_off4 + (sb >> 2u)][sb & 3u]);
    let sc = byte_of(w[b >> 2u], si);
    let dl = dm.x * f32(sc & 15u);
    let ml = dm.y * f32(sc >> 4u);
    let v = wd2(b + 4u + 8u * h + 2u * q);
    return W8(dl * vec4<f32>(bytes4(v.x, 2u * k, 3u)) - ml, dl * vec4<f32>(bytes4(v.y, 2u * k, 3u)) - ml);
  } else if (WTYPE == T_Q3_K) {
    let b = sb * 28u;
    let tail = w[(b >> 2u) + 6u];  // scales bytes 0..11, then d
    let lo = (byte_of(tail, si & 7u) >> (4u * (si >> 3u))) & 15u;
    let hi = (byte_of(tail, 8u + (si & 3u)) >> (2u * (si >> 2u))) & 3u;
    let dl = unpack2x16float(tail.w).x * (f32(lo | (hi << 4u)) - 32.0);
    let v = wd2(b + 8u + 8u * h + 2u * q);
    let m = wd2(b + 2u * q);
    let hs = 4u * h + k;
    return W8(dl * (vec4<f32>(bytes4(v.x, 2u * k, 3u) + 4u * bytes4(m.x, hs, 1u)) - 4.0),
              dl * (vec4<f32>(bytes4(v.y, 2u * k, 3u) + 4u * bytes4(m.y, hs, 1u)) - 4.0));
  } else if (WTYPE == T_Q6_K) {
    let b = sb * 52u;
    let d = q_scale(sb);
    let sc = f32(bitcast<i32>(byte_of(w[(b >> 2u) + 12u], si) << 24u) >> 24u);
    let dl = d * sc;
    return q6k_unit(wd2(b + 16u * h + 8u * (k & 1u) + 2u * q), wd2(b + 32u + 8u * h + 2u * q), k, dl);
  }
  // T_Q4_K, T_Q5_K: sub-block j the low (j even) or high nibbles of the qs bytes 32 (j / 2) + 8 q ..; Q5_K's 5th
  // bits bit j of qh bytes 8 q ..
  let b = sb * select(36u, 44u, WTYPE == T_Q5_K);
  let dm = k45_scale_min(w[b >> 2u], j);
  let v = wd2(b + select(4u, 12u, WTYPE == T_Q5_K) + 8u * (j >> 1u) + 2u * q);
  var m = vec2<u32>(0u);
  if (WTYPE == T_Q5_K) { m = wd2(b + 4u + 2u * q); }
  return k45_unit(v, m, j, dm);
}

// Q4_K / Q5_K: the scale and min (dl, ml) of sub-block j from the super-block's header (d|dmin, scales bytes 0..11).
fn k45_scale_min(hdr: vec4<u32>, j: u32) -> vec2<f32> {
  let dm = unpack2x16float(hdr.x);
  let jj = j & 3u;
  let s0 = (hdr.y >> (8u * jj)) & 255u;  // scales byte jj
  let s1 = (hdr.z >> (8u * jj)) & 255u;  // byte jj + 4
  let s2 = (hdr.w >> (8u * jj)) & 255u;  // byte jj + 8
  var sc = s0 & 63u;
  var mn = s1 & 63u;
  if (j >= 4u) {
    sc = (s2 & 15u) | ((s0 >> 6u) << 4u);
    mn = (s2 >> 4u) | ((s1 >> 6u) << 4u);
  }
  return vec2<f32>(dm.x * f32(sc), dm.y * f32(mn));
}

// Q4_K / Q5_K: 8 elements of sub-block j from their two quant words v (and, Q5_K, the two qh words m).
fn k45_unit(v: vec2<u32>, m: vec2<u32>, j: u32, dm: vec2<f32>) -> W8 {
  let sh = 4u * (j & 1u);
  var a = bytes4(v.x, sh, 15u);
  var c = bytes4(v.y, sh, 15u);
  if (WTYPE == T_Q5_K) {
    a |= bytes4(m.x, j, 1u) << vec4<u32>(4u);
    c |= bytes4(m.y, j, 1u) << vec4<u32>(4u);
  }
  return W8(dm.x * vec4<f32>(a) - dm.y, dm.x * vec4<f32>(c) - dm.y);
}

// Q6_K: 8 elements of quarter k of a half from their two low-quant words lq and two high-quant words hq.
fn q6k_unit(lq: vec2<u32>, hq: vec2<u32>, k: u32, dl: f32) -> W8 {
  let sh = 4u * (k >> 1u);
  return W8(dl * (vec4<f32>(bytes4(lq.x, sh, 15u) | (bytes4(hq.x, 2u * k, 3u) << vec4<u32>(4u))) - 32.0),
            dl * (vec4<f32>(bytes4(lq.y, sh, 15u) | (bytes4(hq.y, 2u * k, 3u) << vec4<u32>(4u))) - 32.0));
}

// Elements [8 * (u % 4), + 8) of block u / 4 of piece row r.
fn load8(r: u32, u: u32) -> W8 {
  if (WTYPE == T_Q2_K || WTYPE == T_Q3_K || WTYPE == T_Q4_K || WTYPE == T_Q5_K || WTYPE == T_Q6_K) {
    return load8_k(r * (p.nb >> 3u) + (u >> 5u), (u >> 2u) & 7u, u & 3u);
  }
  if (WTYPE == T_Q4_1 || WTYPE == T_Q5_0 || WTYPE == T_Q5_1) {
    return load8_q45(r * p.nb + (u >> 2u), u & 3u);
  }
  let blk = r * p.nb + (u >> 2u);
  let q = u & 3u;
  if (WTYPE == T_F32) {
    let i = blk * 8u + q * 2u;
    return W8(bitcast<vec4<f32>>(w[i]), bitcast<vec4<f32>>(w[i + 1u]));
  } else if (WTYPE == T_F16) {
    let v = w[blk * 4u + q];
    if (F16_INT) { return f16x8(v); }
    return W8(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)),
              vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
  } else if (WTYPE == T_BF16) {
    let v = w[blk * 4u + q];
    return W8(vec4<f32>(bf2(v.x), bf2(v.y)), vec4<f32>(bf2(v.z), bf2(v.w)));
  } else if (WTYPE == T_Q8_0) {
    let v = w[blk * 2u + (q >> 1u)];
    let odd = (q & 1u) == 1u;
    let d = q_scale(blk);
    return W8(d * i8x4(select(v.x, v.z, odd)), d * i8x4(select(v.y, v.w, odd)));
  } else {  // T_Q4_0
    let v = w[blk];
    let odd = (q & 1u) == 1u;
    let sh = select(0u, 4u, q >= 2u);
    let d = q_scale(blk);
    return W8(d * nib4(select(v.x, v.z, odd) >> sh), d * nib4(select(v.y, v.w, odd) >> sh));
  }
}

// x[t][8u .. 8u + 8) of the bound activation window (zeros past n_in).
fn load_x8(t: u32, u: u32) -> W8 {
  let c = u * 8u;
  let b = p.x_off + t * p.n_in + c;
  if (c + 8u <= p.n_in) {
    return W8(vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]),
              vec4<f32>(x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]));
  }
  var a: array<f32, 8>;
  for (var i = 0u; i < 8u; i += 1u) {
    a[i] = 0.0;
    if (c + i < p.n_in) { a[i] = x[b + i]; }
  }
  return W8(vec4<f32>(a[0], a[1], a[2], a[3]), vec4<f32>(a[4], a[5], a[6], a[7]));
}

fn has(f: u32) -> bool { return (p.flags & f) != 0u; }

// 1 / rms of a row of n_in values whose squares sum to ss.
fn inv_rms(ss: f32) -> f32 { return inverseSqrt(ss / f32(p.n_in) + p.eps); }

// Norm weights of unit u (8 elements).
fn norm8(u: u32) -> W8 { return W8(norm[2u * u], norm[2u * u + 1u]); }

// The epilogue: value v of token t, piece row r -> bias, then the output it belongs to.
fn store_y(t: u32, r: u32, v: f32) {
  let g = p.row_begin + r;
  var out = v;
  if (has(FLAG_BIAS)) { out += bias[g]; }
  if (has(FLAG_SPLIT) && g >= p.split1) {
    if (g >= p.split2) {
      y2[p.y2_off + t * (p.n_out - p.split2) + g - p.split2] = out;
    } else {
      y1[p.y1_off + t * (p.split2 - p.split1) + g - p.split1] = out;
    }
    return;
  }
  let i = p.y_off + t * p.y_stride + g;
  if (has(FLAG_ACCUM)) { out += y[i]; }
  y[i] = out;
}

// The bias of rows g and g + 1 (zeros without FLAG_BIAS).
fn bias2(g: u32) -> vec2<f32> {
  if (has(FLAG_BIAS)) { return vec2<f32>(bias[g], bias[g + 1u]); }
  return vec2<f32>(0.0);
}

// SwiGLU epilogue: piece rows r (gate, even) and r + 1 (up) of token t.
fn store_swiglu(t: u32, r: u32, gate: f32, up: f32) {
  let g = p.row_begin + r;
  let bb = bias2(g);
  let a = gate + bb.x;
  let b = up + bb.y;
  // silu(a) = a sigmoid(a); gelu_tanh(a) = a (1 + tanh(u)) / 2 = a sigmoid(2u), u = sqrt(2/pi) (a + 0.044715 a^3).
  // e^-z overflows to inf for z < -88: a / inf = -0, the right limit.
  let z = select(a, 1.5957691216057308 * (a + 0.044715 * a * a * a), has(FLAG_GELU));
  y[p.y_off + t * p.y_stride + g / 2u] = a / (1.0 + exp(-z)) * b;
}
