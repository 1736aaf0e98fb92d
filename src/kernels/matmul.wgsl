// Matrix-matrix products (prefill); compiled after matmul_common.wgsl, which documents the weight layout, the
// bindings and the epilogues.
//
// Register tiling: a workgroup of 256 threads (16 x 16) computes a TM tokens x TN rows tile of y (TM, TN: 64 or 128,
// from the host prelude), stepping over the row one 32-element block at a time. Each step the threads dequantise
// the W tile (TN rows x 4 units of 8) and load the x tile (TM tokens x 4 units) into workgroup memory, k-major, so
// that a thread reads 4 tokens or 4 rows as one vec4. Thread (ty, tx) owns MI x 4 tokens and NJ x 4 rows of the
// tile (MI = TM / 64, NJ = TN / 64): the vec4 groups ty + 16 i and tx + 16 j, so the 16 threads of a row read 16
// neighbouring vec4 and a step's 32 k feed MI * NJ * 16 multiply-adds per 4 (MI + NJ) bytes read from
// workgroup memory. The next block is loaded from memory into registers while the current one is multiplied.
//
// With MM_F16 (shader-f16) the tiles are f16 in workgroup memory and the products of one block (32 k) are summed
// in f16 (vec4<f16>: two f16 multiply-adds per instruction on GPUs that pair them), then added into f32
// accumulators: each weight and activation is rounded to f16 and each 32-term partial sum carries f16 rounding.
const MM_WG: u32 = 256u;
const TM4: u32 = TM / 4u;  // vec4 token groups of one k of the x tile
const TN4: u32 = TN / 4u;  // vec4 row groups of one k of the W tile
// From the host too (the unroll counts): MI = TM / 64 token groups per thread (also the x units each thread loads
// per step), NJ = TN / 64 row groups (and W units), NACC = MI * 4 * NJ accumulators.
var<workgroup> xs: array<vec4<MM_T>, 32u * TM4>;  // [k: 32][token / 4]
var<workgroup> ws: array<vec4<MM_T>, 32u * TN4>;  // [k: 32][row / 4]
// FLAG_NORM: the sums of x^2 [token][loader lane: 4] go through ss_put / ss_get (host prelude): into xs, once
// consumed, for f32 tiles (a 128 x 128 tile then fits 32 KiB), into an array of their own for f16 ones.

// Eight values into column `c` (a token or row of the tile) at k0 .. k0 + 7 of a k-major tile.
fn put8(tile_w: u32, c: u32, k0: u32, v: W8, is_w: bool) {
  let g = c / 4u;
  let e = c % 4u;
  for (var i = 0u; i < 4u; i += 1u) {
    if (is_w) {
      ws[(k0 + i) * tile_w + g][e] = MM_T(v.lo[i]);
      ws[(k0 + 4u + i) * tile_w + g][e] = MM_T(v.hi[i]);
    } else {
      xs[(k0 + i) * tile_w + g][e] = MM_T(v.lo[i]);
      xs[(k0 + 4u + i) * tile_w + g][e] = MM_T(v.hi[i]);
    }
  }
}

// acc += the products of the block in the tiles: f32 multiply-adds.
fn mm_block_f32(acc: ptr<function, array<vec4<f32>, NACC>>, ty: u32, tx: u32) {
  for (var k = 0u; k < 32u; k += 1u) {
    var a: array<vec4<f32>, MI>;
    var bw: array<vec4<f32>, NJ>;
    //#unroll! i MI
    a[$i] = vec4<f32>(xs[k * TM4 + ty + 16u * $i]);
    //#end
    //#unroll! j NJ
    bw[$j] = vec4<f32>(ws[k * TN4 + tx + 16u * $j]);
    //#end
    //#unroll! i MI
    //#unroll! c 4
    //#unroll! j NJ
    (*acc)[($i * 4u + $c) * NJ + $j] += a[$i][$c] * bw[$j];
    //#end
    //#end
    //#end
  }
}

// The same with the block's products summed in f16, then added to the f32 accumulators.
fn mm_block_f16(acc: ptr<function, array<vec4<f32>, NACC>>, ty: u32, tx: u32) {
  var part: array<vec4<MM_T>, NACC>;
  //#unroll! a NACC
  part[$a] = vec4<MM_T>(0.0);
  //#end
  for (var k = 0u; k < 32u; k += 1u) {
    var a: array<vec4<MM_T>, MI>;
    var bw: array<vec4<MM_T>, NJ>;
    //#unroll! i MI
    a[$i] = xs[k * TM4 + ty + 16u * $i];
    //#end
    //#unroll! j NJ
    bw[$j] = ws[k * TN4 + tx + 16u * $j];
    //#end
    //#unroll! i MI
    //#unroll! c 4
    //#unroll! j NJ
    part[($i * 4u + $c) * NJ + $j] += a[$i][$c] * bw[$j];
    //#end
    //#end
    //#end
  }
  //#unroll! a NACC
  (*acc)[$a] += vec4<f32>(part[$a]);
  //#end
}

@compute @workgroup_size(MM_WG)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let flat = wid.x + wid.y * p.grid_x;
  let tile_n = flat % p.row_tiles;
  let tile_m = flat / p.row_tiles;
  if (tile_m * TM >= p.n_tokens) { return; }  // grid padding: uniform per workgroup
  let ty = lid / 16u;
  let tx = lid % 16u;
  let ld = lid / 4u;  // loader: W tile row / x tile token (+ 64 l)
  let lq = lid % 4u;  // loader: unit within the block
  let k0 = lq * 8u;

  var acc: array<vec4<f32>, NACC>;  // [token group i][component c][row group j]
  //#unroll! a NACC
  acc[$a] = vec4<f32>(0.0);
  //#end
  var wv: array<W8, NJ>;
  var xv: array<W8, MI>;
  var ss: array<f32, MI>;  // FLAG_NORM: this loader's part of sum(x^2) of its tokens
  //#unroll! l MI
  ss[$l] = 0.0;
  //#end

  for (var b = 0u; b < p.nb; b += 1u) {
    if (b == 0u) {  // block 0 into registers (zeros outside the matrix)
      //#unroll! l NJ
      {
        let r = tile_n * TN + ld + 64u * $l;
        wv[$l] = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (r < p.n_rows) { wv[$l] = load8(r, lq); }
      }
      //#end
      //#unroll! l MI
      {
        let t = tile_m * TM + ld + 64u * $l;
        xv[$l] = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (t < p.n_tokens) { xv[$l] = load_x8(t, lq); }
      }
      //#end
    }
    workgroupBarrier();  // the previous step's tiles are consumed
    //#unroll! l NJ
    put8(TN4, ld + 64u * $l, k0, wv[$l], true);
    //#end
    //#unroll! l MI
    {
      var v = xv[$l];
      if (has(FLAG_NORM)) {
        ss[$l] += dot(v.lo, v.lo) + dot(v.hi, v.hi);
        let g = norm8(b * 4u + lq);
        v = W8(v.lo * g.lo, v.hi * g.hi);
      }
      put8(TM4, ld + 64u * $l, k0, v, false);
    }
    //#end
    workgroupBarrier();
    if (b + 1u < p.nb) {  // the next block's loads overlap this block's multiply-adds
      let u = (b + 1u) * 4u + lq;
      //#unroll! l NJ
      {
        let r = tile_n * TN + ld + 64u * $l;
        if (r < p.n_rows) { wv[$l] = load8(r, u); }
      }
      //#end
      //#unroll! l MI
      {
        let t = tile_m * TM + ld + 64u * $l;
        if (t < p.n_tokens) { xv[$l] = load_x8(t, u); }
      }
      //#end
    }
    if (MM_F16) {
      mm_block_f16(&acc, ty, tx);
    } else {
      mm_block_f32(&acc, ty, tx);
    }
  }

  workgroupBarrier();  // xs is consumed
  //#unroll! l MI
  ss_put(lid + 256u * $l, ss[$l]);
  //#end
  workgroupBarrier();
  // acc is indexed with constants only: a dynamic index would move it to local memory and every multiply-add
  // of the main loop with it.
  //#unroll! i MI
  //#unroll! c 4
  {
    let tl = (ty + 16u * $i) * 4u + $c;
    let t = tile_m * TM + tl;
    var f = 1.0;
    if (has(FLAG_NORM)) {
      f = inv_rms(ss_get(tl * 4u) + ss_get(tl * 4u + 1u) + ss_get(tl * 4u + 2u) + ss_get(tl * 4u + 3u));
    }
    if (t < p.n_tokens) {
      //#unroll! j NJ
      {
        let v = acc[($i * 4u + $c) * NJ + $j] * f;
        let r = tile_n * TN + (tx + 16u * $j) * 4u;  // even: SwiGLU pairs are (r, r + 1) and (r + 2, r + 3)
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
      //#end
    }
  }
  //#end
  //#end
}
