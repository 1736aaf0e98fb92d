// Prompt products of Q4_K, Q6_K and Q8_0 weights on packed integer dot products (ContextOptions::prompt_digits;
// encode_matmul's tiled products, kernels/matmul.h): x as MQ_D 8-bit digits per element under one scale per 32
// elements (the leading digits that int_dot.wgsl's x_digits writes), each weight's quant multiplied against them four
// at a time with dot4I8Packed (the signed digits) and dot4U8Packed (the third, unsigned). Q6_K's quants enter as their
// unsigned 6-bit values q + 32 (bytes below 128, so both products read them right), the 32 taken back as 32 d sc
// sum(x) per 16 elements (x's exact half-block sums). Q8_0's signed quants are bytes already (one or two digits).
// Compiled after matmul_common.wgsl: its weight layout, bindings and epilogues (store_y, store_swiglu; FLAG_NORM's
// 1 / rms from the blocks' sums of x^2).
//
// Digits kept, per 32-element block of largest |x| = a: 3: x within about 2^-23 a (what the one-token products read);
// 2: x - 2^-15 a < x' <= x (the third digit dropped, its mean added back: mq_sum16); 1: x rounded to the nearest of
// 127 steps of a / 127 (llama.cpp's q8_1 activations). The digit sums of a block are exact in i32 and meet in one f32
// rounding; then, per block and row, y += (s d sc) sum - (dmin m) sum(x) in f32 (Q6_K: per 16 elements, y += d sc
// (s sum - 32 sum(x))), with sum(x) the block's (half's) exact f32 sum of x (times the norm's weights g).
//
// A workgroup of 256 threads computes MQ_TM tokens x MQ_TN rows of y, 64 x 64 or 32 x 128 (expert tiles of 32 pairs:
// half the x and twice the rows a step, so an expert's remainder of a few pairs costs half a 64 x 64 tile's walk):
// thread (ty, tx) tokens 4 ty .. 4 ty + 3 and rows 2 tx, 2 tx + 1, 2 tx + MQ_TN / 2, 2 tx + MQ_TN / 2 + 1 (SwiGLU's
// gate/up pairs stay in one thread), tx < MQ_TX = MQ_TN / 4. The row is walked half a super-block
// (128 elements: four blocks, two pairs of sub-blocks) a step: each step its quants, the four blocks' d sc and dmin m
// per row, x's digit vec4s and its blocks' scales and sums go through workgroup memory, and the next step's are loaded
// into registers while this one is multiplied.
//
// Expert products (MQ_EXPERTS; encode_expert_matmul with tiles of MQ_TM pairs): workgroup row tile_m takes tile tile_m
// of encode_moe_group's tiles (expert, first, count, 0), as matmul.wgsl's MM_EXPERTS does: its MQ_TM token slots are the
// pairs ids[first ..][.. count] (the last repeated past the count), each reading x's digits of its pair's x row (pair /
// n_used, or the pair with x_per_pair) and writing its pair's y row, and its weight rows are the expert's. A slot's
// arithmetic is the slot's alone, so a pair's outputs are the bits of the same expert's product over the same x row
// without experts.
@group(0) @binding(16) var<storage, read> xdig: array<vec4<u32>>;
var<private> mq_wbase: u32 = 0u;  // the piece row of the weight's row 0 (expert products: the expert's)
var<private> mq_xrow: u32;        // the x row (of the digits) of this thread's token slot, lid / MQ_TPT

// From the host: MQ_TM, MQ_TN the tile's tokens and rows (MQ_TM MQ_TN = 4096); MQ_TX = MQ_TN / 4, the threads across
// the rows; MQ_TPT = 256 / MQ_TM, the loader threads of a token slot; MQ_WR = MQ_TN / 64, the rows' quant loads a
// thread takes; MQ_D, the digits kept; MQ_XV = 8 MQ_D, x's digit vec4s of one token per step; MQ_XL = MQ_XV / MQ_TPT,
// those a loader thread takes (MQ_TM tokens x MQ_XV / 256); MQ_QV, a row's quant vec4s per step (Q4_K 4: nibbles of two
// blocks each; Q6_K, Q8_0 8: a block's 32 quants as bytes in two); MQ_SV, vec4s of scales per row (Q4_K 1: d sc of
// four blocks, beside dmin m in mq_wm; Q6_K 2: d sc of eight halves; Q8_0 1: d of four blocks) and of x's sums per
// token (one a block, one a half).
const Q6: bool = WTYPE == T_Q6_K;
const Q8: bool = WTYPE == T_Q8_0;  // signed bytes: one or two digits (the third's unsigned product would misread them)
const MQ_UNIT: f32 = f32(1u << (8u * (3u - MQ_D)));  // a kept digit sum's unit in steps of s
const NIB: vec4<u32> = vec4<u32>(0x0F0F0F0Fu);

var<workgroup> mq_qw: array<vec4<u32>, MQ_QV * MQ_TN>;  // [quant vec4 of the step][mq_slot(row)]
var<workgroup> mq_wd: array<vec4<f32>, MQ_SV * MQ_TN>;  // [scale vec4][mq_slot(row)] d sc of the step's blocks (halves)
var<workgroup> mq_wm: array<vec4<f32>, MQ_WM>;          // [mq_slot(row)] dmin m of them (Q4_K)
var<workgroup> mq_xq: array<vec4<u32>, MQ_TM * MQ_XV>;  // [token][block: 4][digit: MQ_D][half: 2]
var<workgroup> mq_xs: array<vec4<f32>, MQ_TM>;          // [token] s of the step's four blocks (in kept-digit units)
var<workgroup> mq_xm: array<vec4<f32>, MQ_SV * MQ_TM>;  // [token][sum vec4] their (halves') sums of x

// Where row r of the tile sits in the weight-side arrays: thread tx's rows 2 tx, 2 tx + 1, 2 tx + MQ_TN / 2, + 1 at tx,
// tx + MQ_TX, tx + 2 MQ_TX, tx + 3 MQ_TX, so the MQ_TX threads of a token group read consecutive vec4 (no bank
// conflicts).
fn mq_slot(r: u32) -> u32 {
  let half = MQ_TN / 2u;
  return ((r % half) >> 1u) + MQ_TX * ((r & 1u) + 2u * (r / half));
}

// The sum over 16 weights of nibbles q times x's digits of plane g (vec4 of 16 bytes), in i32.
fn mq_dot16(q: vec4<u32>, d: vec4<u32>, g: u32) -> i32 {
  if (g == 2u) {  // the third digit is unsigned; the nibbles are too
    let u = dot4U8Packed(q.x, d.x) + dot4U8Packed(q.y, d.y) + dot4U8Packed(q.z, d.z) + dot4U8Packed(q.w, d.w);
    return bitcast<i32>(u);
  }
  return dot4I8Packed(q.x, d.x) + dot4I8Packed(q.y, d.y) + dot4I8Packed(q.z, d.z) + dot4I8Packed(q.w, d.w);
}

// The sum of 16 nibbles (bytes of q).
fn mq_sum16(q: vec4<u32>) -> u32 {
  let one = 0x01010101u;
  return dot4U8Packed(q.x, one) + dot4U8Packed(q.y, one) + dot4U8Packed(q.z, one) + dot4U8Packed(q.w, one);
}
// The same of 16 quants as bytes: Q8_0's signed, the others' unsigned.
fn mq_qsum16(q: vec4<u32>) -> f32 {
  if (Q8) {
    let one = 0x01010101u;
    return f32(dot4I8Packed(q.x, one) + dot4I8Packed(q.y, one) + dot4I8Packed(q.z, one) + dot4I8Packed(q.w, one));
  }
  return f32(mq_sum16(q));
}
// Two digits drop the third, d2 in 0..255 (x' = x - d2 steps): the dropped part's mean, 127.5 / 256 of a kept unit,
// goes back as that times the weight's sum of quants, so the sums carry no bias (the K-quants' quants are all >= 0: a
// bias would add up over a row where the rounding errors cancel).
const MQ_HALF: f32 = 0.498046875;

// A block's kept digit sums (s0 first) as one f32 in kept-digit units: Q4_K's exact in i32 up to two digits (32 * 15 *
// 128 * 2^8 < 2^24, so the conversion is exact too); three take the first in f32 (exact) and one rounding. Q6_K's
// sums of 16 reach 16 * 63 * 128 * 2^8 > 2^24: one rounding more.
fn mq_combine(s: array<i32, 3>) -> f32 {
  if (MQ_D == 1u) { return f32(s[0]); }
  if (MQ_D == 2u) { return f32((s[0] << 8u) + s[1]); }
  return fma(f32(s[0]), 65536.0, f32((s[1] << 8u) + s[2]));
}

// The step's registers: this thread's loads for one half super-block, stored into workgroup memory by mq_put.
// [w]: row lid / 4 + 64 w of the tile.
struct MqLoads {
  q: array<vec4<u32>, MQ_WR>,    // Q4_K: quant vec4 lid % 4 of the row; Q6_K: block lid % 4's low bits, 0..15;
                                 // Q8_0: block lid % 4's quants 0..15
  q1: array<vec4<u32>, MQ_WR>,   // Q6_K, Q8_0: 16..31
  h: array<vec4<u32>, MQ_WR>,    // Q6_K: the half's high bits of elements 0..15, then 16..31
  h1: array<vec4<u32>, MQ_WR>,
  hdr: vec4<u32>,                // the header of row lid (lid < MQ_TN); Q6_K: its scales; Q8_0: its four d (f32 bits)
  d: f32,                        // Q6_K: the super-block's d
  x: array<vec4<u32>, MQ_XL>,    // digit vec4s lid * MQ_XL ..
  sc: vec4<f32>,                 // token slot lid / MQ_TPT's block lid % 4 (lid % MQ_TPT < 4): (s, sum0, sum1, sum x^2)
}

fn mq_load(tile_n: u32, lid: u32, step: u32) -> MqLoads {
  var l: MqLoads;
  let sbi = step / 2u;           // the super-block
  let half = step % 2u;
  let spr = p.nb / 8u;           // super-blocks per row
  let rh = mq_wbase + min(tile_n * MQ_TN + lid, p.n_rows - 1u);  // the header's row (lid < MQ_TN)
  //#unroll! w MQ_WR
  {
    let r = mq_wbase + min(tile_n * MQ_TN + lid / 4u + 64u * $w, p.n_rows - 1u);  // rows past the piece: never stored
    if (Q8) {  // 2 vec4 a block, the f16 scales in the scale array
      let b = r * p.nb + step * 4u + lid % 4u;
      l.q[$w] = wvec(WTYPE, 2u * b);
      l.q1[$w] = wvec(WTYPE, 2u * b + 1u);
    } else if (Q6) {  // 13 vec4 a super-block: low bits 8, high bits 4, scales 1 (d in the scale array)
      let b = (r * spr + sbi) * 13u;
      let k = lid % 4u;  // the block within the half: low bits at vec4 2 (k % 2), nibble k / 2; high bits 2 k
      l.q[$w] = wvec(WTYPE, b + half * 4u + 2u * (k & 1u));
      l.q1[$w] = wvec(WTYPE, b + half * 4u + 2u * (k & 1u) + 1u);
      l.h[$w] = wvec(WTYPE, b + 8u + half * 2u);
      l.h1[$w] = wvec(WTYPE, b + 9u + half * 2u);
    } else {
      l.q[$w] = wvec(WTYPE, (r * spr + sbi) * 9u + 1u + half * 4u + lid % 4u);
    }
  }
  //#end
  if (Q8) {
    if (lid < MQ_TN) {  // the threads that store them
      let bh = rh * p.nb + step * 4u;
      l.hdr = bitcast<vec4<u32>>(vec4<f32>(q_scale(WTYPE, bh), q_scale(WTYPE, bh + 1u), q_scale(WTYPE, bh + 2u),
                                           q_scale(WTYPE, bh + 3u)));
    }
  } else if (Q6) {
    if (lid < MQ_TN) {
      l.hdr = wvec(WTYPE, (rh * spr + sbi) * 13u + 12u);
      l.d = q_scale(WTYPE, rh * spr + sbi);
    }
  } else {
    if (lid < MQ_TN) { l.hdr = wvec(WTYPE, (rh * spr + sbi) * 9u); }
  }
  let blk0 = step * 4u;          // the step's first block of a row of x
  // digit vec4s lid * MQ_XL .. + MQ_XL - 1 of the step's MQ_TM x MQ_XV: token slot lid / MQ_TPT's part lid % MQ_TPT
  //#unroll! e MQ_XL
  {
    let within = (lid % MQ_TPT) * MQ_XL + $e;
    let jb = within / (2u * MQ_D);
    let g = (within / 2u) % MQ_D;
    let b = mq_xrow * p.nb + blk0 + jb;
    l.x[$e] = xdig[(b * 3u + g) * 2u + within % 2u];
  }
  //#end
  if (lid % MQ_TPT < 4u) { l.sc = bitcast<vec4<f32>>(xdig[p.x_off + mq_xrow * p.nb + blk0 + lid % 4u]); }
  return l;
}

fn mq_put(l: MqLoads, lid: u32, step: u32) {
  let k = lid % 4u;
  //#unroll! w MQ_WR
  {
    let s = mq_slot(lid / 4u + 64u * $w);
    if (Q8) {
      mq_qw[(2u * k) * MQ_TN + s] = l.q[$w];
      mq_qw[(2u * k + 1u) * MQ_TN + s] = l.q1[$w];
    } else if (Q6) {
      mq_qw[(2u * k) * MQ_TN + s] = q6_bytes(l.q[$w], l.h[$w], 4u * (k >> 1u), 2u * k);
      mq_qw[(2u * k + 1u) * MQ_TN + s] = q6_bytes(l.q1[$w], l.h1[$w], 4u * (k >> 1u), 2u * k);
    } else {
      mq_qw[k * MQ_TN + s] = l.q[$w];
    }
  }
  //#end
  if (Q8) {
    if (lid < MQ_TN) { mq_wd[mq_slot(lid)] = bitcast<vec4<f32>>(l.hdr); }
  } else if (Q6) {
    if (lid < MQ_TN) {  // d times the half's eight int8 scales (words 2 half, 2 half + 1)
      let w = select(l.hdr.xy, l.hdr.zw, step % 2u == 1u);
      mq_wd[mq_slot(lid)] = l.d * i8x4(w.x);
      mq_wd[MQ_TN + mq_slot(lid)] = l.d * i8x4(w.y);
    }
  }
  if (!Q6 && !Q8 && lid < MQ_TN) {
    let half = step % 2u;
    var d: vec4<f32>;
    var m: vec4<f32>;
    //#unroll! j 4
    {
      let dm = k45_scale_min(l.hdr, half * 4u + $j);
      d[$j] = dm.x;
      m[$j] = dm.y;
    }
    //#end
    mq_wd[mq_slot(lid)] = d;
    mq_wm[mq_slot(lid)] = m;
  }
  //#unroll! e MQ_XL
  mq_xq[lid * MQ_XL + $e] = l.x[$e];
  //#end
  if (lid % MQ_TPT < 4u) {  // token slot ts's block k
    let ts = lid / MQ_TPT;
    mq_xs[ts][k] = l.sc.x * MQ_UNIT;
    if (Q6) {  // block k's two half sums at vec4 k / 2, components 2 (k % 2) ..
      mq_xm[ts * 2u + k / 2u][2u * (k % 2u)] = l.sc.y;
      mq_xm[ts * 2u + k / 2u][2u * (k % 2u) + 1u] = l.sc.z;
    } else {
      mq_xm[ts][k] = l.sc.y + l.sc.z;
    }
  }
}

// The 16 outputs' products of the step: pairs 0 and 1 (blocks 2 j, 2 j + 1: the low and high nibbles of quant vec4s
// 2 j and 2 j + 1, elements 0..15 and 16..31).
fn mq_step(acc: ptr<function, array<vec4<f32>, 4>>, ty: u32, tx: u32) {
  //#unroll j 2
  {
    var lo: array<vec4<u32>, 8>;  // [row i][half h]: nibbles of block 2 j
    var hi: array<vec4<u32>, 8>;  // of block 2 j + 1
    var dl: vec4<f32>;
    var dh: vec4<f32>;
    var ql = vec4<f32>(0.0);  // MQ_D == 2: 127.5 / 256 of each row's sum of nibbles in block 2 j, 2 j + 1
    var qh = vec4<f32>(0.0);
    var ml: vec4<f32>;
    var mh: vec4<f32>;
    //#unroll i 4
    {
      let r = tx + MQ_TX * $i;  // mq_slot of row 2 tx + (i & 1) + MQ_TN / 2 (i >> 1)
      let a = mq_qw[(2u * $j) * MQ_TN + r];
      let b = mq_qw[(2u * $j + 1u) * MQ_TN + r];
      lo[2u * $i] = a & NIB;
      lo[2u * $i + 1u] = b & NIB;
      hi[2u * $i] = (a >> vec4<u32>(4u)) & NIB;
      hi[2u * $i + 1u] = (b >> vec4<u32>(4u)) & NIB;
      dl[$i] = mq_wd[r][2u * $j];
      dh[$i] = mq_wd[r][2u * $j + 1u];
      ml[$i] = mq_wm[r][2u * $j];
      mh[$i] = mq_wm[r][2u * $j + 1u];
      if (MQ_D == 2u) {
        ql[$i] = MQ_HALF * f32(mq_sum16(lo[2u * $i]) + mq_sum16(lo[2u * $i + 1u]));
        qh[$i] = MQ_HALF * f32(mq_sum16(hi[2u * $i]) + mq_sum16(hi[2u * $i + 1u]));
      }
    }
    //#end
    //#unroll k 4
    {
      let t = 4u * ty + $k;
      var xl: array<vec4<u32>, 2u * MQ_D>;  // [digit][half] of block 2 j
      var xh: array<vec4<u32>, 2u * MQ_D>;  // of block 2 j + 1
      //#unroll g MQ_D
      xl[2u * $g] = mq_xq[t * MQ_XV + ((2u * $j) * MQ_D + $g) * 2u];
      xl[2u * $g + 1u] = mq_xq[t * MQ_XV + ((2u * $j) * MQ_D + $g) * 2u + 1u];
      xh[2u * $g] = mq_xq[t * MQ_XV + ((2u * $j + 1u) * MQ_D + $g) * 2u];
      xh[2u * $g + 1u] = mq_xq[t * MQ_XV + ((2u * $j + 1u) * MQ_D + $g) * 2u + 1u];
      //#end
      let sl = mq_xs[t][2u * $j];
      let sh = mq_xs[t][2u * $j + 1u];
      let nl = mq_xm[t][2u * $j];
      let nh = mq_xm[t][2u * $j + 1u];
      //#unroll i 4
      {
        var s0 = array<i32, 3>(0, 0, 0);
        var s1 = array<i32, 3>(0, 0, 0);
        //#unroll g MQ_D
        s0[$g] = mq_dot16(lo[2u * $i], xl[2u * $g], u32($g)) + mq_dot16(lo[2u * $i + 1u], xl[2u * $g + 1u], u32($g));
        s1[$g] = mq_dot16(hi[2u * $i], xh[2u * $g], u32($g)) + mq_dot16(hi[2u * $i + 1u], xh[2u * $g + 1u], u32($g));
        //#end
        var a = (*acc)[$k][$i];
        a = fma(sl * dl[$i], mq_combine(s0) + ql[$i], a);
        a = fma(-ml[$i], nl, a);
        a = fma(sh * dh[$i], mq_combine(s1) + qh[$i], a);
        a = fma(-mh[$i], nh, a);
        (*acc)[$k][$i] = a;
      }
      //#end
    }
    //#end
  }
  //#end
}

// Q6_K's and Q8_0's: blocks k = 0..3 of quants as bytes, each row's two halves of 16 under their own scale (Q8_0: the
// block's twice), x's digits of the block's halves.
fn mq_bytes_step(acc: ptr<function, array<vec4<f32>, 4>>, ty: u32, tx: u32) {
  //#unroll k 4
  {
    var q: array<vec4<u32>, 8>;  // [row i][half h]
    var d: array<vec2<f32>, 4>;  // [row i] d sc of each half
    var qs = array<vec2<f32>, 4>(vec2<f32>(0.0), vec2<f32>(0.0), vec2<f32>(0.0), vec2<f32>(0.0));  // MQ_D == 2
    //#unroll i 4
    {
      let r = tx + MQ_TX * $i;  // mq_slot of row 2 tx + (i & 1) + MQ_TN / 2 (i >> 1)
      q[2u * $i] = mq_qw[(2u * $k) * MQ_TN + r];
      q[2u * $i + 1u] = mq_qw[(2u * $k + 1u) * MQ_TN + r];
      if (Q8) {
        d[$i] = vec2<f32>(mq_wd[r][$k]);
      } else {
        let sv = mq_wd[($k / 2u) * MQ_TN + r];
        d[$i] = select(sv.xy, sv.zw, ($k & 1u) == 1u);
      }
      if (MQ_D == 2u) {
        qs[$i] = MQ_HALF * vec2<f32>(mq_qsum16(q[2u * $i]), mq_qsum16(q[2u * $i + 1u]));
      }
    }
    //#end
    //#unroll t4 4
    {
      let t = 4u * ty + $t4;
      var xd: array<vec4<u32>, 2u * MQ_D>;  // [digit][half]
      //#unroll g MQ_D
      xd[2u * $g] = mq_xq[t * MQ_XV + ($k * MQ_D + $g) * 2u];
      xd[2u * $g + 1u] = mq_xq[t * MQ_XV + ($k * MQ_D + $g) * 2u + 1u];
      //#end
      let s = mq_xs[t][$k];
      var n32 = vec2<f32>(0.0);  // Q6_K: 32 times the halves' sums of x
      if (Q6) {
        let sv = mq_xm[t * 2u + $k / 2u];
        n32 = 32.0 * select(sv.xy, sv.zw, ($k & 1u) == 1u);
      }
      //#unroll i 4
      {
        var s0 = array<i32, 3>(0, 0, 0);
        var s1 = array<i32, 3>(0, 0, 0);
        //#unroll g MQ_D
        s0[$g] = mq_dot16(q[2u * $i], xd[2u * $g], u32($g));
        s1[$g] = mq_dot16(q[2u * $i + 1u], xd[2u * $g + 1u], u32($g));
        //#end
        var a = (*acc)[$t4][$i];
        a = fma(d[$i].x, fma(s, mq_combine(s0) + qs[$i].x, -n32.x), a);
        a = fma(d[$i].y, fma(s, mq_combine(s1) + qs[$i].y, -n32.y), a);
        (*acc)[$t4][$i] = a;
      }
      //#end
    }
    //#end
  }
  //#end
}

// Expert products: the x row of a pair.
fn mq_pair_x(pair: u32) -> u32 { return select(pair / p.n_used, pair, p.x_per_pair != 0u); }

fn matmul_int_main(wid: vec3<u32>, lid: u32) {
  let flat = wid.x + wid.y * p.grid_x;
  let tile_n = flat % p.row_tiles;
  let tile_m = flat / p.row_tiles;
  var tile = vec4<u32>(0u, 0u, MQ_TM, 0u);  // expert products: the tile's expert, first pair and count
  if (MQ_EXPERTS) {
    if (tile_m >= p.n_tokens) { return; }  // grid padding (n_tokens: the tile slots): uniform per workgroup
    tile = expert_tile(tile_m);  // read-only and at a uniform index: uniform
    let wbase = expert_rows(tile);
    if (wbase == NO_EXPERT) { return; }
    mq_wbase = wbase;
    mq_xrow = mq_pair_x(ids[tile.y + min(lid / MQ_TPT, tile.z - 1u)]);
  } else {
    if (tile_m * MQ_TM >= p.n_tokens) { return; }  // grid padding: uniform per workgroup
    mq_xrow = min(tile_m * MQ_TM + lid / MQ_TPT, p.n_tokens - 1u);  // tokens past the window: loaded, never stored
    tile.z = min(MQ_TM, p.n_tokens - tile_m * MQ_TM);
  }
  let ty = lid / MQ_TX;
  let tx = lid % MQ_TX;
  // Threads whose four token slots all lie past the tile's count (a pair count's or a prompt's remainder) load and
  // wait at the barriers but multiply nothing: time saved where a workgroup is a loop over its invocations (lavapipe:
  // f32 expert tiles 1.3x); no change on the H100, where a workgroup's time is its walk over the row (PERF.md).
  let busy = 4u * ty < tile.z;
  var acc: array<vec4<f32>, 4>;  // [token k][row i]
  //#unroll! k 4
  acc[$k] = vec4<f32>(0.0);
  //#end
  var ss = 0.0;  // this loader's part of its token's sum of x^2 (lid % MQ_TPT < 4; the others' stay 0)
  let steps = p.nb / 4u;
  var l = mq_load(tile_n, lid, 0u);
  for (var step = 0u; step < steps; step += 1u) {
    workgroupBarrier();  // the previous step's tiles are consumed
    mq_put(l, lid, step);
    ss += l.sc.w;
    workgroupBarrier();
    if (step + 1u < steps) { l = mq_load(tile_n, lid, step + 1u); }
    if (busy) {  // (a branch around the products, not a continue: the barriers stay in uniform control flow)
      if (Q6 || Q8) {
        mq_bytes_step(&acc, ty, tx);
      } else {
        mq_step(&acc, ty, tx);
      }
    }
  }
  // the sums of x^2 [token][loader] (FLAG_NORM) in mq_xq's first MQ_TM vec4, once every thread is done with it (1 KB
  // of workgroup memory fewer: three digits of Q4_K then fit 32 KB)
  workgroupBarrier();
  if (lid % MQ_TPT < 4u) { mq_xq[lid / MQ_TPT][lid % 4u] = bitcast<u32>(ss); }
  workgroupBarrier();
  //#unroll! k 4
  {
    let tl = 4u * ty + $k;
    var t = tile_m * MQ_TM + tl;
    var live = t < p.n_tokens;
    if (MQ_EXPERTS) {
      live = tl < tile.z;
      t = ids[tile.y + min(tl, tile.z - 1u)];  // the pair: its y row
    }
    var f = 1.0;
    if (has(FLAG_NORM)) {
      let q = bitcast<vec4<f32>>(mq_xq[tl]);
      f = inv_rms(q.x + q.y + q.z + q.w);
    }
    if (live) {
      let v = acc[$k] * f;
      let r = tile_n * MQ_TN + 2u * tx;
      store_rows2(t, r, v.x, v.y);
      store_rows2(t, r + MQ_TN / 2u, v.z, v.w);
    }
  }
  //#end
}

@compute @workgroup_size(256)
fn matmul_int(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  matmul_int_main(wid, lid);
}
