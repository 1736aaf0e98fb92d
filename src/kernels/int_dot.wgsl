// One-token Q4_K products on packed 8-bit integer dot products (dot4I8Packed / dot4U8Packed), kernels/int_dot.h.
//
// x_digits writes each 32-element block of x (times the norm weights g when p.norm is 1: the RMSNorm's weights, its
// 1 / rms left to the product) as three 8-bit digits per element under one scale s per block:
// x ~= s * X with X = round(x / s), |X| <= 127 * 2^16, s = max |x| of the block / (127 * 2^16), and
// X = d0 * 2^16 + d1 * 2^8 + d2 with d0 in [-127, 127], d1 in [-128, 127] (signed bytes), d2 in [0, 255]. That keeps
// 23 bits against the block's largest element: |x - s X| <= s / 2 plus the rounding of x / s, about 2^-24 of it.
// Digit g of block b, elements 16 h .. 16 h + 15 (a byte each, in element order): xd[(b * 3 + g) * 2 + h]; the
// block's s, the sums of its elements 0..15 and 16..31 (for Q4_K's minimum) and the sum of squares of x itself (for
// the row's 1 / rms): xsc[b] = (s, sum0, sum1, sum x^2).
//
// matvec_int multiplies a Q4_K weight (matmul_common.wgsl's layout: per super-block of 256 a header vec4 d|dmin and
// the 12 scale bytes, then 8 vec4 of quants) by those digits. A group of IT lanes (32 by default) owns IR adjacent
// rows; lane lt takes units lt, lt + IT, ... of each row, a unit being the 64 weights of one Q4_K sub-block pair (two
// quant vec4: their low nibbles are sub-block 2k's, their high nibbles 2k + 1's). Per 16 weights and digit, four packed dot
// products; the three digits' sums are exact in i32 (16 * 15 * 127 * 2^16 < 2^31) and become one f32 each
// (one rounding per 16 weights), times the block's s, the sub-block's d * scale, less dmin * min * sum(x). With p.norm
// (digits of x * g) the row's sum is then times 1 / rms(x), from the blocks' sums of squares: y = (x / rms(x) * g) W^T,
// the matvec's FLAG_NORM.
// Host constants: IT, IR, IG (groups per workgroup), SUBGROUPS; the entry point `matvec_int` and sg_shuffle_xor come
// from the host prelude.

struct IntDotParams {
  n_in: u32, n_rows: u32, n_tokens: u32, grid_x: u32,
  norm: u32, eps: f32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<uniform> p: IntDotParams;
@group(0) @binding(1) var<storage, read> xin: array<f32>;
@group(0) @binding(2) var<storage, read_write> xd: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> xsc: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read> gnorm: array<f32>;

const X_MAX: f32 = 8323072.0;  // 127 * 2^16

// v, an element of a block whose inv = X_MAX / max |x|, as its digits (d0, d1, d2), each in the low byte.
fn digits(v: f32, inv: f32) -> vec3<u32> {
  let big = i32(clamp(round(v * inv), -X_MAX, X_MAX));
  let d0 = (big + 32768) >> 16u;  // arithmetic shifts: floor
  let r = big - (d0 << 16u);      // -32768 .. 32767
  let d1 = r >> 8u;
  let d2 = r - (d1 << 8u);        // 0 .. 255
  return vec3<u32>(bitcast<u32>(d0) & 255u, bitcast<u32>(d1) & 255u, bitcast<u32>(d2));
}

// An invocation per element, 8 blocks per workgroup of 256: each element's one load, the block's largest |x| and its
// halves' sums by trees in workgroup memory, its digits, then 6 invocations per block write its digit vec4s.
var<workgroup> wmax: array<f32, 256>;
var<workgroup> wsum: array<f32, 256>;
var<workgroup> wsq: array<f32, 256>;
var<workgroup> wdig: array<u32, 256>;

@compute @workgroup_size(256)
fn x_digits(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let n_blocks = p.n_in / 32u;
  let blk = (wid.x + wid.y * p.grid_x) * 8u + lid / 32u;  // over every token's blocks
  let e = lid % 32u;
  let live = blk < n_blocks * p.n_tokens;
  let b = min(blk, n_blocks * p.n_tokens - 1u);
  let raw = xin[(b / n_blocks) * p.n_in + (b % n_blocks) * 32u + e];
  var v = raw;
  if (p.norm != 0u) { v *= gnorm[(b % n_blocks) * 32u + e]; }
  wmax[lid] = abs(v);
  wsum[lid] = v;
  wsq[lid] = raw * raw;
  workgroupBarrier();
  for (var s = 16u; s > 0u; s >>= 1u) {
    if (e < s) {
      wmax[lid] = max(wmax[lid], wmax[lid + s]);
      wsq[lid] += wsq[lid + s];
    }
    if (e % 16u < s && s < 16u) { wsum[lid] += wsum[lid + s]; }
    workgroupBarrier();
  }
  let first = lid - e;  // the block's invocation 0
  let amax = wmax[first];
  let inv = select(0.0, X_MAX / amax, amax > 0.0);
  let d = digits(v, inv);
  wdig[lid] = d.x | (d.y << 8u) | (d.z << 16u);
  workgroupBarrier();
  if (!live) { return; }
  if (e == 0u) { xsc[b] = vec4<f32>(amax / X_MAX, wsum[first], wsum[first + 16u], wsq[first]); }
  if (e % 16u < 3u) {  // digit g of half h: its 16 bytes from the half's elements
    let g = e % 16u;
    let h = e / 16u;
    var q = vec4<u32>(0u);
    for (var m = 0u; m < 4u; m += 1u) {
      var word = 0u;
      for (var k = 0u; k < 4u; k += 1u) { word |= ((wdig[first + 16u * h + 4u * m + k] >> (8u * g)) & 255u) << (8u * k); }
      q[m] = word;
    }
    xd[(b * 3u + g) * 2u + h] = q;
  }
}

// Q4_K: (d * scale, dmin * min) of sub-block j (0..7) from its super-block's header (d|dmin, scale bytes 0..11).
fn q4k_scale_min(h: vec4<u32>, j: u32) -> vec2<f32> {
  let dm = unpack2x16float(h.x);
  let sh = 8u * (j & 3u);
  let a = (h.y >> sh) & 255u;  // scale byte j % 4
  let b = (h.z >> sh) & 255u;  // byte j % 4 + 4
  let c = (h.w >> sh) & 255u;  // byte j % 4 + 8
  var sc = a & 63u;
  var mn = b & 63u;
  if (j >= 4u) {
    sc = (c & 15u) | ((a >> 6u) << 4u);
    mn = (c >> 4u) | ((b >> 6u) << 4u);
  }
  return vec2<f32>(dm.x * f32(sc), dm.y * f32(mn));
}

// Sum over 16 weights (quants q as bytes 0..15) times x's digits g0, g1, g2 of the same 16 elements: s * this is
// their dot product.
fn dot16(q: vec4<u32>, g0: vec4<u32>, g1: vec4<u32>, g2: vec4<u32>) -> f32 {
  let s0 = dot4I8Packed(q.x, g0.x) + dot4I8Packed(q.y, g0.y) + dot4I8Packed(q.z, g0.z) + dot4I8Packed(q.w, g0.w);
  let s1 = dot4I8Packed(q.x, g1.x) + dot4I8Packed(q.y, g1.y) + dot4I8Packed(q.z, g1.z) + dot4I8Packed(q.w, g1.w);
  let s2 = dot4U8Packed(q.x, g2.x) + dot4U8Packed(q.y, g2.y) + dot4U8Packed(q.z, g2.z) + dot4U8Packed(q.w, g2.w);
  return f32((((s0 << 8u) + s1) << 8u) + bitcast<i32>(s2));
}

const NIBBLES: u32 = 0x0F0F0F0Fu;
var<workgroup> ired: array<f32, IG * IR * IT>;
var<workgroup> iss: array<f32, IG * IT>;

fn matvec_int_main(wid: vec3<u32>, lid: u32, sg: u32) {
  let grp = lid / IT;
  let lt = lid % IT;
  let row0 = (wid.x + wid.y * p.grid_x) * (IG * IR) + grp * IR;
  let nsb = p.n_in / 256u;
  var acc: array<f32, IR>;
  //#unroll j IR
  acc[$j] = 0.0;
  //#end
  var ss = 0.0;  // the lane's blocks' sums of x^2: the group's lanes cover each block once
  for (var u = lt; u < nsb * 4u; u += IT) {
    let sb = u / 4u;
    let k = u % 4u;
    let xa = sb * 8u + 2u * k;  // x block of sub-block 2k; xa + 1 that of 2k + 1
    let a00 = xd[xa * 6u];
    let a01 = xd[xa * 6u + 1u];
    let a10 = xd[xa * 6u + 2u];
    let a11 = xd[xa * 6u + 3u];
    let a20 = xd[xa * 6u + 4u];
    let a21 = xd[xa * 6u + 5u];
    let b00 = xd[xa * 6u + 6u];
    let b01 = xd[xa * 6u + 7u];
    let b10 = xd[xa * 6u + 8u];
    let b11 = xd[xa * 6u + 9u];
    let b20 = xd[xa * 6u + 10u];
    let b21 = xd[xa * 6u + 11u];
    let sa = xsc[xa];
    let sbk = xsc[xa + 1u];
    ss += sa.w + sbk.w;
    //#unroll j IR
    {
      let base = (min(row0 + $j, p.n_rows - 1u) * nsb + sb) * 9u;
      let hdr = w[base];
      let qa = w[base + 1u + 2u * k];
      let qb = w[base + 2u + 2u * k];
      let m0 = q4k_scale_min(hdr, 2u * k);
      let m1 = q4k_scale_min(hdr, 2u * k + 1u);
      let lo = dot16(qa & vec4<u32>(NIBBLES), a00, a10, a20) + dot16(qb & vec4<u32>(NIBBLES), a01, a11, a21);
      let hi = dot16((qa >> vec4<u32>(4u)) & vec4<u32>(NIBBLES), b00, b10, b20) +
               dot16((qb >> vec4<u32>(4u)) & vec4<u32>(NIBBLES), b01, b11, b21);
      acc[$j] += m0.x * (sa.x * lo) - m0.y * (sa.y + sa.z) + m1.x * (sbk.x * hi) - m1.y * (sbk.y + sbk.z);
    }
    //#end
  }
  // Each row's IT partial sums: shuffles within subgroups of the group, then one slot per subgroup through
  // workgroup memory; lane j of the group adds row j's slots.
  let chunk = select(1u, min(IT, sg), SUBGROUPS);
  //#unroll j IR
  {
    var v = acc[$j];
    if (SUBGROUPS) {
      for (var m = 1u; m < chunk; m <<= 1u) { v += sg_shuffle_xor(v, m); }
    }
    if (lt % chunk == 0u) { ired[(grp * IR + $j) * IT + lt / chunk] = v; }
  }
  //#end
  {
    var v = ss;
    if (SUBGROUPS) {
      for (var m = 1u; m < chunk; m <<= 1u) { v += sg_shuffle_xor(v, m); }
    }
    if (lt % chunk == 0u) { iss[grp * IT + lt / chunk] = v; }
  }
  workgroupBarrier();
  if (lt < IR && row0 + lt < p.n_rows) {
    var total = 0.0;
    var sq = 0.0;
    for (var c = 0u; c < IT / chunk; c += 1u) {
      total += ired[(grp * IR + lt) * IT + c];
      sq += iss[grp * IT + c];
    }
    if (p.norm != 0u) { total *= inverseSqrt(sq / f32(p.n_in) + p.eps); }
    y[row0 + lt] = total;
  }
}
