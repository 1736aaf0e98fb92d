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
//   MXFP4: quants as Q4_0's (E2M1 codes: mxfp4x4), then from vec4 scale_off4 the E8M0
//         scale bytes [rows][nb] packed four per u32 (mx_scale)
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
// (matvec tokens per dispatch), the weight's words `wvec(wt, i)` and its scale array's offset `scale_off(wt)` (below)
// and, for matvec.wgsl, the shape MV_T, MV_R, MV_G and XV4,
// mv_lane_sum() (a butterfly of subgroup shuffles, or the identity without subgroups) and the
// `matvec` entry point, which passes the subgroup size to matvec_main (1 without subgroups). Barriers are reached in uniform control flow.
//
// Two weight types in one dispatch (the matvec's, for one token: a Q4_K_M layer's q/k rows in Q4_K and its v rows in
// Q6_K): the prelude then sets `const TWO_TYPES: bool` and `const WTYPE2: u32` and binds the second weight as
// `w2` (binding 18), whose rows are the product's rows from p.split2 on and whose scale array starts at vec4
// p.scale2_off4. The block loaders (load_raw, decode_run, chunk_cols, chunk_xs, chunk_min, q_scale, wd, wd2) take
// the type `wt` they read as their first argument, always a constant at the call (WTYPE or WTYPE2), so that a
// compiler folds their branches as it would a module constant's; `wvec(wt, i)` reads vec4 i of w or w2 by it,
// `wword(wt, i, c)` its word c alone (a 4-byte load where the vec4's would be 16: the scales' reads). With one type
// the loaders that branch on it take WTYPE itself (`let wt = select(wt_in, WTYPE, !TWO_TYPES)`): their branches fold
// inside their own bodies, as before there were two types, whether or not a driver inlines the call.
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
const T_MXFP4: u32 = 39u;

struct MatmulParams {
  n_in: u32, n_out: u32, n_tokens: u32, nb: u32,
  row_begin: u32, n_rows: u32, scale_off4: u32, flags: u32,
  x_off: u32, y_off: u32, grid_x: u32, row_tiles: u32,
  split1: u32, split2: u32, y1_off: u32, y2_off: u32,
  eps: f32, y_stride: u32, pos: u32, head_dim: u32,
  rope_dim: u32, kv_f16: u32, kv_k_off: u32, kv_v_off: u32,
  n_used: u32, x_per_pair: u32, expert_first: u32, n_experts: u32,  // matvec expert products (MV_EXPERTS)
  tiles_off: u32, times_off: u32, times_stride: u32, pre_scale: f32,  // grouped by expert (NT > 1); FLAG_TIMES; MV_PRE
  scale2_off4: u32, route_experts: u32, route_flags: u32, pad2: u32,  // TWO_TYPES: w2's scale array; MV_ROUTE
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
const FLAG_OAI: u32 = 512u;       // with FLAG_SWIGLU: gpt-oss's clamped SwiGLU (store_swiglu)
const FLAG_TIMES: u32 = 1024u;    // y[t][i] = act(row i) * bias[times_off + t * times_stride + i]
const FLAG_SIGMOID: u32 = 2048u;  // with FLAG_TIMES: act = sigmoid (else gelu_tanh with FLAG_GELU, silu)

@group(0) @binding(0) var<uniform> p: MatmulParams;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;  // FLAG_TIMES: the factors of the activated rows
@group(0) @binding(5) var<storage, read> ids: array<u32>;  // embedding: token ids; matvec: experts (MV_EXPERTS)
@group(0) @binding(6) var<storage, read> norm: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> y1: array<f32>;
@group(0) @binding(8) var<storage, read_write> y2: array<f32>;
@group(0) @binding(9) var<storage, read> x4: array<vec4<f32>>;  // x again, as vec4 (matvec with XV4)

struct W8 { lo: vec4<f32>, hi: vec4<f32>, }

fn q_scale(wt: u32, blk: u32) -> f32 {
  let word = wword(wt, scale_off(wt) + (blk >> 3u), (blk >> 1u) & 3u);
  return unpack2x16float(word)[blk & 1u];
}

fn i8x4(a: u32) -> vec4<f32> {
  let s = bitcast<vec4<i32>>(vec4<u32>(a << 24u, a << 16u, a << 8u, a)) >> vec4<u32>(24u);
  return vec4<f32>(s);
}

// MXFP4 (gguf/dequant.h): the scale of block blk from its E8M0 byte e, 2^(e - 128) as ggml's GGML_E8M0_TO_FP32_HALF
// builds it (the exponent e - 1; subnormal 2^-128, 2^-127 for e = 0, 1); e8m0_half alone for a byte already loaded.
fn e8m0_half(e: u32) -> f32 { return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << min(e, 1u), e < 2u)); }
fn mx_scale(wt: u32, blk: u32) -> f32 {
  return e8m0_half((wword(wt, scale_off(wt) + (blk >> 4u), (blk >> 2u) & 3u) >> (8u * (blk & 3u))) & 255u);
}

// The four E2M1 codes at bit sh of the bytes of a (bit 3 the sign, bits 0..2 the magnitude) as ggml's doubled
// values {0, 1, 2, 3, 4, 6, 8, 12}: the magnitude looked up in a u32 of eight nibbles, then made a float with the
// sign in both terms of the 2^23 subtraction (ints), which leaves +0, not -0, for code 8 as ggml's table does.
const MXFP4_MAGS: u32 = 0xC8643210u;
fn mxfp4x4(a: u32, sh: u32) -> vec4<f32> {
  let n = bytes4(a, sh, 15u);
  let mag = (vec4<u32>(MXFP4_MAGS) >> ((n & vec4<u32>(7u)) << vec4<u32>(2u))) & vec4<u32>(15u);
  let big = ((n & vec4<u32>(8u)) << vec4<u32>(28u)) | vec4<u32>(0x4B000000u);  // +-2^23
  return bitcast<vec4<f32>>(big | mag) - bitcast<vec4<f32>>(big);
}
fn mxfp4x16(v: vec4<u32>, sh: u32) -> Q16 {
  return Q16(mxfp4x4(v.x, sh), mxfp4x4(v.y, sh), mxfp4x4(v.z, sh), mxfp4x4(v.w, sh));
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

// Word i of the piece (of type wt: w, or w2 with TWO_TYPES), and words i, i + 1 (i even: one half of a vec4).
fn wd(wt: u32, i: u32) -> u32 { return wword(wt, i >> 2u, i & 3u); }
fn wd2(wt: u32, i: u32) -> vec2<u32> {
  let v = wvec(wt, i >> 2u);
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

// Unit u (elements 8 u ..) of a Q4_1 / Q5_0 / Q5_1 block from its quant words q (words 2 (u % 2) and + 1 of the
// four, nibble u / 2), its 5th bits qh (Q5_*) and d (Q5_0; the others d and m).
fn q45_unit(q: vec2<u32>, qh: u32, u: u32, dm: vec2<f32>) -> W8 {
  let sh = 4u * (u >> 1u);
  var lo = bytes4(q.x, sh, 15u);
  var hi = bytes4(q.y, sh, 15u);
  if (WTYPE != T_Q4_1) {
    let hb = high8(qh, u);
    lo |= hb[0];
    hi |= hb[1];
  }
  if (WTYPE == T_Q5_0) { return W8(dm.x * (vec4<f32>(lo) - 16.0), dm.x * (vec4<f32>(hi) - 16.0)); }
  return W8(dm.x * vec4<f32>(lo) + dm.y, dm.x * vec4<f32>(hi) + dm.y);
}

// Elements [8 q, + 8) of 32-element block blk (a Q4_1 / Q5_0 / Q5_1 GPU block).
fn load8_q45(blk: u32, q: u32) -> W8 {
  if (WTYPE == T_Q4_1) {
    let b = blk * 5u;
    let i = b + 1u + 2u * (q & 1u);
    return q45_unit(vec2<u32>(wd(WTYPE, i), wd(WTYPE, i + 1u)), 0u, q, unpack2x16float(wd(WTYPE, b)));
  } else if (WTYPE == T_Q5_0) {
    let b = blk * 5u;
    let i = b + 1u + 2u * (q & 1u);
    return q45_unit(vec2<u32>(wd(WTYPE, i), wd(WTYPE, i + 1u)), wd(WTYPE, b), q, vec2<f32>(q_scale(WTYPE, blk), 0.0));
  }
  // T_Q5_1
  let b = blk * 6u;
  return q45_unit(wd2(WTYPE, b + 2u + 2u * (q & 1u)), wd(WTYPE, b + 1u), q, unpack2x16float(wd(WTYPE, b)));
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
    let v = wd2(WTYPE, b + 4u + 8u * h + 2u * q);
    return W8(dl * vec4<f32>(bytes4(v.x, 2u * k, 3u)) - ml, dl * vec4<f32>(bytes4(v.y, 2u * k, 3u)) - ml);
  } else if (WTYPE == T_Q3_K) {
    let b = sb * 28u;
    let tail = w[(b >> 2u) + 6u];  // scales bytes 0..11, then d
    let lo = (byte_of(tail, si & 7u) >> (4u * (si >> 3u))) & 15u;
    let hi = (byte_of(tail, 8u + (si & 3u)) >> (2u * (si >> 2u))) & 3u;
    let dl = unpack2x16float(tail.w).x * (f32(lo | (hi << 4u)) - 32.0);
    let v = wd2(WTYPE, b + 8u + 8u * h + 2u * q);
    let m = wd2(WTYPE, b + 2u * q);
    let hs = 4u * h + k;
    return W8(dl * (vec4<f32>(bytes4(v.x, 2u * k, 3u) + 4u * bytes4(m.x, hs, 1u)) - 4.0),
              dl * (vec4<f32>(bytes4(v.y, 2u * k, 3u) + 4u * bytes4(m.y, hs, 1u)) - 4.0));
  } else if (WTYPE == T_Q6_K) {
    let b = sb * 52u;
    let d = q_scale(WTYPE, sb);
    let sc = f32(bitcast<i32>(byte_of(w[(b >> 2u) + 12u], si) << 24u) >> 24u);
    let dl = d * sc;
    return q6k_unit(wd2(WTYPE, b + 16u * h + 8u * (k & 1u) + 2u * q), wd2(WTYPE, b + 32u + 8u * h + 2u * q), k, dl);
  }
  // T_Q4_K, T_Q5_K: sub-block j the low (j even) or high nibbles of the qs bytes 32 (j / 2) + 8 q ..; Q5_K's 5th
  // bits bit j of qh bytes 8 q ..
  let b = sb * select(36u, 44u, WTYPE == T_Q5_K);
  let dm = k45_scale_min(w[b >> 2u], j);
  let v = wd2(WTYPE, b + select(4u, 12u, WTYPE == T_Q5_K) + 8u * (j >> 1u) + 2u * q);
  var m = vec2<u32>(0u);
  if (WTYPE == T_Q5_K) { m = wd2(WTYPE, b + 4u + 2u * q); }
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
    let d = q_scale(WTYPE, blk);
    return W8(d * i8x4(select(v.x, v.z, odd)), d * i8x4(select(v.y, v.w, odd)));
  } else if (WTYPE == T_MXFP4) {  // as Q4_0
    let v = w[blk];
    let odd = (q & 1u) == 1u;
    let sh = select(0u, 4u, q >= 2u);
    let d = mx_scale(WTYPE, blk);
    return W8(d * mxfp4x4(select(v.x, v.z, odd), sh), d * mxfp4x4(select(v.y, v.w, odd), sh));
  } else {  // T_Q4_0
    let v = w[blk];
    let odd = (q & 1u) == 1u;
    let sh = select(0u, 4u, q >= 2u);
    let d = q_scale(WTYPE, blk);
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

// s + a . b as eight fused multiply-adds in element order (batch decode's order: matvec.wgsl's MV_FMA, matmul.wgsl's MM_CLASS).
fn fma8(a: W8, b: W8, s: f32) -> f32 {
  var r = s;
  r = fma(a.lo.x, b.lo.x, r);
  r = fma(a.lo.y, b.lo.y, r);
  r = fma(a.lo.z, b.lo.z, r);
  r = fma(a.lo.w, b.lo.w, r);
  r = fma(a.hi.x, b.hi.x, r);
  r = fma(a.hi.y, b.hi.y, r);
  r = fma(a.hi.z, b.hi.z, r);
  r = fma(a.hi.w, b.hi.w, r);
  return r;
}

// The eight values added in element order (batch decode's order for the block types' sum(x) per half run).
fn sum8(a: W8) -> f32 {
  return ((((((a.lo.x + a.lo.y) + a.lo.z) + a.lo.w) + a.hi.x) + a.hi.y) + a.hi.z) + a.hi.w;
}

// A run's part of a block type's sum in batch decode's order: acc + d dq, then + m s (chunk_min), each one fma (dq the
// run's products fma-chained in element order, s the sum of its x).
fn run_fma(wt_in: u32, d: f32, dq: f32, m: f32, s: f32, acc: f32) -> f32 {
  let wt = select(wt_in, WTYPE, !TWO_TYPES);  // the header: WTYPE itself with one type
  let a = fma(d, dq, acc);
  if (chunk_min(wt)) { return fma(m, s, a); }
  return a;
}

fn has(f: u32) -> bool { return (p.flags & f) != 0u; }

// 1 / rms of a row of n_in values whose squares sum to ss.
fn inv_rms(ss: f32) -> f32 { return inverseSqrt(ss / f32(p.n_in) + p.eps); }

// Norm weights of unit u (8 elements).
fn norm8(u: u32) -> W8 { return W8(norm[2u * u], norm[2u * u + 1u]); }

// The bias of row g is bias[bias_base + g]: bias_base is 0 but in the expert products, where bias holds every
// expert's rows and it is the expert's first.
var<private> bias_base: u32 = 0u;

// Expert products (the matvec's MV_EXPERTS, the tiled matmul's MM_EXPERTS): tile z's words (expert, first pair,
// count, 0) from ids at p.tiles_off, as encode_moe_group made them.
fn expert_tile(z: u32) -> vec4<u32> {
  let at = p.tiles_off + 4u * z;
  return vec4<u32>(ids[at], ids[at + 1u], ids[at + 2u], 0u);
}
const NO_EXPERT: u32 = 0xFFFFFFFFu;
// The piece row of the tile's expert's row 0, with bias_base set to its first bias; NO_EXPERT when the tile is empty
// or its expert is in another piece (the workgroup then does nothing).
fn expert_rows(tile: vec4<u32>) -> u32 {
  let e = tile.x;
  if (tile.z == 0u || e < p.expert_first || e - p.expert_first >= p.n_experts) { return NO_EXPERT; }
  bias_base = e * p.n_rows;
  return (e - p.expert_first) * p.n_rows;
}

// The epilogue: value v of token t, piece row r -> bias, then the output it belongs to.
fn store_y(t: u32, r: u32, v: f32) {
  let g = p.row_begin + r;
  var out = v;
  if (has(FLAG_BIAS)) { out += bias[bias_base + g]; }
  if (has(FLAG_TIMES)) { out = gate_act(out) * bias[p.times_off + t * p.times_stride + g]; }
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
  if (has(FLAG_BIAS)) { return vec2<f32>(bias[bias_base + g], bias[bias_base + g + 1u]); }
  return vec2<f32>(0.0);
}

// The gate's activation: silu(a) = a sigmoid(a); with FLAG_GELU gelu_tanh(a) = a (1 + tanh(u)) / 2 = a sigmoid(2u),
// u = sqrt(2/pi) (a + 0.044715 a^3); with FLAG_SIGMOID sigmoid(a). e^-z overflows to inf for z < -88: a / inf = -0
// (or 0), the right limit.
fn gate_act(a: f32) -> f32 {
  let z = select(a, 1.5957691216057308 * (a + 0.044715 * a * a * a), has(FLAG_GELU));
  return select(a, 1.0, has(FLAG_SIGMOID)) / (1.0 + exp(-z));
}

// SwiGLU epilogue: piece rows r (gate, even) and r + 1 (up) of token t.
fn store_swiglu(t: u32, r: u32, gate: f32, up: f32) {
  let g = p.row_begin + r;
  let bb = bias2(g);
  let a = gate + bb.x;
  let b = up + bb.y;
  var out = gate_act(a) * b;
  if (has(FLAG_OAI)) {  // gpt-oss: a' = min(a, 7), a' sigmoid(1.702 a') (clamp(b, -7, 7) + 1)
    let ac = min(a, 7.0);
    out = ac / (1.0 + exp(-1.702 * ac)) * (clamp(b, -7.0, 7.0) + 1.0);
  }
  y[p.y_off + t * p.y_stride + g / 2u] = out;
}

// Piece rows r (even) and r + 1 of token t, those inside the piece: a SwiGLU pair, or two rows through store_y.
fn store_rows2(t: u32, r: u32, a: f32, b: f32) {
  if (has(FLAG_SWIGLU)) {
    if (r < p.n_rows) { store_swiglu(t, r, a, b); }
  } else {
    if (r < p.n_rows) { store_y(t, r, a); }
    if (r + 1u < p.n_rows) { store_y(t, r + 1u, b); }
  }
}

// ---- Chunks: the block types' loaders for the products that stream each weight once (matvec.wgsl) ----
// A chunk is 32 weights of a row that one or two 16-byte loads of the type's quants cover: a 32-element block, or for
// the K-quants one of 8 parts of a super-block (nb chunks per row either way). It comes as two runs of 16 weights,
// run r at columns chunk_cols(c)[r] .. + 16, each weight w = d[r] * q / 2^p + m[r]: q an exact integer (the type's
// quant, its offset taken off) left at bit position p of its word, p fixed per type, run and vec4 lane (chunk_xs
// gives 2^-p). A product then takes d[r] * dot(q, x * 2^-p) + m[r] * sum(x) per run (exact: powers of two): a
// sub-block's scale and min are decoded once per 16 weights, x scaled once for all the rows that share it, and a
// quant costs one and-or into the bits of 2^23 and one subtraction (plus a shift per word for the lanes that would
// reach bit 23) and no int-to-float conversion (q_lanes below). The types whose quants need gathering (Q5_0, Q5_1,
// Q2_K, Q3_K) go through q16 / ints; MXFP4's codes are looked up (mxfp4x16), its values at p = 0.
struct Q16 { a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, e: vec4<f32>, }

// Integers below 2^23 to f32, minus off: 2^23 + v has v in its mantissa, so or-ing v into 2^23's bits and
// subtracting 2^23 + off is exact, two instructions and no conversion.
fn ints(v: vec4<u32>, off: f32) -> vec4<f32> {
  return bitcast<vec4<f32>>(v | vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0 + off);
}

// Quants left at (or near) their bit positions in their word, or-ed into the bits of 2^23 and taken back out with the
// offset off (scaled by 2^p): exact while they stay below bit 23. The nibbles of bytes 0 and 1 and byte 2's low one
// stay in place, the others come from the word shifted right by 12; bytes 0 and 1 stay, byte 2 moves to bit 8,
// byte 3 to bit 0.
const P_NIB_LO = vec4<f32>(1.0, 256.0, 65536.0, 4096.0);  // 2^p of the four low nibbles of a word
const P_NIB_HI = vec4<f32>(16.0, 4096.0, 256.0, 65536.0);  // and of its high nibbles
const P_BYTE = vec4<f32>(1.0, 256.0, 256.0, 1.0);          // and of its bytes (a byte must not reach bit 23)
fn q_lanes(v: vec4<u32>, p2: vec4<f32>, off: f32) -> vec4<f32> {
  return bitcast<vec4<f32>>(v | vec4<u32>(0x4B000000u)) - (vec4<f32>(8388608.0) + off * p2);
}
fn nib_lo(a: u32, off: f32) -> vec4<f32> {
  return q_lanes(vec4<u32>(a & 0xFu, a & 0xF00u, a & 0xF0000u, (a >> 12u) & 0xF000u), P_NIB_LO, off);
}
fn nib_hi(a: u32, off: f32) -> vec4<f32> {
  return q_lanes(vec4<u32>(a & 0xF0u, a & 0xF000u, (a >> 12u) & 0xF00u, (a >> 12u) & 0xF0000u), P_NIB_HI, off);
}
fn byte_lanes(a: u32, off: f32) -> vec4<f32> {
  return q_lanes(vec4<u32>(a & 0xFFu, a & 0xFF00u, (a >> 8u) & 0xFF00u, a >> 24u), P_BYTE, off);
}
fn nibs_lo(v: vec4<u32>, off: f32) -> Q16 {
  return Q16(nib_lo(v.x, off), nib_lo(v.y, off), nib_lo(v.z, off), nib_lo(v.w, off));
}
fn nibs_hi(v: vec4<u32>, off: f32) -> Q16 {
  return Q16(nib_hi(v.x, off), nib_hi(v.y, off), nib_hi(v.z, off), nib_hi(v.w, off));
}
// The low (run 0) or high (run 1) nibbles of v's 16 bytes.
fn nibs(v: vec4<u32>, off: f32, run: u32) -> Q16 {
  if (run == 1u) { return nibs_hi(v, off); }
  return nibs_lo(v, off);
}
fn bytes16(v: vec4<u32>, off: f32) -> Q16 {
  return Q16(byte_lanes(v.x, off), byte_lanes(v.y, off), byte_lanes(v.z, off), byte_lanes(v.w, off));
}

// 2^-p of run 0 and run 1 by lane: what x is multiplied by before its product with a chunk's quants.
fn chunk_xs(wt_in: u32) -> array<vec4<f32>, 2> {
  let wt = select(wt_in, WTYPE, !TWO_TYPES);  // the header: WTYPE itself with one type
  if (wt == T_Q4_K || wt == T_Q4_0 || wt == T_Q4_1) {
    return array<vec4<f32>, 2>(1.0 / P_NIB_LO, 1.0 / P_NIB_HI);
  }
  if (wt == T_Q5_K || wt == T_Q6_K || wt == T_Q8_0) { return array<vec4<f32>, 2>(1.0 / P_BYTE, 1.0 / P_BYTE); }
  return array<vec4<f32>, 2>(vec4<f32>(1.0), vec4<f32>(1.0));
}

// Q6_K: the six-bit quants (unsigned) of 16 elements as bytes, from their low-bit vec4 (nibble at bit `lo`) and their
// high-bit vec4 (two bits at bit `hi`).
fn q6_bytes(q: vec4<u32>, h: vec4<u32>, lo: u32, hi: u32) -> vec4<u32> {
  let high = ((h >> vec4<u32>(hi)) & vec4<u32>(0x03030303u)) << vec4<u32>(4u);
  return ((q >> vec4<u32>(lo)) & vec4<u32>(0x0F0F0F0Fu)) | high;
}

// Bits sh.. (masked) of the 16 bytes of v, minus off.
fn q16(v: vec4<u32>, sh: u32, mask: u32, off: f32) -> Q16 {
  return Q16(ints(bytes4(v.x, sh, mask), off), ints(bytes4(v.y, sh, mask), off), ints(bytes4(v.z, sh, mask), off),
             ints(bytes4(v.w, sh, mask), off));
}

// As q16 with hi (bits of the same 16 bytes, already in place) or-ed in.
fn q16_hi(v: vec4<u32>, sh: u32, mask: u32, hi: array<vec4<u32>, 4>, off: f32) -> Q16 {
  return Q16(ints(bytes4(v.x, sh, mask) | hi[0], off), ints(bytes4(v.y, sh, mask) | hi[1], off),
             ints(bytes4(v.z, sh, mask) | hi[2], off), ints(bytes4(v.w, sh, mask) | hi[3], off));
}

// Bit b of each of the 16 bytes of v, moved to bit `to`.
fn bit16(v: vec4<u32>, b: u32, to: u32) -> array<vec4<u32>, 4> {
  return array<vec4<u32>, 4>(bytes4(v.x, b, 1u) << vec4<u32>(to), bytes4(v.y, b, 1u) << vec4<u32>(to),
                             bytes4(v.z, b, 1u) << vec4<u32>(to), bytes4(v.w, b, 1u) << vec4<u32>(to));
}

// Bits first .. first + 16 of a (bit e for element e, Q5_0 / Q5_1's qh), moved to bit 4 of each element.
fn qh16(a: u32, first: u32) -> array<vec4<u32>, 4> {
  let s = vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u);
  return array<vec4<u32>, 4>(((vec4<u32>(a) >> s) & vec4<u32>(1u)) << vec4<u32>(4u),
                             ((vec4<u32>(a) >> (s + vec4<u32>(4u))) & vec4<u32>(1u)) << vec4<u32>(4u),
                             ((vec4<u32>(a) >> (s + vec4<u32>(8u))) & vec4<u32>(1u)) << vec4<u32>(4u),
                             ((vec4<u32>(a) >> (s + vec4<u32>(12u))) & vec4<u32>(1u)) << vec4<u32>(4u));
}

// The signed byte i (0..15) of v as f32.
fn sbyte_of(v: vec4<u32>, i: u32) -> f32 { return f32(bitcast<i32>(byte_of(v, i) << 24u) >> 24u); }

// Columns of run 0 and run 1 of chunk c of a row.
// Q4_K / Q5_K part i of a super-block: quant bytes 16 i ..; their low nibbles are elements 16 (i % 2) .. of
// sub-block 2 (i / 2), their high nibbles the same elements of the next sub-block.
// Q6_K part i: low-quant bytes 16 i .., half h = i / 4: elements 16 (i % 4) .. of the half (quarters 0, 1) in their
// low nibbles, the same 64 further (quarters 2, 3) in their high nibbles.
// Q2_K / Q3_K part i: half h = i / 4, elements l0 = 16 ((i / 2) % 2) .. of quarters 2 (i % 2) and the next.
fn chunk_cols(wt_in: u32, c: u32) -> vec2<u32> {
  let wt = select(wt_in, WTYPE, !TWO_TYPES);  // the header: WTYPE itself with one type
  let sb = (c >> 3u) * 256u;
  let i = c & 7u;
  if (wt == T_Q4_K || wt == T_Q5_K) {
    let b = sb + 64u * (i >> 1u) + 16u * (i & 1u);
    return vec2<u32>(b, b + 32u);
  } else if (wt == T_Q6_K) {
    let b = sb + 128u * (i >> 2u) + 16u * (i & 3u);
    return vec2<u32>(b, b + 64u);
  } else if (wt == T_Q2_K || wt == T_Q3_K) {
    let b = sb + 128u * (i >> 2u) + 64u * (i & 1u) + 16u * ((i >> 1u) & 1u);
    return vec2<u32>(b, b + 32u);
  }
  return vec2<u32>(32u * c, 32u * c + 16u);
}

// A chunk's words as loaded, decoded one run at a time by decode_run right before its product (PERF.md, "Quantized
// decode, round 3": 3 % faster end to end than decoding each row's whole chunk at load time; NVIDIA's compiler
// still gives the thread ~120 registers). v: the quants (for Q4_1 / Q5_0 / Q5_1
// the block's four quant words); h: the header, scales or d|m words; m: the high bits (Q5_K qh, Q6_K hq, Q3_K
// hmask) or Q8_0's second half or Q2_K's d|dmin (m.x); d: a scale read from the scale array.
struct RawChunk { v: vec4<u32>, h: vec4<u32>, m: vec4<u32>, d: f32, }
// One run of a chunk: weight i = d * q[i] / 2^p + m.
struct Run { q: Q16, d: f32, m: f32, }
// The types whose runs have an offset m (0 for the others): only their products need sum(x).
fn chunk_min(wt_in: u32) -> bool {
  let wt = select(wt_in, WTYPE, !TWO_TYPES);  // the header: WTYPE itself with one type
  return wt == T_Q4_K || wt == T_Q5_K || wt == T_Q2_K || wt == T_Q4_1 || wt == T_Q5_1;
}

// Chunk c of piece row r (chunk_cols says which weights), as loaded.
fn load_raw(wt_in: u32, r: u32, c: u32) -> RawChunk {
  let wt = select(wt_in, WTYPE, !TWO_TYPES);  // the header: WTYPE itself with one type
  let z = vec4<u32>(0u);
  let sb = r * (p.nb >> 3u) + (c >> 3u);  // K-quants: the super-block and the part of it
  let i = c & 7u;
  let blk = r * p.nb + c;  // the others: the block
  if (wt == T_Q4_K) {
    let b = sb * 9u;  // in vec4: header, quants 8
    return RawChunk(wvec(wt, b + 1u + i), wvec(wt, b), z, 0.0);
  } else if (wt == T_Q5_K) {
    let b = sb * 11u;  // in vec4: header, qh 2, quants 8
    // qh bytes 16 (i % 2) ..: bit j of sub-block j
    return RawChunk(wvec(wt, b + 3u + i), wvec(wt, b), wvec(wt, b + 1u + (i & 1u)), 0.0);
  } else if (wt == T_Q6_K) {
    let b = sb * 13u;  // in vec4: low quants 8, high quants 4, scales 1
    // high-quant bytes 32 h + 16 (i % 2) .. (h = i / 4): 2 bits per quarter
    return RawChunk(wvec(wt, b + i), wvec(wt, b + 12u), wvec(wt, b + 8u + 2u * (i >> 2u) + (i & 1u)), q_scale(wt, sb));
  } else if (wt == T_Q3_K) {
    let b = sb * 7u;  // in vec4: hmask 2, quants 4, scales and d 1
    let lh = (i >> 1u) & 1u;
    return RawChunk(wvec(wt, b + 2u + 2u * (i >> 2u) + lh), wvec(wt, b + 6u), wvec(wt, b + lh), 0.0);
  } else if (wt == T_Q2_K) {
    let b = sb * 5u;  // in vec4: scales 1, quants 4; d|dmin in the scale array
    let dm = wword(wt, scale_off(wt) + (sb >> 2u), sb & 3u);
    return RawChunk(wvec(wt, b + 1u + 2u * (i >> 2u) + ((i >> 1u) & 1u)), wvec(wt, b), vec4<u32>(dm, 0u, 0u, 0u), 0.0);
  } else if (wt == T_Q8_0) {
    return RawChunk(wvec(wt, 2u * blk), z, wvec(wt, 2u * blk + 1u), q_scale(wt, blk));
  } else if (wt == T_Q4_0) {
    return RawChunk(wvec(wt, blk), z, z, q_scale(wt, blk));
  } else if (wt == T_MXFP4) {
    return RawChunk(wvec(wt, blk), z, z, mx_scale(wt, blk));
  } else if (wt == T_Q4_1) {  // 5 words: d|m, quants
    let b = blk * 5u;
    return RawChunk(vec4<u32>(wd(wt, b + 1u), wd(wt, b + 2u), wd(wt, b + 3u), wd(wt, b + 4u)),
                    vec4<u32>(wd(wt, b), 0u, 0u, 0u), z, 0.0);
  } else if (wt == T_Q5_0) {  // 5 words: qh, quants; d in the scale array
    let b = blk * 5u;
    return RawChunk(vec4<u32>(wd(wt, b + 1u), wd(wt, b + 2u), wd(wt, b + 3u), wd(wt, b + 4u)),
                    vec4<u32>(wd(wt, b), 0u, 0u, 0u), z, q_scale(wt, blk));
  }
  // T_Q5_1: 6 words: d|m, qh, quants
  let b = blk * 6u;
  return RawChunk(vec4<u32>(wd2(wt, b + 2u), wd2(wt, b + 4u)), vec4<u32>(wd(wt, b), wd(wt, b + 1u), 0u, 0u), z, 0.0);
}

// Run `run` (0 or 1) of chunk c from its loaded words.
fn decode_run(wt_in: u32, raw: RawChunk, c: u32, run: u32) -> Run {
  let wt = select(wt_in, WTYPE, !TWO_TYPES);  // the header: WTYPE itself with one type
  let i = c & 7u;
  let v = raw.v;
  if (wt == T_Q4_K || wt == T_Q5_K) {
    let sm = k45_scale_min(raw.h, (i & 6u) | run);  // sub-block 2 (i / 2) + run
    if (wt == T_Q5_K) {  // each quant's 5th bit moved above its nibble: one byte per quant
      let q = ((v >> vec4<u32>(4u * run)) & vec4<u32>(0x0F0F0F0Fu)) |
              (((raw.m >> vec4<u32>((i & 6u) | run)) & vec4<u32>(0x01010101u)) << vec4<u32>(4u));
      return Run(bytes16(q, 0.0), sm.x, -sm.y);
    }
    return Run(nibs(v, 0.0, run), sm.x, -sm.y);
  } else if (wt == T_Q6_K) {
    let h = i >> 2u;
    let k = (i & 3u) >> 1u;
    let si = 8u * h + 2u * k + (i & 1u) + 4u * run;  // the run's 16-element scale
    // each quant's 2 high bits moved above its nibble: one byte per quant
    return Run(bytes16(q6_bytes(v, raw.m, 4u * run, 2u * k + 4u * run), 32.0), raw.d * sbyte_of(raw.h, si), 0.0);
  } else if (wt == T_Q3_K) {
    let h = i >> 2u;
    let lh = (i >> 1u) & 1u;
    let k = 2u * (i & 1u) + run;
    let tail = raw.h;
    let si = 8u * h + 2u * k + lh;
    let lo = (byte_of(tail, si & 7u) >> (4u * (si >> 3u))) & 15u;
    let hi = (byte_of(tail, 8u + (si & 3u)) >> (2u * (si >> 2u))) & 3u;
    let dl = unpack2x16float(tail.w).x * (f32(lo | (hi << 4u)) - 32.0);
    return Run(q16_hi(v, 2u * k, 3u, bit16(raw.m, 4u * h + k, 2u), 4.0), dl, 0.0);
  } else if (wt == T_Q2_K) {
    let k = 2u * (i & 1u) + run;
    let si = 8u * (i >> 2u) + 2u * k + ((i >> 1u) & 1u);
    let sc = byte_of(raw.h, si);
    let dm = unpack2x16float(raw.m.x);
    return Run(q16(v, 2u * k, 3u, 0.0), dm.x * f32(sc & 15u), -dm.y * f32(sc >> 4u));
  } else if (wt == T_Q8_0) {
    let flip = vec4<u32>(0x80808080u);  // signed bytes + 128: unsigned
    return Run(bytes16(select(v, raw.m, run == 1u) ^ flip, 128.0), raw.d, 0.0);
  } else if (wt == T_Q4_0) {
    return Run(nibs(v, 8.0, run), raw.d, 0.0);
  } else if (wt == T_MXFP4) {  // the doubled E2M1 values are the integers q (p = 0)
    return Run(mxfp4x16(v, 4u * run), raw.d, 0.0);
  } else if (wt == T_Q4_1) {
    let dm = unpack2x16float(raw.h.x);
    return Run(nibs(v, 0.0, run), dm.x, dm.y);
  } else if (wt == T_Q5_0) {
    return Run(q16_hi(v, 4u * run, 15u, qh16(raw.h.x, 16u * run), 16.0), raw.d, 0.0);
  }
  // T_Q5_1
  let dm = unpack2x16float(raw.h.x);
  return Run(q16_hi(v, 4u * run, 15u, qh16(raw.h.y, 16u * run), 0.0), dm.x, dm.y);
}

fn dot16(a: Q16, b: Q16) -> f32 { return dot(a.a, b.a) + dot(a.b, b.b) + dot(a.c, b.c) + dot(a.e, b.e); }
fn mul16(a: Q16, b: Q16) -> Q16 { return Q16(a.a * b.a, a.b * b.b, a.c * b.c, a.e * b.e); }
fn lanes16(a: Q16, s: vec4<f32>) -> Q16 { return Q16(a.a * s, a.b * s, a.c * s, a.e * s); }
fn sum16(a: Q16) -> f32 { return dot(a.a + a.b + a.c + a.e, vec4<f32>(1.0)); }

// x[t][col .. col + 16) of the bound activation window (zeros past n_in; col a multiple of 16).
fn load_x16(t: u32, col: u32) -> Q16 {
  let b = p.x_off + t * p.n_in + col;
  if (col + 16u <= p.n_in) {
    return Q16(vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]), vec4<f32>(x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]),
               vec4<f32>(x[b + 8u], x[b + 9u], x[b + 10u], x[b + 11u]),
               vec4<f32>(x[b + 12u], x[b + 13u], x[b + 14u], x[b + 15u]));
  }
  var a: array<f32, 16>;
  for (var i = 0u; i < 16u; i += 1u) {
    a[i] = 0.0;
    if (col + i < p.n_in) { a[i] = x[b + i]; }
  }
  return Q16(vec4<f32>(a[0], a[1], a[2], a[3]), vec4<f32>(a[4], a[5], a[6], a[7]), vec4<f32>(a[8], a[9], a[10], a[11]),
             vec4<f32>(a[12], a[13], a[14], a[15]));
}

// Norm weights of columns col .. col + 16 (the buffer holds n_in rounded up to 8: vec4s past it clamped to its last,
// whose products meet x's zeros).
fn norm16(col: u32) -> Q16 {
  let last = (p.n_in + 3u) / 4u - 1u;
  let i = col / 4u;
  return Q16(norm[min(i, last)], norm[min(i + 1u, last)], norm[min(i + 2u, last)], norm[min(i + 3u, last)]);
}
