// Weight x activation products (y = x W^T + bias) and the embedding gather, with the weight
// kept in its GGUF type and dequantised in the shader; activations and accumulation are f32.
//
// Weights (upload_weight in matmul.cpp) live in row-range pieces, one storage binding each; a
// dispatch sees one piece as `w` (array<vec4<u32>>). Every row is padded to nb blocks of 32
// elements (zeros past n_in) and read in units of 8 elements (4 units per block):
//   F32  (WTYPE 0): block = 8 vec4 of f32 bits, row-major [rows][nb][32]
//   F16  (WTYPE 1): block = 4 vec4 of packed f16 pairs
//   BF16 (WTYPE 2): block = 4 vec4 of packed bf16 pairs
//   Q8_0 (WTYPE 3): quants [rows][nb] of 2 vec4 (32 int8), then from vec4 scale_off4 the f16
//                   scales [rows][nb] packed two per u32
//   Q4_0 (WTYPE 4): quants [rows][nb] of 1 vec4 (16 bytes as in GGUF: element j = low nibble of
//                   byte j, element j + 16 = its high nibble), then the f16 scales as for Q8_0
// The host prepends `const WTYPE: u32`, `const NT: u32` (matvec tokens per dispatch), the
// matvec shape MV_T, MV_R, MV_G and XV4, mv_lane_sum() (a butterfly of subgroup shuffles, or
// the identity without subgroups) and the `matvec` entry point, which passes the subgroup size
// to matvec_main (1 without subgroups). Barriers are reached in uniform control flow.
//
// Epilogues (flags; matvec and matmul alike): bias, RMSNorm of x folded in (the sum of x^2 is
// gathered while x streams past, the row's dot is scaled at the end), residual accumulation,
// SwiGLU over interleaved (gate, up) row pairs, and rows split across three outputs (q, k, v).

struct MatmulParams {
  n_in: u32, n_out: u32, n_tokens: u32, nb: u32,
  row_begin: u32, n_rows: u32, scale_off4: u32, flags: u32,
  x_off: u32, y_off: u32, grid_x: u32, row_tiles: u32,
  split1: u32, split2: u32, y1_off: u32, y2_off: u32,
  eps: f32, y_stride: u32, _pad0: u32, _pad1: u32,
}
const FLAG_BIAS: u32 = 1u;        // add bias[row]
const FLAG_LAST_PIECE: u32 = 2u;  // embedding: ids past the table write zero rows
const FLAG_NORM: u32 = 4u;        // RMSNorm x first: y = (x / rms(x) * norm) W^T
const FLAG_ACCUM: u32 = 8u;       // y += result (the residual add)
const FLAG_SWIGLU: u32 = 16u;     // rows are (gate, up) pairs: y[t][i] = silu(row 2i) * row 2i+1
const FLAG_SPLIT: u32 = 32u;      // rows [split1, split2) go to y1, [split2, n_out) to y2

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
  if (WTYPE == 0u) {
    let i = blk * 8u + q * 2u;
    return W8(bitcast<vec4<f32>>(w[i]), bitcast<vec4<f32>>(w[i + 1u]));
  } else if (WTYPE == 1u) {
    let v = w[blk * 4u + q];
    if (F16_INT) { return f16x8(v); }
    return W8(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)),
              vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
  } else if (WTYPE == 2u) {
    let v = w[blk * 4u + q];
    return W8(vec4<f32>(bf2(v.x), bf2(v.y)), vec4<f32>(bf2(v.z), bf2(v.w)));
  } else if (WTYPE == 3u) {
    let v = w[blk * 2u + (q >> 1u)];
    let odd = (q & 1u) == 1u;
    let d = q_scale(blk);
    return W8(d * i8x4(select(v.x, v.z, odd)), d * i8x4(select(v.y, v.w, odd)));
  } else {
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

// SwiGLU epilogue: piece rows r (gate, even) and r + 1 (up) of token t.
fn store_swiglu(t: u32, r: u32, gate: f32, up: f32) {
  let g = p.row_begin + r;
  var a = gate;
  var b = up;
  if (has(FLAG_BIAS)) {
    a += bias[g];
    b += bias[g + 1u];
  }
  // e^-a overflows to inf for a < -88: a / inf = -0, the right limit.
  y[p.y_off + t * p.y_stride + g / 2u] = a / (1.0 + exp(-a)) * b;
}

// ---------------------------------------------------------------------------------------
// Matrix-vector (decode). A workgroup is MV_G groups of MV_T threads; a group owns MV_R
// adjacent rows (host constants, per adapter). Thread lt of a group reads units lt, lt + MV_T,
// ... of each of its rows (adjacent threads read adjacent 16-byte units: coalesced; MV_R loads
// in flight per step) and keeps MV_R x NT partial dots plus NT partial sums of x^2 (for
// FLAG_NORM). Each x unit is read once per group for all MV_R rows: as two vec4 when XV4.
// The group's partials are summed with subgroup shuffles over min(MV_T, subgroup size) lanes,
// then through workgroup memory. Traffic: the piece's weight bytes once per dispatch, NT tokens.
// The entry point `matvec` (host prelude) passes the subgroup size (1 without subgroups).
const MV_WG: u32 = MV_T * MV_G;
const MV_ROWS: u32 = MV_G * MV_R;
// MV_NV = MV_R * NT + NT (host constant): values per thread, dots [row][token] then x^2 [token].
// MV_SLOTS (host constant): partial sums per group and value left after the shuffles, MV_T / the
// smallest subgroup size possible (4 with subgroups, else 1).
var<workgroup> red: array<f32, MV_NV * MV_G * MV_SLOTS>;

fn mv_x8(t: u32, u: u32) -> W8 {
  if (XV4) {
    let i = (p.x_off + t * p.n_in) / 4u + 2u * u;
    return W8(x4[i], x4[i + 1u]);
  }
  return load_x8(t, u);
}

fn matvec_main(wid: vec3<u32>, lid: u32, sg_size: u32) {
  let flat = wid.x + wid.y * p.grid_x;
  let grp = lid / MV_T;
  let lt = lid % MV_T;
  let row0 = flat * MV_ROWS + grp * MV_R;
  let last_row = p.n_rows - 1u;
  // vals is indexed only inside //#unroll blocks: constant indices keep it in registers on GPUs.
  var vals: array<f32, MV_NV>;
  //#unroll k MV_NV
  vals[$k] = 0.0;
  //#end
  let n_units = p.nb * 4u;
  // Each step covers MV_U units per row (MV_R x MV_U weight loads in flight); units past the row
  // are clamped to its last one and their x zeroed.
  for (var u0 = lt; u0 < n_units; u0 += MV_T * MV_U) {
    //#unroll! k MV_U
    let u$k = min(u0 + $k * MV_T, n_units - 1u);
    //#unroll! j MV_R
    let w$j_$k = load8(min(row0 + $j, last_row), u$k);  // rows past the piece: loaded, never stored
    //#end
    //#end
    //#unroll! k MV_U
    {
      var g = W8(vec4<f32>(1.0), vec4<f32>(1.0));
      if (has(FLAG_NORM)) { g = norm8(u$k); }
      let live = u0 + $k * MV_T < n_units;
      //#unroll t NT
      {
        var xr = mv_x8($t, u$k);
        if (!live) { xr = W8(vec4<f32>(0.0), vec4<f32>(0.0)); }
        vals[MV_R * NT + $t] += dot(xr.lo, xr.lo) + dot(xr.hi, xr.hi);
        let xv = W8(xr.lo * g.lo, xr.hi * g.hi);
        //#unroll! j MV_R
        vals[$j * NT + $t] += dot(w$j_$k.lo, xv.lo) + dot(w$j_$k.hi, xv.hi);
        //#end
      }
      //#end
    }
    //#end
  }
  // Sum each value over the group's lanes: a butterfly of shuffles within aligned chunks of
  // lanes. When the group fits one subgroup (chunk == MV_T) every lane then holds the sums and
  // lane lt < MV_R * NT finishes value lt (row row0 + lt / NT, token lt % NT) at once; otherwise
  // one slot per chunk goes through workgroup memory. The barrier-free path matters: a barrier
  // here halved the H200's streaming rate.
  let chunk = min(MV_T, sg_size);
  //#unroll k MV_NV
  vals[$k] = mv_lane_sum(vals[$k], chunk);
  //#end
  let j = lt / NT;
  let t = lt % NT;
  var dot_sum = 0.0;
  var up_sum = 0.0;  // SwiGLU: the next row's dot (the up half of the pair)
  var ss = 0.0;
  if (chunk == MV_T) {
    if (lt >= MV_R * NT) { return; }
    //#unroll k MV_NV
    if ($k == lt) { dot_sum = vals[$k]; }
    if ($k == lt + NT) { up_sum = vals[$k]; }
    if ($k == MV_R * NT + t) { ss = vals[$k]; }
    //#end
  } else {
    //#unroll k MV_NV
    if (lt % chunk == 0u) { red[($k * MV_G + grp) * MV_SLOTS + lt / chunk] = vals[$k]; }
    //#end
    workgroupBarrier();
    if (lt >= MV_R * NT) { return; }
    for (var c = 0u; c < MV_T / chunk; c += 1u) {
      dot_sum += red[(lt * MV_G + grp) * MV_SLOTS + c];
      if (j + 1u < MV_R) { up_sum += red[((lt + NT) * MV_G + grp) * MV_SLOTS + c]; }
      ss += red[((MV_R * NT + t) * MV_G + grp) * MV_SLOTS + c];
    }
  }
  let r = row0 + j;
  var scale = 1.0;
  if (has(FLAG_NORM)) { scale = inv_rms(ss); }
  if (r >= p.n_rows) { return; }
  if (has(FLAG_SWIGLU)) {
    if (j % 2u == 0u) { store_swiglu(t, r, dot_sum * scale, up_sum * scale); }
  } else {
    store_y(t, r, dot_sum * scale);
  }
}

// ---------------------------------------------------------------------------------------
// Matrix-matrix (prefill): a workgroup computes a TM tokens x TN rows tile of y, stepping over
// the row one 32-element block at a time. Each step every thread dequantises one 8-element unit
// of the W tile (TN rows x 4 units) and loads 8 floats of the x tile (TM tokens x 4 units) into
// workgroup memory, stored k-major so a thread reads 4 tokens / 4 rows as one vec4; each thread
// then accumulates a 4 x 4 sub-tile. Each weight block is read once per token tile.
const TM: u32 = 64u;
const TN: u32 = 64u;
const MM_WG: u32 = 256u;
var<workgroup> xs: array<vec4<f32>, 512>;  // [k: 32][token / 4: 16]
var<workgroup> ws: array<vec4<f32>, 512>;  // [k: 32][row / 4: 16]
var<workgroup> xss: array<f32, 256>;       // FLAG_NORM: sums of x^2 [token: 64][loader lane: 4]

@compute @workgroup_size(MM_WG)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let flat = wid.x + wid.y * p.grid_x;
  let tile_n = flat % p.row_tiles;
  let tile_m = flat / p.row_tiles;
  if (tile_m * TM >= p.n_tokens) { return; }  // grid padding: uniform per workgroup
  let ty = lid / 16u;
  let tx = lid % 16u;
  let ld = lid / 4u;  // loader: W tile row / x tile token
  let lq = lid % 4u;  // loader: unit within the block
  let w_row = tile_n * TN + ld;
  let w_ok = w_row < p.n_rows;
  let x_tok = tile_m * TM + ld;
  let x_ok = x_tok < p.n_tokens;
  let k0 = lq * 8u;
  var acc: array<vec4<f32>, 4>;
  //#unroll i 4
  acc[$i] = vec4<f32>(0.0);
  //#end
  var ss = 0.0;  // FLAG_NORM: this loader's part of sum(x^2) of token x_tok

  for (var b = 0u; b < p.nb; b += 1u) {
    var wv = W8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (w_ok) { wv = load8(w_row, b * 4u + lq); }
    var xv = W8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (x_ok) { xv = load_x8(x_tok, b * 4u + lq); }
    if (has(FLAG_NORM)) {
      ss += dot(xv.lo, xv.lo) + dot(xv.hi, xv.hi);
      let g = norm8(b * 4u + lq);
      xv = W8(xv.lo * g.lo, xv.hi * g.hi);
    }
    workgroupBarrier();  // the previous step's tiles are consumed
    for (var i = 0u; i < 4u; i += 1u) {
      ws[(k0 + i) * 16u + ld / 4u][ld % 4u] = wv.lo[i];
      ws[(k0 + 4u + i) * 16u + ld / 4u][ld % 4u] = wv.hi[i];
      xs[(k0 + i) * 16u + ld / 4u][ld % 4u] = xv.lo[i];
      xs[(k0 + 4u + i) * 16u + ld / 4u][ld % 4u] = xv.hi[i];
    }
    workgroupBarrier();
    for (var k = 0u; k < 32u; k += 1u) {
      let a = xs[k * 16u + ty];
      let bw = ws[k * 16u + tx];
      acc[0] += a.x * bw;
      acc[1] += a.y * bw;
      acc[2] += a.z * bw;
      acc[3] += a.w * bw;
    }
  }

  xss[lid] = ss;
  workgroupBarrier();
  // acc is indexed with constants only (unrolled on GPUs): a dynamic index would move it to
  // local memory and every multiply-add of the main loop with it.
  let r = tile_n * TN + tx * 4u;  // even: SwiGLU pairs are (j, j + 1) for j = 0, 2
  //#unroll i 4
  {
    let tl = ty * 4u + $i;
    let t = tile_m * TM + tl;
    var v = acc[$i];
    if (has(FLAG_NORM)) {
      v *= inv_rms(xss[tl * 4u] + xss[tl * 4u + 1u] + xss[tl * 4u + 2u] + xss[tl * 4u + 3u]);
    }
    if (t < p.n_tokens) {
      if (has(FLAG_SWIGLU)) {
        if (r < p.n_rows) { store_swiglu(t, r, v.x, v.y); }
        if (r + 2u < p.n_rows) { store_swiglu(t, r + 2u, v.z, v.w); }
      } else {
        if (r < p.n_rows) { store_y(t, r, v.x); }
        if (r + 1u < p.n_rows) { store_y(t, r + 1u, v.y); }
        if (r + 2u < p.n_rows) { store_y(t, r + 2u, v.z); }
        if (r + 3u < p.n_rows) { store_y(t, r + 3u, v.w); }
      }
    }
  }
  //#end
}

// ---------------------------------------------------------------------------------------
// Embedding gather: one workgroup per token writes row ids[t] of the table (dequantised) to
// y[t][0 .. n_in). A table split into pieces is gathered by one dispatch per piece; each writes
// the tokens whose id falls in its rows (the last piece also writes zeros for ids past the end).
@compute @workgroup_size(64)
fn embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x + wid.y * p.grid_x;
  if (t >= p.n_tokens) { return; }
  let id = ids[p.x_off + t];
  let in_piece = id >= p.row_begin && id - p.row_begin < p.n_rows;
  let past_end = (p.flags & FLAG_LAST_PIECE) != 0u && id >= p.row_begin + p.n_rows;
  if (!in_piece && !past_end) { return; }
  let r = id - p.row_begin;
  for (var u = lid; u < p.nb * 4u; u += 64u) {
    var v = W8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (in_piece) { v = load8(r, u); }
    let c = u * 8u;
    let o = p.y_off + t * p.n_in + c;
    for (var i = 0u; i < 4u; i += 1u) {
      if (c + i < p.n_in) { y[o + i] = v.lo[i]; }
      if (c + 4u + i < p.n_in) { y[o + 4u + i] = v.hi[i]; }
    }
  }
}
