// Matrix-vector products (decode) on GPUs; compiled after matmul_common.wgsl, which documents the
// weight layout, the bindings and the epilogues, rope_angle.wgsl and rope_kv_epilogue.wgsl (the fused RoPE epilogue).

// Matrix-vector (decode). A workgroup is MV_G groups of MV_T threads; a group owns MV_R
// adjacent rows (host constants, per adapter and weight). For the block types (MV_CHUNKS) thread lt
// of a group reads chunks lt, lt + MV_T, ... (matmul_common.wgsl's load_raw: 32 weights from one
// or two 16-byte quant loads, decoded a run of 16 at a time by decode_run) of each of its rows, MV_U
// chunks of each row per step (MV_R x MV_U loads in flight); for the float types 8-element units
// the same way (load8). It keeps MV_R x NT partial dots plus NT partial sums of x^2 (for
// FLAG_NORM). x is read once per group for all MV_R rows (as vec4 when XV4).
// The group's partials are summed with subgroup shuffles over min(MV_T, subgroup size) lanes,
// then through workgroup memory. Traffic: the piece's weight bytes once per dispatch, NT tokens.
// NT may exceed p.n_tokens (the host rounds a batch's count up to 8 or 16): the missing tokens read the last one
// and are never stored. A token's arithmetic is the same whatever NT, MV_R, MV_G and MV_U are (only MV_T decides
// which chunks a lane sums, in which order), so a token's outputs are the same bits alone or beside 15 others.
// MV_FMA (batch decode's shape, MatvecConfig::fma_order): the float types' unit products chained through fma in element
// order, the block types' runs as run_acc takes them, units or chunks past the row skipped, so that matmul.wgsl's
// MM_CLASS can reproduce a token's bits.
// MV_INT (one token, Q4_K or Q6_K; MatmulOptions::digits): xdig holds x's packed 8-bit digits and per-block scales
// (int_dot.wgsl; the scales from vec4 p.x_off on) and the sums come from packed integer dot products.
// MV_COMBINE (experts, one token a workgroup row): its pairs' outputs summed into y, weighted, in the same dispatch
// (mv_combine).
// MV_ROUTE (experts, NT = 1; ExpertOptions::route): each workgroup chooses its pair's expert from the router's logits
// first (matvec_route.wgsl's mv_route; a stub that is never called otherwise).
// MV_CHOOSE (NT = 1; MatmulOptions::choose): one workgroup walks every row of a router's product, then chooses the
// token's experts from those logits (matvec_route.wgsl's mv_choose; a stub otherwise).
// MV_PRE (one token; MatmulOptions::pre): first the residual add that a post-norm would have run as a dispatch of its
// own, x' = (x + rms_norm(pre_src) * pre_w) * p.pre_scale, into workgroup memory in every workgroup (MV_PRE_V4 vec4,
// n_in / 4), which the products then read as x; workgroup 0 also writes x' to pre_out, the residual's next buffer.
// TWO_TYPES (one token, the block types; MatmulOptions::second): the rows from p.split2 on are the second weight's,
// w2 of type WTYPE2 (matmul_common.wgsl), a Q4_K_M layer's Q6_K v beside its Q4_K q/k.
// The entry point `matvec` (host prelude) passes the subgroup size (1 without subgroups).
const MV_WG: u32 = MV_T * MV_G;
const MV_ROWS: u32 = MV_G * MV_R;
// MV_NV = MV_R * NT + NT (host constant): values per thread, dots [row][token] then x^2 [token].
// MV_SLOTS (host constant): partial sums per group and value left after the shuffles, MV_T / the
// adapter's smallest subgroup size (at least 4; 1 without subgroups).
var<workgroup> red: array<f32, MV_NV * MV_G * MV_SLOTS>;

// MV_PRE: its inputs and output, x' and the sum of squares' tree (one slot where MV_PRE is off).
@group(0) @binding(13) var<storage, read> pre_src: array<vec4<f32>>;
@group(0) @binding(14) var<storage, read> pre_w: array<vec4<f32>>;
@group(0) @binding(15) var<storage, read_write> pre_out: array<vec4<f32>>;
var<workgroup> mv_pre_x: array<vec4<f32>, MV_PRE_V4>;
// MV_INT: x's digits and scales (a placeholder otherwise).
@group(0) @binding(16) var<storage, read> xdig: array<vec4<u32>>;
// MV_COMBINE: the router's weight of each pair (a placeholder otherwise).
@group(0) @binding(17) var<storage, read> cw: array<f32>;
var<workgroup> mv_pre_red: array<f32, select(1u, MV_WG, MV_PRE)>;

// x' of this token (MV_PRE): rms_norm(pre_src) over n_in, the sum of squares through subgroup sums and one slot
// per subgroup (without subgroups: a tree over the workgroup, MV_WG a power of two), then
// (x + pre_src * inv * pre_w) * pre_scale, the norm kernel's arithmetic (norm.wgsl, ACCUMULATE).
fn mv_pre(flat: u32, lid: u32, sg_size: u32) {
  let n4 = p.n_in / 4u;
  var ss = 0.0;
  for (var i = lid; i < n4; i += MV_WG) {
    let v = pre_src[i];
    ss += dot(v, v);
  }
  var total = 0.0;
  if (sg_size > 1u) {  // uniform: the subgroup size
    let sg_ss = mv_lane_sum(ss, min(sg_size, MV_WG));
    if (lid % sg_size == 0u) { mv_pre_red[lid / sg_size] = sg_ss; }
    workgroupBarrier();
    for (var g = 0u; g < (MV_WG + sg_size - 1u) / sg_size; g += 1u) { total += mv_pre_red[g]; }
  } else {
    mv_pre_red[lid] = ss;
    workgroupBarrier();
    for (var s = MV_WG / 2u; s > 0u; s >>= 1u) {
      if (lid < s) { mv_pre_red[lid] += mv_pre_red[lid + s]; }
      workgroupBarrier();
    }
    total = mv_pre_red[0];
  }
  let inv = 1.0 / sqrt(total / f32(p.n_in) + p.eps);
  for (var i = lid; i < n4; i += MV_WG) {
    let v = (x4[p.x_off / 4u + i] + pre_src[i] * inv * pre_w[i]) * p.pre_scale;
    mv_pre_x[i] = v;
    if (flat == 0u) { pre_out[i] = v; }
  }
  workgroupBarrier();
}

// Expert products (MV_EXPERTS; kernels/moe.h): the weight stacks experts' matrices of p.n_rows rows each, this
// piece's from expert p.expert_first (p.n_experts of them). Pair i = token * p.n_used + slot takes expert e(i)'s rows
// for x row i / p.n_used (i with p.x_per_pair) into y row i.
//   NT = 1: workgroup row z of the grid computes pair z, e(z) = ids[z].
//   NT > 1 (grouped): ids holds the pairs ordered by expert, then from p.tiles_off the tiles encode_moe_group made
//   (expert, first, count <= NT, 0): workgroup row z computes tile z's pairs ids[first ..][.. count], reading the
//   expert's rows once for all of them. Tiles of count 0 (past the step's) do nothing.
// A workgroup whose expert is in another piece does nothing. A pair's sums are those of its lone product.
var<workgroup> mv_tile: vec4<u32>;
var<private> mv_x_rows: array<u32, NT>;  // the pass's token t: its pair's x row and y row
var<private> mv_y_rows: array<u32, NT>;
var<private> mv_count: u32;  // pairs in the pass

// The token a pass's token t reads: past the pass's count, its last.
fn mv_tok(t: u32) -> u32 {
  if (MV_EXPERTS) { return mv_x_rows[min(t, mv_count - 1u)]; }
  return min(t, p.n_tokens - 1u);
}

// Value v = j * NT + t of a group whose first row is row0 (row row0 + j, token t) with its next three rows' values
// (for the SwiGLU and RoPE epilogues; zero past the group) and its token's sum of x^2: the epilogue and the store.
fn mv_store(row0: u32, v: u32, dot_sum: f32, up_sum: f32, dot2: f32, dot3: f32, ss: f32) {
  let j = v / NT;
  let t = v % NT;
  var ty = t;  // the y row
  var count = p.n_tokens;
  if (MV_EXPERTS) {  // (a branch, not a select: the other pipelines never touch these arrays)
    ty = mv_y_rows[min(t, NT - 1u)];
    count = mv_count;
  }
  let r = row0 + j;
  var scale = 1.0;
  if (has(FLAG_NORM)) { scale = inv_rms(ss); }
  if (r >= p.n_rows || t >= count) { return; }
  if (has(FLAG_SWIGLU)) {
    if (j % 2u == 0u) { store_swiglu(ty, r, dot_sum * scale, up_sum * scale); }
  } else if (has(FLAG_ROPE_KV)) {
    if (has(FLAG_NEOX)) {
      if (j % 4u == 0u) { store_rope_kv_neox(r, vec4<f32>(dot_sum, up_sum, dot2, dot3) * scale); }
    } else if (j % 2u == 0u) {
      store_rope_kv(r, dot_sum * scale, up_sum * scale);
    }
  } else {
    store_y(ty, r, dot_sum * scale);
  }
}

fn mv_x8(t: u32, u: u32) -> W8 {
  if (MV_PRE) { return W8(mv_pre_x[2u * u], mv_pre_x[2u * u + 1u]); }
  if (XV4) {
    let i = (p.x_off + t * p.n_in) / 4u + 2u * u;
    return W8(x4[i], x4[i + 1u]);
  }
  return load_x8(t, u);
}

// x[t][col .. + 16) (col a multiple of 16).
fn mv_x16(t: u32, col: u32) -> Q16 {
  if (MV_PRE) {
    let i = col / 4u;
    return Q16(mv_pre_x[i], mv_pre_x[i + 1u], mv_pre_x[i + 2u], mv_pre_x[i + 3u]);
  }
  if (XV4) {
    let i = (p.x_off + t * p.n_in + col) / 4u;
    return Q16(x4[i], x4[i + 1u], x4[i + 2u], x4[i + 3u]);
  }
  return load_x16(t, col);
}

// A run's x for token t of the pass: x[col .. + 16) (zeros for a chunk past the row), its sum of squares (FLAG_NORM),
// then scaled by the norm weights g, its sum (chunk_min: the types with an offset m), and scaled by the run's 2^-p
// lanes.
struct RunX { x: Q16, s: f32, ss: f32, }
// MV_FMA (batch decode's order, matmul.wgsl's MM_CHUNK): the sums of x^2 and of x of the run's halves (8 elements
// each: fma8, sum8) added, where a tiled kernel's loader holds a half.
fn mv_run_x(wt_in: u32, t: u32, col: u32, live: bool, g: Q16, xs: vec4<f32>) -> RunX {
  let wt = select(wt_in, WTYPE, !TWO_TYPES);  // matmul_common.wgsl's header: WTYPE itself with one type
  var x = mv_x16(mv_tok(t), col);
  if (!live) { x = Q16(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0)); }
  var ss = 0.0;
  if (has(FLAG_NORM)) {
    if (MV_FMA) {
      ss = fma8(W8(x.a, x.b), W8(x.a, x.b), 0.0) + fma8(W8(x.c, x.e), W8(x.c, x.e), 0.0);
    } else {
      ss = dot16(x, x);
    }
    x = mul16(x, g);
  }
  var s = 0.0;
  if (chunk_min(wt)) {
    if (MV_FMA) {
      s = sum8(W8(x.a, x.b)) + sum8(W8(x.c, x.e));
    } else {
      s = sum16(x);
    }
  }
  return RunX(lanes16(x, xs), s, ss);
}

// acc plus a row's run times a token's run of x. MV_FMA: the run's 16 products chained through fma in element order,
// then times d and plus m times sum(x), each an fma (run_fma, as matmul.wgsl's MM_CHUNK takes them).
fn run_acc(wt_in: u32, run: Run, xr: RunX, acc: f32) -> f32 {
  let wt = select(wt_in, WTYPE, !TWO_TYPES);  // matmul_common.wgsl's header: WTYPE itself with one type
  if (MV_FMA) {
    let dq = fma8(W8(run.q.c, run.q.e), W8(xr.x.c, xr.x.e), fma8(W8(run.q.a, run.q.b), W8(xr.x.a, xr.x.b), 0.0));
    return run_fma(wt, run.d, dq, run.m, xr.s, acc);
  }
  if (chunk_min(wt)) { return acc + (run.d * dot16(run.q, xr.x) + run.m * xr.s); }
  return acc + run.d * dot16(run.q, xr.x);
}

// MV_INT: the sum over 16 Q4_K quants (bytes 0..15 of q) times x's digits g0, g1, g2 of the same 16 elements
// (int_dot.wgsl), exact in i32 (16 * 15 * 127 * 2^16 < 2^31) and one f32 rounding: the block's s times this is their
// dot product.
fn idot16(q: vec4<u32>, g0: vec4<u32>, g1: vec4<u32>, g2: vec4<u32>) -> f32 {
  let s0 = dot4I8Packed(q.x, g0.x) + dot4I8Packed(q.y, g0.y) + dot4I8Packed(q.z, g0.z) + dot4I8Packed(q.w, g0.w);
  let s1 = dot4I8Packed(q.x, g1.x) + dot4I8Packed(q.y, g1.y) + dot4I8Packed(q.z, g1.z) + dot4I8Packed(q.w, g1.w);
  let s2 = dot4U8Packed(q.x, g2.x) + dot4U8Packed(q.y, g2.y) + dot4U8Packed(q.z, g2.z) + dot4U8Packed(q.w, g2.w);
  return f32((((s0 << 8u) + s1) << 8u) + bitcast<i32>(s2));
}

// MV_INT, Q6_K: the same sum over 16 six-bit quants (0..63, bytes of q). Those reach 16 * 63 * 127 * 2^16 > 2^31, so
// the leading digit's sum is taken in f32 (exact) and the other two's in i32, meeting in one fma: one rounding more
// than idot16's (matmul_int.wgsl's mq_combine does the same).
fn idot16_q6(q: vec4<u32>, g0: vec4<u32>, g1: vec4<u32>, g2: vec4<u32>) -> f32 {
  let s0 = dot4I8Packed(q.x, g0.x) + dot4I8Packed(q.y, g0.y) + dot4I8Packed(q.z, g0.z) + dot4I8Packed(q.w, g0.w);
  let s1 = dot4I8Packed(q.x, g1.x) + dot4I8Packed(q.y, g1.y) + dot4I8Packed(q.z, g1.z) + dot4I8Packed(q.w, g1.w);
  let s2 = dot4U8Packed(q.x, g2.x) + dot4U8Packed(q.y, g2.y) + dot4U8Packed(q.z, g2.z) + dot4U8Packed(q.w, g2.w);
  return fma(f32(s0), 65536.0, f32((s1 << 8u) + bitcast<i32>(s2)));
}

// MV_INT: x block b's digit vec4s (int_dot.wgsl's layout): [digit g * 2 + half h], for elements 16 h .. 16 h + 15.
fn xdig_block(b: u32) -> array<vec4<u32>, 6> {
  let i = b * 6u;
  return array<vec4<u32>, 6>(xdig[i], xdig[i + 1u], xdig[i + 2u], xdig[i + 3u], xdig[i + 4u], xdig[i + 5u]);
}

// The MV_NV values (dots [row][token], then x^2 [token]) of the group whose first row is row0, the expert's rows from
// piece row wbase, lane lt's part of them summed over the group's lanes (each lane holds the whole sums when the group
// fits a subgroup, else its subgroup's).
fn mv_values(wbase: u32, row0: u32, lt: u32, sg_size: u32) -> array<f32, MV_NV> {
  let last_row = p.n_rows - 1u;
  //#unroll! j MV_R
  let wrow$j = wbase + rope_row(min(row0 + $j, last_row));  // rows past the piece: loaded, never stored
  //#end
  // vals is indexed only inside //#unroll blocks: constant indices keep it in registers on GPUs.
  var vals: array<f32, MV_NV>;
  //#unroll k MV_NV
  vals[$k] = 0.0;
  //#end
  if (MV_INT && WTYPE == T_Q6_K) {
    // Q6_K against x's packed digits: lane lt takes units lt, lt + MV_T, ... of each row, a unit being chunks 2 j and
    // 2 j + 1 of a super-block (j = u % 4; matmul_common.wgsl's chunk_cols): 64 weights of half h = j / 2 whose low
    // nibbles are elements 32 k .. 32 k + 31 of the half (k = j % 2: x block xa, its halves from chunks 2 j and
    // 2 j + 1) and whose high nibbles are the 32 elements 64 further (x block xa + 2). Each quant enters as its unsigned 6-bit
    // value q + 32, the 32 taken back as 32 d sc sum(x) per 16 elements (x's exact half-block sums).
    // vals[MV_R] gathers the unit's blocks' sums of x^2 (FLAG_NORM).
    let n_units = p.nb / 2u;
    let spr = p.nb >> 3u;  // super-blocks per row
    for (var u = lt; u < n_units; u += MV_T) {
      let sbi = u >> 2u;
      let uj = u & 3u;
      let h = uj >> 1u;
      let k = uj & 1u;
      let xa = 8u * sbi + 4u * h + k;  // x block of the low nibbles; xa + 2 that of the high ones
      let a = xdig_block(xa);
      let b = xdig_block(xa + 2u);
      let sa = bitcast<vec4<f32>>(xdig[p.x_off + xa]);  // (s, sum0, sum1, sum x^2) of each block
      let sb = bitcast<vec4<f32>>(xdig[p.x_off + xa + 2u]);
      vals[MV_R] += sa.w + sb.w;
      let si = 8u * h + 2u * k;  // the 16-element scales: si, si + 1 (low nibbles), si + 4, si + 5 (high)
      //#unroll! j MV_R
      {
        let s$j = wrow$j * spr + sbi;
        let b$j = s$j * 13u;  // in vec4: low bits 8, high bits 4, scales 1 (d in the scale array)
        let l0 = wvec(WTYPE, b$j + 2u * uj);
        let l1 = wvec(WTYPE, b$j + 2u * uj + 1u);
        let h0 = wvec(WTYPE, b$j + 8u + 2u * h);
        let h1 = wvec(WTYPE, b$j + 9u + 2u * h);
        let sc = wvec(WTYPE, b$j + 12u);
        let d = q_scale(WTYPE, s$j);
        let lo0 = sa.x * idot16_q6(q6_bytes(l0, h0, 0u, 2u * k), a[0], a[2], a[4]) - 32.0 * sa.y;
        let lo1 = sa.x * idot16_q6(q6_bytes(l1, h1, 0u, 2u * k), a[1], a[3], a[5]) - 32.0 * sa.z;
        let hi0 = sb.x * idot16_q6(q6_bytes(l0, h0, 4u, 2u * k + 4u), b[0], b[2], b[4]) - 32.0 * sb.y;
        let hi1 = sb.x * idot16_q6(q6_bytes(l1, h1, 4u, 2u * k + 4u), b[1], b[3], b[5]) - 32.0 * sb.z;
        vals[$j] += d * (sbyte_of(sc, si) * lo0 + sbyte_of(sc, si + 1u) * lo1 + sbyte_of(sc, si + 4u) * hi0 +
                         sbyte_of(sc, si + 5u) * hi1);
      }
      //#end
    }
  } else if (MV_INT) {
    // Q4_K against x's packed digits (one token; int_dot.wgsl): lane lt takes units lt, lt + MV_T, ... of each row, a
    // unit being the 64 weights of one sub-block pair (chunks 2k and 2k + 1: their low nibbles are sub-block 2k's,
    // their high nibbles 2k + 1's). vals[MV_R] gathers the unit's blocks' sums of x^2 (FLAG_NORM).
    let n_units = p.nb / 2u;
    for (var u = lt; u < n_units; u += MV_T) {
      let xa = 2u * u;  // x block of sub-block 2k (the unit's first); xa + 1 that of 2k + 1
      let a = xdig_block(xa);
      let b = xdig_block(xa + 1u);
      let sa = bitcast<vec4<f32>>(xdig[p.x_off + xa]);  // (s, sum0, sum1, sum x^2) of each block
      let sb = bitcast<vec4<f32>>(xdig[p.x_off + xa + 1u]);
      vals[MV_R] += sa.w + sb.w;
      let c = 2u * u;  // the unit's first chunk
      //#unroll! j MV_R
      {
        let w0 = load_raw(WTYPE, wrow$j, c);
        let qb = load_raw(WTYPE, wrow$j, c + 1u).v;  // chunk c + 1's quants (the same super-block's header)
        let k = (c & 7u) >> 1u;
        let m0 = k45_scale_min(w0.h, 2u * k);
        let m1 = k45_scale_min(w0.h, 2u * k + 1u);
        let lo = idot16(w0.v & vec4<u32>(0x0F0F0F0Fu), a[0], a[2], a[4]) +
                 idot16(qb & vec4<u32>(0x0F0F0F0Fu), a[1], a[3], a[5]);
        let hi = idot16((w0.v >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu), b[0], b[2], b[4]) +
                 idot16((qb >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu), b[1], b[3], b[5]);
        vals[$j] += m0.x * (sa.x * lo) - m0.y * (sa.y + sa.z) + m1.x * (sb.x * hi) - m1.y * (sb.y + sb.z);
      }
      //#end
    }
  } else if (!MV_CHUNKS) {
    // The float types: 8-element units, thread lt reading units lt, lt + MV_T, ... (PERF.md: their products stream
    // faster this way than in chunks). Each step covers MV_U units per row (MV_R x MV_U weight loads in flight);
    // units past the row are clamped to its last one and their x zeroed.
    let n_units = p.nb * 4u;
    for (var u0 = lt; u0 < n_units; u0 += MV_T * MV_U) {
      //#unroll! k MV_U
      let u$k = min(u0 + $k * MV_T, n_units - 1u);
      //#unroll! j MV_R
      let w$j_$k = load8(wrow$j, u$k);
      //#end
      //#end
      //#unroll! k MV_U
      {
        var g = W8(vec4<f32>(1.0), vec4<f32>(1.0));
        if (has(FLAG_NORM)) { g = norm8(u$k); }
        let live = u0 + $k * MV_T < n_units;
        if (MV_FMA) {  // batch decode's order (matmul.wgsl's MM_CLASS): a live unit's products chained in order
          if (live) {
            //#unroll t NT
            {
              let xr = mv_x8(mv_tok($t), u$k);
              vals[MV_R * NT + $t] = fma8(xr, xr, vals[MV_R * NT + $t]);
              let xv = W8(xr.lo * g.lo, xr.hi * g.hi);
              //#unroll! j MV_R
              vals[$j * NT + $t] = fma8(w$j_$k, xv, vals[$j * NT + $t]);
              //#end
            }
            //#end
          }
        } else {
          //#unroll t NT
          {
            var xr = mv_x8(mv_tok($t), u$k);
            if (!live) { xr = W8(vec4<f32>(0.0), vec4<f32>(0.0)); }
            vals[MV_R * NT + $t] += dot(xr.lo, xr.lo) + dot(xr.hi, xr.hi);
            let xv = W8(xr.lo * g.lo, xr.hi * g.hi);
            //#unroll! j MV_R
            vals[$j * NT + $t] += dot(w$j_$k.lo, xv.lo) + dot(w$j_$k.hi, xv.hi);
            //#end
          }
          //#end
        }
      }
      //#end
    }
  } else {
    // The block types. With TWO_TYPES the rows from p.split2 on are w2's, of type WTYPE2: the loop is written out once
    // per type (N_WTYPES), its type a constant in each (one call site of each loader per type: the driver inlines and
    // folds them as in a pipeline of one type), and a group runs the copy of its rows' type (all on one side: the
    // host makes split2 a multiple of the workgroup's rows).
    let second = TWO_TYPES && row0 >= p.split2;
    //#unroll! s N_WTYPES
    if (second == ($s == 1)) {
      let wt = select(WTYPE, WTYPE2, $s == 1);
      //#unroll! j MV_R
      let r$j = select(wrow$j, wrow$j - p.split2, $s == 1);
      //#end
      let n_chunks = p.nb;
      let zeros = Q16(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
      let xs = chunk_xs(wt);
      // Each step loads MV_U chunks per row as words (MV_R x MV_U loads in flight) and decodes each row's runs right
      // before their products (where the driver's schedule keeps them: PERF.md, "Quantized decode, round 3"); chunks
      // past the row are clamped to its last one and their x zeroed. A token's run 0 and run 1 are added to its sums
      // in that order whatever NT.
      for (var c0 = lt; c0 < n_chunks; c0 += MV_T * MV_U) {
        //#unroll! k MV_U
        let c$k = min(c0 + $k * MV_T, n_chunks - 1u);
        //#unroll! j MV_R
        let w$j_$k = load_raw(wt, r$j, c$k);
        //#end
        //#end
        //#unroll! k MV_U
        {
          let cols = chunk_cols(wt, c$k);
          let live = c0 + $k * MV_T < n_chunks;
          //#unroll! r 2
          if (live || !MV_FMA) {  // MV_FMA: chunks past the row skipped (their zero products could change a zero's sign)
            var g = zeros;
            if (has(FLAG_NORM)) { g = norm16(cols[$r]); }
            if (NT == 1u) {  // each row's run decoded right before its product
              let xr = mv_run_x(wt, 0u, cols[$r], live, g, xs[$r]);
              vals[MV_R] += xr.ss;
              //#unroll! j MV_R
              {
                let run = decode_run(wt, w$j_$k, c$k, $r);
                vals[$j] = run_acc(wt, run, xr, vals[$j]);
              }
              //#end
            } else {  // each row's run decoded once for all the tokens
              //#unroll! j MV_R
              let run$j = decode_run(wt, w$j_$k, c$k, $r);
              //#end
              //#unroll t NT
              {
                let xr = mv_run_x(wt, $t, cols[$r], live, g, xs[$r]);
                vals[MV_R * NT + $t] += xr.ss;
                //#unroll! j MV_R
                vals[$j * NT + $t] = run_acc(wt, run$j, xr, vals[$j * NT + $t]);
                //#end
              }
              //#end
            }
          }
          //#end
        }
        //#end
      }
    }
    //#end
  }
  let chunk = min(MV_T, sg_size);
  //#unroll k MV_NV
  vals[$k] = mv_lane_sum(vals[$k], chunk);
  //#end
  return vals;
}

// MV_COMBINE (expert products, NT = 1; ExpertOptions::combine): the workgroups of row t take token t's pairs, MV_G =
// n_used x MV_CG groups each, group grp pair grp / MV_CG on MV_R rows of the workgroup's MV_CG x MV_R. Each pair's
// rows are computed as the expert product computes them (the bias added as store_y does) and meet in workgroup memory,
// where lane lt < MV_R of the pair-0 groups adds them, weighted by cw in pair order, to y[t]: moe_combine's
// arithmetic (its explicit fma: whether a compiler would contract the sum must not decide the bits), so the down
// products and the combine run as one dispatch with the same bits. The host sees to one piece
// (expert_first 0), MV_G = n_used x MV_CG and MV_R <= MV_T.
var<workgroup> mv_comb: array<f32, select(1u, MV_G * MV_R, MV_COMBINE)>;
fn mv_combine(flat: u32, lid: u32, t: u32, sg_size: u32) {
  let grp = lid / MV_T;
  let lt = lid % MV_T;
  let q = grp / MV_CG;  // the pair slot
  let g = grp % MV_CG;
  let row0 = (flat * MV_CG + g) * MV_R;
  let pair = t * p.n_used + q;
  let e = min(ids[pair], p.n_experts - 1u);
  bias_base = e * p.n_rows;
  mv_count = 1u;
  mv_x_rows[0] = select(t, pair, p.x_per_pair != 0u);
  let vals = mv_values(e * p.n_rows, row0, lt, sg_size);
  let chunk = min(MV_T, sg_size);
  var dot_sum = 0.0;
  if (chunk == MV_T) {
    //#unroll k MV_NV
    if ($k == lt) { dot_sum = vals[$k]; }
    //#end
  } else {
    //#unroll k MV_NV
    if (lt % chunk == 0u) { red[($k * MV_G + grp) * MV_SLOTS + lt / chunk] = vals[$k]; }
    //#end
    workgroupBarrier();
    if (lt < MV_R) {
      for (var c = 0u; c < MV_T / chunk; c += 1u) { dot_sum += red[(lt * MV_G + grp) * MV_SLOTS + c]; }
    }
  }
  if (lt < MV_R) {
    var out = dot_sum;
    if (has(FLAG_BIAS)) { out += bias[bias_base + min(row0 + lt, p.n_rows - 1u)]; }
    mv_comb[grp * MV_R + lt] = out;
  }
  workgroupBarrier();
  let row = row0 + lt;
  if (q == 0u && lt < MV_R && row < p.n_rows) {
    var acc = 0.0;
    for (var r = 0u; r < p.n_used; r += 1u) {
      acc = fma(cw[t * p.n_used + r], mv_comb[(r * MV_CG + g) * MV_R + lt], acc);
    }
    let i = p.y_off + t * p.y_stride + row;
    y[i] += acc;
  }
}

fn matvec_main(wid: vec3<u32>, lid: u32, sg_size: u32) {
  let flat = wid.x + wid.y * p.grid_x;
  let grp = lid / MV_T;
  let lt = lid % MV_T;
  let row0 = flat * MV_ROWS + grp * MV_R;
  if (MV_PRE) { mv_pre(flat, lid, sg_size); }
  if (MV_CHOOSE) {
    mv_choose(lid, sg_size);
    return;
  }
  if (MV_COMBINE) {
    mv_combine(flat, lid, wid.z, sg_size);
    return;
  }
  var wbase = 0u;  // expert products: the piece row of the expert's row 0
  if (MV_EXPERTS) {
    if (MV_ROUTE) {  // (NT = 1) the pair's expert chosen here, as moe_route would
      let e = mv_route(wid.z, lid, flat == 0u && wid.z % p.n_used == 0u);
      if (lid == 0u) { mv_tile = vec4<u32>(e, wid.z, 1u, 0u); }
    } else if (lid == 0u) {
      if (NT == 1u) {
        mv_tile = vec4<u32>(ids[wid.z], wid.z, 1u, 0u);  // a pair alone: its expert, itself
      } else {
        mv_tile = expert_tile(wid.z);
      }
    }
    let tile = workgroupUniformLoad(&mv_tile);
    mv_count = tile.z;
    wbase = expert_rows(tile);
    if (wbase == NO_EXPERT) { return; }
    //#unroll t NT
    {
      let pair = select(ids[tile.y + min($t, mv_count - 1u)], tile.y, NT == 1u);
      mv_x_rows[$t] = select(pair / p.n_used, pair, p.x_per_pair != 0u);
      mv_y_rows[$t] = pair;
    }
    //#end
  }
  mv_finish(row0, mv_values(wbase, row0, lt, sg_size), lid, sg_size);
}

// The group's values summed over its lanes and stored (mv_store). Sum each value over the group's lanes: a butterfly
// of shuffles within aligned chunks of lanes. When the group fits one subgroup (chunk == MV_T) every lane then holds
// the sums, and when the group has a lane per value lane lt finishes value lt (row row0 + lt / NT, token lt % NT) at
// once; otherwise one slot per chunk goes through workgroup memory and lane lt finishes values lt, lt + MV_T, ... (on
// the H200 the slots halved the rate of 256-thread groups; PERF.md). A value's slots are added in the same order
// either way. Call from uniform control flow (the slots' barrier).
fn mv_finish(row0: u32, vals: array<f32, MV_NV>, lid: u32, sg_size: u32) {
  let grp = lid / MV_T;
  let lt = lid % MV_T;
  let chunk = min(MV_T, sg_size);
  if (chunk == MV_T && MV_R * NT <= MV_T) {
    if (lt < MV_R * NT) {
      var dot_sum = 0.0;
      var up_sum = 0.0;  // the next row's dot: the up half of a SwiGLU pair, the partner of a RoPE pair
      var dot2 = 0.0;    // and the two after it (neox RoPE quads)
      var dot3 = 0.0;
      var ss = 0.0;
      //#unroll k MV_NV
      if ($k == lt) { dot_sum = vals[$k]; }
      if ($k == lt + NT) { up_sum = vals[$k]; }
      if ($k == lt + 2u * NT) { dot2 = vals[$k]; }
      if ($k == lt + 3u * NT) { dot3 = vals[$k]; }
      if ($k == MV_R * NT + lt % NT) { ss = vals[$k]; }
      //#end
      mv_store(row0, lt, dot_sum, up_sum, dot2, dot3, ss);
    }
    return;
  }
  //#unroll k MV_NV
  if (lt % chunk == 0u) { red[($k * MV_G + grp) * MV_SLOTS + lt / chunk] = vals[$k]; }
  //#end
  workgroupBarrier();
  for (var v = lt; v < MV_R * NT; v += MV_T) {
    let j = v / NT;
    var dot_sum = 0.0;
    var up_sum = 0.0;
    var dot2 = 0.0;
    var dot3 = 0.0;
    var ss = 0.0;
    for (var c = 0u; c < MV_T / chunk; c += 1u) {
      dot_sum += red[(v * MV_G + grp) * MV_SLOTS + c];
      if (j + 1u < MV_R) { up_sum += red[((v + NT) * MV_G + grp) * MV_SLOTS + c]; }
      if (j + 3u < MV_R) {
        dot2 += red[((v + 2u * NT) * MV_G + grp) * MV_SLOTS + c];
        dot3 += red[((v + 3u * NT) * MV_G + grp) * MV_SLOTS + c];
      }
      ss += red[((MV_R * NT + v % NT) * MV_G + grp) * MV_SLOTS + c];
    }
    mv_store(row0, v, dot_sum, up_sum, dot2, dot3, ss);
  }
}
