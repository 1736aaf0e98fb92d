// Matrix-matrix products (prefill); compiled after matmul_common.wgsl, which documents the weight layout, the
// bindings and the epilogues.
//
// Register tiling: a workgroup of MM_WG = TY x TX threads computes a TM tokens x TN rows tile of y (from the host
// prelude, kernels::MatmulTile), stepping over the row one 32-element block at a time. Each step the threads
// dequantise the W tile (TN rows x 4 units of 8) and load the x tile (TM tokens x 4 units) into workgroup memory,
// k-major, so that a thread reads 4 tokens or 4 rows as one vec4. Thread (ty, tx) owns MI x 4 tokens and NJ x 4
// rows of the tile (TM = 4 MI TY, TN = 4 NJ TX): the vec4 groups ty + TY i and tx + TX j, so the TX threads of a
// row read TX neighbouring vec4 and a step's 32 k feed MI * NJ * 16 multiply-adds per 4 (MI + NJ) elements read
// from workgroup memory. The next block is loaded from memory into registers while the current one is multiplied.
// The loaders are 4 threads per row or token (one unit each), MM_WG / 4 rows or tokens per pass.
//
// The vec4 groups of each k of f32 tiles are swizzled (tix): a loader writes 8 k of one column and the 4 loaders of
// a column sit 8 k apart, which would land all 4 in one bank of workgroup memory; k / 8 * 2 xor-ed into the group
// moves them 0, 2, 4, 6 vec4 apart. A k's groups are only permuted, so the reads of one k stay conflict-free.
// (Measured on the H200: f32 tiles gain up to 15 %, f16 ones lose as much; PERF.md.)
//
// Expert products (MM_EXPERTS; kernels/moe.h, encode_expert_matmul with a group of tiles of TM pairs): workgroup row
// tile_m computes the pairs of tile tile_m of encode_moe_group's tiles (expert, first, count, 0) after the pairs
// ordered by expert in ids: its TM tokens are the pairs ids[first ..][.. count] (x row pair / n_used, or pair with
// x_per_pair; y row pair) and its weight rows the expert's, read once for all of them. Tiles of count 0 (past the
// step's) and experts of other pieces do nothing. A pair's sums do not depend on the other pairs of its tile.
//
// With MM_F16 (shader-f16) the tiles are f16 in workgroup memory and the products of one block (32 k) are summed
// in f16 (vec4<f16>: two f16 multiply-adds per instruction on GPUs that pair them), then added into f32
// accumulators: each weight and activation is rounded to f16 and each 32-term partial sum carries f16 rounding.
//
// MM_CLASS (float weights, f32 tiles; MatmulImpl::Batch where kernels::batch_takes_tiles says so): the sums in the
// order of the matvec in batch decode's shape with MV_FMA (matvec.wgsl), so that a token's outputs are the same bits
// whichever of the two kernels computes them. There, lane c of a row's MM_CLASSES lanes sums units c, c + MM_CLASSES, ... of
// the row (8 elements each) in one fused multiply-add chain, and the lanes' sums meet in a pairwise tree over
// aligned chunks of mm_ch lanes (the subgroup's butterfly), the chunks' sums added in order to 0. Here the units of
// a 32-element block b are those of classes 4 (b % MM_CP) .. + 3 (MM_CP = MM_CLASSES / 4 passes), so the blocks
// are visited pass by pass (g, g + MM_CP, ...): each output keeps one chain per class of the pass (k / 8 of the
// block), and at the end of a pass its four chains enter the tree (mm_class_fold) while the classes' sums of x^2
// wait in workgroup memory for the epilogue's tree (mm_class_ss).
//
// MM_CHUNK (block-type weights with MM_CLASS; the matvec's MV_FMA over chunks): the blocks are the matvec's chunks
// (matmul_common.wgsl: 32 weights as two runs of 16 at chunk_cols), lane class c summing chunks c, c + MM_CLASSES, ...
// in run_acc's arithmetic, so a pass is one class (MM_CP = MM_CLASSES). Loader lane lq takes run lq / 2's half lq % 2,
// k 8 lq .. + 7 of the tiles: the W tile holds the runs' quants as decode_run gives them (q 2^p) and mm_rd / mm_rm
// each row's run scale d and offset m; the x tile holds x (normed) times 2^-p, and mm_xq each token's sums of x
// (normed) and of x^2 per lane lq. A thread chains each output's 16 products of a run in k order (mm_block_chunk), then adds d
// times that and m times the run's sum of x to the class's chain; at a class's end the chain enters the lanes' tree
// (mm_chunk_fold: pairs level by level up to the chunk of mm_ch lanes, the chunks then added in order to 0), and token
// lid's sum of x^2, kept by thread lid, likewise.
//
// MM_SPLIT (with MM_CLASS or MM_CHUNK; host: MM_G classes a group, MM_PG passes): the classes in groups of MM_G that
// are each a subtree of the lanes' tree (MM_G <= the subgroup's size, so mm_ch = MM_G), grid row z of the dispatch
// taking group z: a workgroup walks only its group's passes and writes its outputs' subtree values, and its tokens'
// sums of x^2 likewise (tiles of the first rows), to part ([group][token][row], then [group][token]), where
// matmul_fold.wgsl adds the tree's levels above the groups and runs the epilogue. More workgroups for a product of
// few rows or tokens, the same bits.
@group(0) @binding(10) var<storage, read_write> part: array<f32>;
var<private> mm_pass_lo: u32;  // the workgroup's passes [mm_pass_lo, mm_pass_hi) (all of them without MM_SPLIT)
var<private> mm_pass_hi: u32;
const MM_WG: u32 = TY * TX;
const WARP_4X8: bool = TX % 8u == 0u && TY % 4u == 0u;
const WL: u32 = MM_WG / 4u;  // rows (tokens) per loader pass; NLW = TN / WL and NLX = TM / WL passes (host)
const TM4: u32 = TM / 4u;    // vec4 token groups of one k of the x tile
const TN4: u32 = TN / 4u;    // vec4 row groups of one k of the W tile
// From the host too (the unroll counts): MI token groups and NJ row groups per thread, NACC = MI * 4 * NJ
// accumulators, NLW and NLX loader passes over the W and x tiles.
// NCACC = NACC, or with MM_CLASS over units 4 NACC (a chain per class of the pass); NSTK (MM_CLASS: 4 NACC, MM_CHUNK:
// (NLV + 1) NACC, else 1) the tree's pending nodes of 3 (NLV) levels, then the sum of its chunks; CMI and CNACC, MI
// and NACC with MM_CLASS over units, KMI and KNACC with MM_CHUNK, else 0 (the class functions' unroll counts: their
// constant indices must stay in bounds where they are never called).
var<workgroup> mm_ssc: array<f32, select(1u, TM * MM_CLASSES, MM_CLASS && !MM_CHUNK)>;  // [token][class] sums of x^2
// MM_CHUNK: the runs' scales and offsets [run][row / 4], each token's sums [token][of x, of x^2][lane lq] and, for the
// epilogue, its whole sum of x^2. NLV (host): the tree's levels in a chunk of lanes (log2 of the largest mm_ch).
var<workgroup> mm_rd: array<vec4<f32>, select(1u, 2u * TN4, MM_CHUNK)>;
var<workgroup> mm_rm: array<vec4<f32>, select(1u, 2u * TN4, MM_CHUNK)>;
var<workgroup> mm_xq: array<vec4<f32>, select(1u, 2u * TM, MM_CHUNK)>;
var<workgroup> mm_xss: array<f32, select(1u, TM, MM_CHUNK)>;
var<workgroup> xs: array<vec4<MM_T>, 32u * TM4>;  // [k: 32][token / 4, swizzled]
var<workgroup> ws: array<vec4<MM_T>, 32u * TN4>;  // [k: 32][row / 4, swizzled]
// FLAG_NORM: the sums of x^2 [token][loader lane: 4] go through ss_put / ss_get (host prelude): into xs, once
// consumed, for f32 tiles, into an array of their own for f16 ones.

// MM_EXPERTS: the tile's pairs (the last repeated past its count) and their count.
var<workgroup> mm_tile: vec4<u32>;
var<workgroup> mm_pairs: array<u32, TM>;
var<private> mm_count: u32;

// Token tl of the tile (tile_m): whether it exists, its x row and its y row (the token; in expert products, its
// pair's rows).
fn mm_live(tile_m: u32, tl: u32) -> bool {
  if (MM_EXPERTS) { return tl < mm_count; }
  return tile_m * TM + tl < p.n_tokens;
}
fn mm_x_row(tile_m: u32, tl: u32) -> u32 {
  if (MM_EXPERTS) {  // (a branch, not a select: the other pipelines never touch mm_pairs)
    let pair = mm_pairs[tl];
    return select(pair / p.n_used, pair, p.x_per_pair != 0u);
  }
  return tile_m * TM + tl;
}
fn mm_y_row(tile_m: u32, tl: u32) -> u32 {
  if (MM_EXPERTS) { return mm_pairs[tl]; }
  return tile_m * TM + tl;
}

// The vec4 of group g at k in a tile of `width` vec4 per k (swizzled where width is a multiple of 8: the 16-token
// tiles of batch decode's products are 4 wide).
fn tix(k: u32, g: u32, width: u32) -> u32 {
  return k * width + select(g ^ ((k / 8u) * 2u), g, MM_F16 || width < 8u);
}

// Eight values into column `c` (a token or row of the tile) at k0 .. k0 + 7 of a k-major tile.
fn put8(tile_w: u32, c: u32, k0: u32, v: W8, is_w: bool) {
  let g = c / 4u;
  let e = c % 4u;
  for (var i = 0u; i < 4u; i += 1u) {
    if (is_w) {
      ws[tix(k0 + i, g, tile_w)][e] = MM_T(v.lo[i]);
      ws[tix(k0 + 4u + i, g, tile_w)][e] = MM_T(v.hi[i]);
    } else {
      xs[tix(k0 + i, g, tile_w)][e] = MM_T(v.lo[i]);
      xs[tix(k0 + 4u + i, g, tile_w)][e] = MM_T(v.hi[i]);
    }
  }
}

// acc += the products of the block in the tiles: f32 multiply-adds. The 32 k are unrolled on GPUs (`//#unroll`):
// every workgroup-memory address is then a thread's base plus a constant (H200: products with many workgroups
// 1.25-1.4x faster than with the loop left to the driver, pp512 1.02x; PERF.md). CPU adapters keep the loop (LLVM
// compiles straight-line shaders slowly).
fn mm_block_f32(acc: ptr<function, array<vec4<f32>, NCACC>>, ty: u32, tx: u32) {
  //#unroll k 32
  {
    var a: array<vec4<f32>, MI>;
    var bw: array<vec4<f32>, NJ>;
    //#unroll! i MI
    a[$i] = vec4<f32>(xs[tix($k, ty + TY * $i, TM4)]);
    //#end
    //#unroll! j NJ
    bw[$j] = vec4<f32>(ws[tix($k, tx + TX * $j, TN4)]);
    //#end
    //#unroll! i MI
    //#unroll! c 4
    //#unroll! j NJ
    (*acc)[($i * 4u + $c) * NJ + $j] += a[$i][$c] * bw[$j];
    //#end
    //#end
    //#end
  }
  //#end
}

// The same with the block's products summed in f16, then added to the f32 accumulators.
fn mm_block_f16(acc: ptr<function, array<vec4<f32>, NCACC>>, ty: u32, tx: u32) {
  var part: array<vec4<MM_T>, NACC>;
  //#unroll! a NACC
  part[$a] = vec4<MM_T>(0.0);
  //#end
  //#unroll k 32
  {
    var a: array<vec4<MM_T>, MI>;
    var bw: array<vec4<MM_T>, NJ>;
    //#unroll! i MI
    a[$i] = xs[tix($k, ty + TY * $i, TM4)];
    //#end
    //#unroll! j NJ
    bw[$j] = ws[tix($k, tx + TX * $j, TN4)];
    //#end
    //#unroll! i MI
    //#unroll! c 4
    //#unroll! j NJ
    part[($i * 4u + $c) * NJ + $j] += a[$i][$c] * bw[$j];
    //#end
    //#end
    //#end
  }
  //#end
  //#unroll! a NACC
  (*acc)[$a] += vec4<f32>(part[$a]);
  //#end
}

// MM_CLASS: the block's products into the chains of their classes (k / 8), fused multiply-adds in k order.
fn mm_block_class(acc: ptr<function, array<vec4<f32>, NCACC>>, ty: u32, tx: u32) {
  //#unroll k 32
  {
    var a: array<vec4<f32>, MI>;
    var bw: array<vec4<f32>, NJ>;
    //#unroll! i MI
    a[$i] = vec4<f32>(xs[tix($k, ty + TY * $i, TM4)]);
    //#end
    //#unroll! j NJ
    bw[$j] = vec4<f32>(ws[tix($k, tx + TX * $j, TN4)]);
    //#end
    //#unroll! i CMI
    //#unroll! c 4
    //#unroll! j NJ
    {
      let o = ($k / 8u) * NACC + ($i * 4u + $c) * NJ + $j;
      (*acc)[o] = fma(vec4<f32>(a[$i][$c]), bw[$j], (*acc)[o]);
    }
    //#end
    //#end
    //#end
  }
  //#end
}

// MM_CLASS: the four chains of pass g (classes 4g .. 4g + 3) into the tree of every output, the chains then reset.
// st holds the pending nodes of the tree's levels 2, 3 and 4 (the levels of whole passes within a chunk) and, last,
// the sum of the chunks.
fn mm_class_fold(acc: ptr<function, array<vec4<f32>, NCACC>>, st: ptr<function, array<vec4<f32>, NSTK>>, g: u32) {
  //#unroll! a CNACC
  {
    let c0 = (*acc)[$a];
    let c1 = (*acc)[NACC + $a];
    let c2 = (*acc)[2u * NACC + $a];
    let c3 = (*acc)[3u * NACC + $a];
    let sum = 3u * NACC + $a;
    if (mm_ch >= 4u) {
      var v = (c0 + c1) + (c2 + c3);
      var pending = true;
      if (mm_ch >= 8u) {
        if ((g & 1u) == 0u) {
          (*st)[$a] = v;
          pending = false;
        } else {
          v = (*st)[$a] + v;
        }
      }
      if (pending && mm_ch >= 16u) {
        if ((g & 2u) == 0u) {
          (*st)[NACC + $a] = v;
          pending = false;
        } else {
          v = (*st)[NACC + $a] + v;
        }
      }
      if (pending && mm_ch >= 32u) {
        if ((g & 4u) == 0u) {
          (*st)[2u * NACC + $a] = v;
          pending = false;
        } else {
          v = (*st)[2u * NACC + $a] + v;
        }
      }
      if (pending) { (*st)[sum] = (*st)[sum] + v; }  // a chunk complete
    } else if (mm_ch == 2u) {
      (*st)[sum] = ((*st)[sum] + (c0 + c1)) + (c2 + c3);
    } else {
      (*st)[sum] = ((((*st)[sum] + c0) + c1) + c2) + c3;
    }
    //#unroll! q 4
    (*acc)[$q * NACC + $a] = vec4<f32>(0.0);
    //#end
  }
  //#end
}

// MM_CLASS: token tl's sum of x^2 from its classes' sums, through the same tree.
fn mm_class_ss(tl: u32) -> f32 {
  var v: array<f32, MM_CLASSES>;
  for (var c = 0u; c < MM_CLASSES; c += 1u) { v[c] = mm_ssc[tl * MM_CLASSES + c]; }
  var sum = 0.0;
  for (var j = 4u * mm_pass_lo; j < 4u * mm_pass_hi; j += mm_ch) {  // the workgroup's classes
    for (var m = 1u; m < mm_ch; m <<= 1u) {
      for (var i = j; i < j + mm_ch; i += 2u * m) { v[i] = v[i] + v[i + m]; }
    }
    sum = sum + v[j];
  }
  return sum;
}

// MM_CHUNK: the block's two runs into the class chains: per run each output's 16 products chained by fma in k order,
// then acc = fma(d, that, acc) and acc = fma(m, sum of the token's x over the run, acc) (run_fma's arithmetic).
fn mm_block_chunk(acc: ptr<function, array<vec4<f32>, NCACC>>, ty: u32, tx: u32) {
  //#unroll! r 2
  {
    var dq: array<vec4<f32>, NACC>;
    //#unroll! a KNACC
    dq[$a] = vec4<f32>(0.0);
    //#end
    //#unroll k 16
    {
      var a: array<vec4<f32>, MI>;
      var bw: array<vec4<f32>, NJ>;
      //#unroll! i MI
      a[$i] = vec4<f32>(xs[tix(16u * $r + $k, ty + TY * $i, TM4)]);
      //#end
      //#unroll! j NJ
      bw[$j] = vec4<f32>(ws[tix(16u * $r + $k, tx + TX * $j, TN4)]);
      //#end
      //#unroll! i KMI
      //#unroll! c 4
      //#unroll! j NJ
      dq[($i * 4u + $c) * NJ + $j] = fma(vec4<f32>(a[$i][$c]), bw[$j], dq[($i * 4u + $c) * NJ + $j]);
      //#end
      //#end
      //#end
    }
    //#end
    //#unroll! i KMI
    //#unroll! c 4
    {
      let q = mm_xq[2u * ((ty + TY * $i) * 4u + $c)];
      let sx = vec4<f32>(q[2u * $r] + q[2u * $r + 1u]);
      //#unroll! j NJ
      {
        let o = ($i * 4u + $c) * NJ + $j;
        var v = fma(mm_rd[$r * TN4 + tx + TX * $j], dq[o], (*acc)[o]);
        if (chunk_min(WTYPE)) { v = fma(mm_rm[$r * TN4 + tx + TX * $j], sx, v); }
        (*acc)[o] = v;
      }
      //#end
    }
    //#end
    //#end
  }
  //#end
}

// MM_CHUNK: the chains of class g into the tree of every output (then reset): st holds a pending node per level (NLV
// levels of pairs within a chunk of mm_ch lanes), then the sum of the chunks.
fn mm_chunk_fold(acc: ptr<function, array<vec4<f32>, NCACC>>, st: ptr<function, array<vec4<f32>, NSTK>>, g: u32) {
  //#unroll! a KNACC
  {
    var v = (*acc)[$a];
    var pending = true;
    //#unroll! l NLV
    if (pending && mm_ch > (1u << $l)) {
      if (((g >> $l) & 1u) == 0u) {
        (*st)[$l * NACC + $a] = v;
        pending = false;
      } else {
        v = (*st)[$l * NACC + $a] + v;
      }
    }
    //#end
    if (pending) { (*st)[NLV * NACC + $a] = (*st)[NLV * NACC + $a] + v; }
    (*acc)[$a] = vec4<f32>(0.0);
  }
  //#end
}

// MM_CHUNK: the same for a token's sum of x^2 of class g (thread lid < TM, its token lid).
var<private> mm_sst: array<f32, NLV + 1u>;
fn mm_chunk_fold_ss(ss: f32, g: u32) {
  var v = ss;
  var pending = true;
  //#unroll! l NLV
  if (pending && mm_ch > (1u << $l)) {
    if (((g >> $l) & 1u) == 0u) {
      mm_sst[$l] = v;
      pending = false;
    } else {
      v = mm_sst[$l] + v;
    }
  }
  //#end
  if (pending) { mm_sst[NLV] = mm_sst[NLV] + v; }
}

// MM_CHUNK: run lq / 2's half lq % 2 of chunk c of piece row r (zeros past the piece's rows) and the run's d and m.
struct WHalf { q: W8, d: f32, m: f32, }
fn mm_w_half(r: u32, c: u32, lq: u32) -> WHalf {
  if (r >= p.n_rows) { return WHalf(W8(vec4<f32>(0.0), vec4<f32>(0.0)), 0.0, 0.0); }  // (no experts: wbase 0)
  let run = decode_run(WTYPE, load_raw(WTYPE, r, c), c, lq / 2u);
  if (lq % 2u == 0u) { return WHalf(W8(run.q.a, run.q.b), run.d, run.m); }
  return WHalf(W8(run.q.c, run.q.e), run.d, run.m);
}

// MM_CHUNK: the first column of loader lane lq's 8 in chunk c.
fn mm_chunk_col(c: u32, lq: u32) -> u32 { return chunk_cols(WTYPE, c)[lq / 2u] + 8u * (lq % 2u); }

// The norm weights of columns col .. + 8 (col a multiple of 8), clamped to the buffer's last vec4 as norm16 does.
fn norm8_at(col: u32) -> W8 {
  let last = (p.n_in + 3u) / 4u - 1u;
  return W8(norm[min(col / 4u, last)], norm[min(col / 4u + 1u, last)]);
}

// MM_CLASS: the block after b (p.nb after the last): the next of its pass, else the first of the next pass.
fn mm_next(b: u32) -> u32 {
  if (!MM_CLASS) { return b + 1u; }
  if (b + MM_CP < p.nb) { return b + MM_CP; }
  let g = b % MM_CP + 1u;
  return select(p.nb, g, g < mm_pass_hi && g < p.nb);
}

// The first of the workgroup's passes (group z of MM_SPLIT) and the end of its passes.
fn mm_passes(z: u32) {
  mm_pass_lo = 0u;
  mm_pass_hi = MM_CP;
  if (MM_SPLIT) {
    mm_pass_lo = z * MM_PG;
    mm_pass_hi = mm_pass_lo + MM_PG;
  }
}

// MM_SPLIT: token t's subtree values of piece rows r .. r + 3 (those in the piece) into part, for group z.
fn mm_part4(z: u32, t: u32, r: u32, v: vec4<f32>) {
  let base = (z * p.n_tokens + t) * p.n_rows + r;
  for (var i = 0u; i < 4u; i += 1u) {
    if (r + i < p.n_rows) { part[base + i] = v[i]; }
  }
}
// MM_SPLIT: token t's subtree value of its sum of x^2, after the values of every group.
fn mm_part_ss(z: u32, t: u32, ss: f32) { part[MM_GROUPS * p.n_tokens * p.n_rows + z * p.n_tokens + t] = ss; }

// Thread lid's (ty, tx): a 32-thread warp covers 4 ty x 8 tx where the tile allows, so that it reads 4 vec4 of x
// (broadcast to 8 threads each) and 8 of W per k, not 2 and 16.
fn mm_thread(lid: u32) -> vec2<u32> {
  if (WARP_4X8) {
    let warp = lid / 32u;
    return vec2<u32>((warp / (TX / 8u)) * 4u + (lid % 32u) / 8u, (warp % (TX / 8u)) * 8u + lid % 8u);
  }
  return vec2<u32>(lid / TX, lid % TX);
}

// Token t's outputs of piece rows r .. r + 3 (r even: SwiGLU pairs are (r, r + 1) and (r + 2, r + 3)) to the epilogue.
fn mm_store4(t: u32, r: u32, v: vec4<f32>) {
  store_rows2(t, r, v.x, v.y);
  store_rows2(t, r + 2u, v.z, v.w);
}

// MM_CHUNK's kernel (matmul_main's thread layout and loaders; batch decode: no expert products).
fn mm_chunk_main(wid: vec3<u32>, lid: u32) {
  let flat = wid.x + wid.y * p.grid_x;
  let tile_n = flat % p.row_tiles;
  let tile_m = flat / p.row_tiles;
  if (tile_m * TM >= p.n_tokens) { return; }  // grid padding: uniform per workgroup
  let tyx = mm_thread(lid);
  let ty = tyx.x;
  let tx = tyx.y;
  let ld = lid / 4u;  // loader: W tile row / x tile token (+ WL l)
  let lq = lid % 4u;  // loader: run lq / 2, half lq % 2
  let xsa = chunk_xs(WTYPE);
  let xsc = select(xsa[0], xsa[1], lq >= 2u);  // 2^-p of the loader's run

  var acc: array<vec4<f32>, NCACC>;  // the class chains [token group i][component c][row group j]
  var st: array<vec4<f32>, NSTK>;    // the tree's pending nodes [level][output], then the sum of its chunks
  //#unroll! a KNACC
  acc[$a] = vec4<f32>(0.0);
  //#end
  //#unroll! a NSTK
  st[$a] = vec4<f32>(0.0);
  //#end
  //#unroll! l NLV
  mm_sst[$l] = 0.0;
  //#end
  mm_sst[NLV] = 0.0;
  var ss_class = 0.0;  // thread lid < TM: token lid's sum of x^2 over its class so far
  var wh: array<WHalf, NLW>;
  var xv: array<W8, NLX>;

  var b = mm_pass_lo;
  var first = true;
  loop {
    if (b >= p.nb) { break; }
    if (first) {  // the first block into registers
      first = false;
      //#unroll! l NLW
      wh[$l] = mm_w_half(tile_n * TN + ld + WL * $l, b, lq);
      //#end
      //#unroll! l NLX
      {
        let t = tile_m * TM + ld + WL * $l;
        xv[$l] = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (t < p.n_tokens) { xv[$l] = load_x8(t, mm_chunk_col(b, lq) / 8u); }
      }
      //#end
    }
    workgroupBarrier();  // the previous step's tiles are consumed
    //#unroll! l NLW
    {
      let rt = ld + WL * $l;  // the tile's row
      put8(TN4, rt, 8u * lq, wh[$l].q, true);
      if (lq % 2u == 0u) {
        mm_rd[(lq / 2u) * TN4 + rt / 4u][rt % 4u] = wh[$l].d;
        mm_rm[(lq / 2u) * TN4 + rt / 4u][rt % 4u] = wh[$l].m;
      }
    }
    //#end
    //#unroll! l NLX
    {
      let tl = ld + WL * $l;
      var v = xv[$l];
      var ssq = 0.0;
      if (has(FLAG_NORM)) {
        ssq = fma8(v, v, 0.0);
        let g = norm8_at(mm_chunk_col(b, lq));
        v = W8(v.lo * g.lo, v.hi * g.hi);
      }
      mm_xq[2u * tl][lq] = sum8(v);
      mm_xq[2u * tl + 1u][lq] = ssq;
      put8(TM4, tl, 8u * lq, W8(v.lo * xsc, v.hi * xsc), false);
    }
    //#end
    workgroupBarrier();
    let next = mm_next(b);
    if (next < p.nb) {  // the next block's loads overlap this block's multiply-adds
      //#unroll! l NLW
      wh[$l] = mm_w_half(tile_n * TN + ld + WL * $l, next, lq);
      //#end
      //#unroll! l NLX
      {
        let t = tile_m * TM + ld + WL * $l;
        if (t < p.n_tokens) { xv[$l] = load_x8(t, mm_chunk_col(next, lq) / 8u); }
      }
      //#end
    }
    mm_block_chunk(&acc, ty, tx);
    if (lid < TM) {
      let q = mm_xq[2u * lid + 1u];
      ss_class = ss_class + (q.x + q.y);
      ss_class = ss_class + (q.z + q.w);
    }
    if (b + MM_CP >= p.nb) {  // the class's last block
      let g = b % MM_CP;
      mm_chunk_fold(&acc, &st, g);
      if (lid < TM) { mm_chunk_fold_ss(ss_class, g); }
      ss_class = 0.0;
    }
    b = next;
  }
  // classes without blocks (rows of fewer chunks)
  for (var g = clamp(p.nb, mm_pass_lo, mm_pass_hi); g < mm_pass_hi; g += 1u) {
    mm_chunk_fold(&acc, &st, g);
    if (lid < TM) { mm_chunk_fold_ss(0.0, g); }
  }
  if (lid < TM) {
    mm_xss[lid] = mm_sst[NLV];
    let t = tile_m * TM + lid;
    if (MM_SPLIT && tile_n == 0u && t < p.n_tokens) { mm_part_ss(wid.z, t, mm_sst[NLV]); }
  }
  workgroupBarrier();
  //#unroll! i KMI
  //#unroll! c 4
  {
    let tl = (ty + TY * $i) * 4u + $c;
    let t = tile_m * TM + tl;
    var f = 1.0;
    if (has(FLAG_NORM)) { f = inv_rms(mm_xss[tl]); }
    if (t < p.n_tokens) {
      //#unroll! j NJ
      {
        let r = tile_n * TN + (tx + TX * $j) * 4u;
        let v = st[NLV * NACC + ($i * 4u + $c) * NJ + $j];
        if (MM_SPLIT) {
          mm_part4(wid.z, t, r, v);
        } else {
          mm_store4(t, r, v * f);
        }
      }
      //#end
    }
  }
  //#end
  //#end
}

// The entry point `matmul` (host prelude) passes the subgroup size: MM_CLASS's chunk (1 without subgroups).
var<private> mm_ch: u32;
fn matmul_main(wid: vec3<u32>, lid: u32, sg_size: u32) {
  mm_ch = min(MM_G, sg_size);
  mm_passes(wid.z);
  if (MM_CHUNK) {
    mm_chunk_main(wid, lid);
    return;
  }
  let flat = wid.x + wid.y * p.grid_x;
  let tile_n = flat % p.row_tiles;
  let tile_m = flat / p.row_tiles;
  var wbase = 0u;  // expert products: the piece row of the expert's row 0
  if (MM_EXPERTS) {
    if (tile_m >= p.n_tokens) { return; }  // grid padding (n_tokens: the tile slots): uniform per workgroup
    if (lid == 0u) { mm_tile = expert_tile(tile_m); }
    let tile = workgroupUniformLoad(&mm_tile);
    mm_count = tile.z;
    wbase = expert_rows(tile);
    if (wbase == NO_EXPERT) { return; }
    for (var i = lid; i < TM; i += MM_WG) { mm_pairs[i] = ids[tile.y + min(i, mm_count - 1u)]; }
    workgroupBarrier();
  } else if (tile_m * TM >= p.n_tokens) {
    return;  // grid padding: uniform per workgroup
  }
  let tyx = mm_thread(lid);
  let ty = tyx.x;
  let tx = tyx.y;
  // Threads whose tokens all lie past the tile's count (a pair count's or a prompt's remainder: ty's first group is
  // its lowest) load and wait at the barriers but multiply nothing
  let busy = 4u * ty < select(p.n_tokens - tile_m * TM, mm_count, MM_EXPERTS);
  let ld = lid / 4u;  // loader: W tile row / x tile token (+ WL l)
  let lq = lid % 4u;  // loader: unit within the block
  let k0 = lq * 8u;

  var acc: array<vec4<f32>, NCACC>;  // [class (MM_CLASS)][token group i][component c][row group j]
  //#unroll! a NCACC
  acc[$a] = vec4<f32>(0.0);
  //#end
  var st: array<vec4<f32>, NSTK>;
  //#unroll! a NSTK
  st[$a] = vec4<f32>(0.0);
  //#end
  var wv: array<W8, NLW>;
  var xv: array<W8, NLX>;
  var ss: array<f32, NLX>;  // FLAG_NORM: this loader's part of sum(x^2) of its tokens
  //#unroll! l NLX
  ss[$l] = 0.0;
  //#end

  var b = mm_pass_lo;
  var first = true;
  loop {
    if (b >= p.nb) { break; }
    if (first) {  // the first block into registers (zeros outside the matrix)
      first = false;
      //#unroll! l NLW
      {
        let r = tile_n * TN + ld + WL * $l;
        wv[$l] = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (r < p.n_rows) { wv[$l] = load8(wbase + r, b * 4u + lq); }
      }
      //#end
      //#unroll! l NLX
      {
        let tl = ld + WL * $l;
        xv[$l] = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (mm_live(tile_m, tl)) { xv[$l] = load_x8(mm_x_row(tile_m, tl), b * 4u + lq); }
      }
      //#end
    }
    workgroupBarrier();  // the previous step's tiles are consumed
    //#unroll! l NLW
    put8(TN4, ld + WL * $l, k0, wv[$l], true);
    //#end
    //#unroll! l NLX
    {
      var v = xv[$l];
      if (has(FLAG_NORM)) {
        if (MM_CLASS) {
          ss[$l] = fma8(v, v, ss[$l]);
        } else {
          ss[$l] += dot(v.lo, v.lo) + dot(v.hi, v.hi);
        }
        let g = norm8(b * 4u + lq);
        v = W8(v.lo * g.lo, v.hi * g.hi);
      }
      put8(TM4, ld + WL * $l, k0, v, false);
    }
    //#end
    workgroupBarrier();
    let next = mm_next(b);
    if (next < p.nb) {  // the next block's loads overlap this block's multiply-adds
      let u = next * 4u + lq;
      //#unroll! l NLW
      {
        let r = tile_n * TN + ld + WL * $l;
        if (r < p.n_rows) { wv[$l] = load8(wbase + r, u); }
      }
      //#end
      //#unroll! l NLX
      {
        let tl = ld + WL * $l;
        if (mm_live(tile_m, tl)) { xv[$l] = load_x8(mm_x_row(tile_m, tl), u); }
      }
      //#end
    }
    if (MM_CLASS) {
      mm_block_class(&acc, ty, tx);
      if (b + MM_CP >= p.nb) {  // the pass's last block
        let g = b % MM_CP;
        mm_class_fold(&acc, &st, g);
        //#unroll! l NLX
        {
          mm_ssc[(ld + WL * $l) * MM_CLASSES + 4u * g + lq] = ss[$l];
          ss[$l] = 0.0;
        }
        //#end
      }
    } else if (busy) {  // (a branch around the products: the barriers stay in uniform control flow)
      if (MM_F16) {
        mm_block_f16(&acc, ty, tx);
      } else {
        mm_block_f32(&acc, ty, tx);
      }
    }
    b = next;
  }
  if (MM_CLASS) {  // passes without blocks (rows of fewer than MM_CP blocks): classes of no units
    for (var g = clamp(p.nb, mm_pass_lo, mm_pass_hi); g < mm_pass_hi; g += 1u) {
      mm_class_fold(&acc, &st, g);
      //#unroll! l NLX
      mm_ssc[(ld + WL * $l) * MM_CLASSES + 4u * g + lq] = 0.0;
      //#end
    }
  }

  workgroupBarrier();  // xs is consumed
  if (!MM_CLASS) {
    //#unroll! l NLX
    ss_put(lid + MM_WG * $l, ss[$l]);
    //#end
  }
  workgroupBarrier();
  // acc is indexed with constants only: a dynamic index would move it to local memory and every multiply-add
  // of the main loop with it.
  //#unroll! i MI
  //#unroll! c 4
  {
    let tl = (ty + TY * $i) * 4u + $c;
    let t = mm_y_row(tile_m, tl);
    var f = 1.0;
    if (has(FLAG_NORM)) {
      if (MM_CLASS) {
        let ss = mm_class_ss(tl);
        f = inv_rms(ss);
        if (MM_SPLIT && tile_n == 0u && tx == 0u && mm_live(tile_m, tl)) { mm_part_ss(wid.z, t, ss); }
      } else {
        f = inv_rms(ss_get(tl * 4u) + ss_get(tl * 4u + 1u) + ss_get(tl * 4u + 2u) + ss_get(tl * 4u + 3u));
      }
    }
    if (mm_live(tile_m, tl)) {
      //#unroll! j NJ
      {
        let r = tile_n * TN + (tx + TX * $j) * 4u;
        var v = acc[($i * 4u + $c) * NJ + $j] * f;
        if (MM_CLASS) {
          let node = st[select(0u, 3u * NACC + ($i * 4u + $c) * NJ + $j, MM_CLASS && !MM_CHUNK)];
          v = node * f;
          if (MM_SPLIT) { mm_part4(wid.z, t, r, node); }
        }
        if (!MM_SPLIT) { mm_store4(t, r, v); }
      }
      //#end
    }
  }
  //#end
  //#end
}
