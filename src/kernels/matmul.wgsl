// Matrix-matrix products (prefill); compiled after matmul_common.wgsl,
// which documents the weight layout, the bindings and the epilogues.

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
