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
const T_Q8_0: u32 = 8u;
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

// Elements [8 * (u % 4), + 8) of block u / 4 of piece row r.
fn load8(r: u32, u: u32) -> W8 {
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
