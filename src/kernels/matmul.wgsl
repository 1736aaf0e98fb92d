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
// The host prepends `const WTYPE: u32`, `const NT: u32` (matvec tokens per dispatch) and the
// matvec shape MV_ROWS, MV_T, MV_SHUFFLE with mv_row_sum() (the butterfly of subgroup shuffles
// over a row's MV_T lanes; only defined with shuffles when the adapter has subgroups).
// Barriers stay in entry points, in uniform control flow.

struct MatmulParams {
  n_in: u32, n_out: u32, n_tokens: u32, nb: u32,
  row_begin: u32, n_rows: u32, scale_off4: u32, flags: u32,
  x_off: u32, y_off: u32, grid_x: u32, row_tiles: u32,
}
const FLAG_BIAS: u32 = 1u;        // add bias[row]
const FLAG_LAST_PIECE: u32 = 2u;  // embedding: ids past the table write zero rows

@group(0) @binding(0) var<uniform> p: MatmulParams;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> ids: array<u32>;

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

fn store_y(t: u32, r: u32, v: f32) {
  let g = p.row_begin + r;
  var out = v;
  if ((p.flags & FLAG_BIAS) != 0u) { out += bias[g]; }
  y[p.y_off + t * p.n_out + g] = out;
}

// ---------------------------------------------------------------------------------------
// Matrix-vector (decode): MV_ROWS rows per workgroup, MV_T threads per row (host constants,
// per adapter). Thread lt of a row reads units lt, lt + MV_T, ... (adjacent threads read adjacent
// 8-element units: coalesced), keeps NT partial sums, and the row's threads reduce them: with
// subgroup shuffles when MV_SHUFFLE (the MV_T threads of a row sit in one subgroup), else
// through workgroup memory. Traffic: the piece's weight bytes once per dispatch, for NT tokens.
const MV_WG: u32 = MV_ROWS * MV_T;
var<workgroup> red: array<f32, MV_WG * NT>;

@compute @workgroup_size(MV_WG)
fn matvec(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let flat = wid.x + wid.y * p.grid_x;
  let lr = lid / MV_T;
  let lt = lid % MV_T;
  let r = flat * MV_ROWS + lr;
  let row_ok = r < p.n_rows;
  // acc is indexed only inside //#unroll blocks: constant indices keep it in registers on GPUs.
  var acc: array<f32, NT>;
  //#unroll t NT
  acc[$t] = 0.0;
  //#end
  if (row_ok) {
    let n_units = p.nb * 4u;
    for (var u = lt; u < n_units; u += MV_T) {
      let wv = load8(r, u);
      //#unroll t NT
      {
        let xv = load_x8($t, u);
        acc[$t] += dot(wv.lo, xv.lo) + dot(wv.hi, xv.hi);
      }
      //#end
    }
  }
  if (MV_SHUFFLE) {
    //#unroll t NT
    acc[$t] = mv_row_sum(acc[$t]);
    //#end
    if (row_ok && lt < NT) {
      var v = 0.0;
      //#unroll t NT
      if ($t == lt) { v = acc[$t]; }
      //#end
      store_y(lt, r, v);
    }
  } else {
    //#unroll t NT
    red[$t * MV_WG + lid] = acc[$t];
    //#end
    workgroupBarrier();
    for (var s = MV_T / 2u; s > 0u; s >>= 1u) {
      if (lt < s) {
        //#unroll t NT
        red[$t * MV_WG + lid] += red[$t * MV_WG + lid + s];
        //#end
      }
      workgroupBarrier();
    }
    if (row_ok && lt < NT) { store_y(lt, r, red[lt * MV_WG + lr * MV_T]); }
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
  for (var i = 0u; i < 4u; i += 1u) { acc[i] = vec4<f32>(0.0); }

  for (var b = 0u; b < p.nb; b += 1u) {
    var wv = W8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (w_ok) { wv = load8(w_row, b * 4u + lq); }
    var xv = W8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (x_ok) { xv = load_x8(x_tok, b * 4u + lq); }
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

  for (var i = 0u; i < 4u; i += 1u) {
    let t = tile_m * TM + ty * 4u + i;
    for (var j = 0u; j < 4u; j += 1u) {
      let r = tile_n * TN + tx * 4u + j;
      if (t < p.n_tokens && r < p.n_rows) { store_y(t, r, acc[i][j]); }
    }
  }
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
