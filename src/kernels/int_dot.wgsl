// x as packed 8-bit digits for the one-token Q4_K products on packed integer dot products (matvec.wgsl's MV_INT),
// kernels/int_dot.h.
//
// x_digits writes each 32-element block of x (times the norm weights g when p.norm is 1: the RMSNorm's weights, its
// 1 / rms left to the product) as three 8-bit digits per element under one scale s per block:
// x ~= s * X with X = round(x / s), |X| <= 127 * 2^16, s = max |x| of the block / (127 * 2^16), and
// X = d0 * 2^16 + d1 * 2^8 + d2 with d0 in [-127, 127], d1 in [-128, 127] (signed bytes), d2 in [0, 255]. That keeps
// 23 bits against the block's largest element: |x - s X| <= s / 2 plus the rounding of x / s, about 2^-24 of it.
// Digit g of block b (over every token's blocks), elements 16 h .. 16 h + 15 (a byte each, in element order):
// xd[(b * 3 + g) * 2 + h]; from vec4 p.scales on, the block's s, the sums of its elements 0..15 and 16..31 (for
// Q4_K's minimum) and the sum of squares of x itself (for the row's 1 / rms), as f32 bits:
// xd[p.scales + b] = (s, sum0, sum1, sum x^2).

struct IntDotParams {
  n_in: u32, n_tokens: u32, grid_x: u32, norm: u32,
  scales: u32, x_first: u32, pad1: u32, pad2: u32,  // x_first: x's first element in its binding
}

@group(0) @binding(0) var<uniform> p: IntDotParams;
@group(0) @binding(1) var<storage, read> xin: array<f32>;
@group(0) @binding(2) var<storage, read_write> xd: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> gnorm: array<f32>;

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

// 8 invocations per block, 4 consecutive elements each, 32 blocks per workgroup of 256: each invocation's partial
// largest |x|, half sum and sum of squares through workgroup memory (one barrier; every invocation of a block then
// reads its block's 8 partials in the same order), then its elements' digits, one u32 of each digit vec4 an invocation.
var<workgroup> wpart: array<vec4<f32>, 256>;  // (max |v|, sum v, sum raw^2, -)

@compute @workgroup_size(256)
fn x_digits(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let n_blocks = p.n_in / 32u;
  let blk = (wid.x + wid.y * p.grid_x) * 32u + lid / 8u;  // over every token's blocks
  let t = lid % 8u;                                       // elements 4 t .. 4 t + 3 of the block
  let live = blk < n_blocks * p.n_tokens;
  let b = min(blk, n_blocks * p.n_tokens - 1u);
  let at = p.x_first + (b / n_blocks) * p.n_in + (b % n_blocks) * 32u + 4u * t;
  let raw = vec4<f32>(xin[at], xin[at + 1u], xin[at + 2u], xin[at + 3u]);
  var v = raw;
  if (p.norm != 0u) {
    let g = (b % n_blocks) * 32u + 4u * t;
    v *= vec4<f32>(gnorm[g], gnorm[g + 1u], gnorm[g + 2u], gnorm[g + 3u]);
  }
  let a = abs(v);
  wpart[lid] = vec4<f32>(max(max(a.x, a.y), max(a.z, a.w)), (v.x + v.y) + (v.z + v.w), dot(raw, raw), 0.0);
  workgroupBarrier();
  let first = lid - t;  // the block's invocation 0
  var amax = 0.0;
  var half = vec2<f32>(0.0);
  var sq = 0.0;
  for (var k = 0u; k < 8u; k += 1u) {
    let q = wpart[first + k];
    amax = max(amax, q.x);
    half[k / 4u] += q.y;
    sq += q.z;
  }
  if (!live) { return; }
  let inv = select(0.0, X_MAX / amax, amax > 0.0);
  var words = vec3<u32>(0u);
  for (var k = 0u; k < 4u; k += 1u) { words |= digits(v[k], inv) << vec3<u32>(8u * k); }
  if (t == 0u) { xd[p.scales + b] = bitcast<vec4<u32>>(vec4<f32>(amax / X_MAX, half.x, half.y, sq)); }
  let h = t / 4u;  // digit g of half h is xd[(b * 3 + g) * 2 + h]; this invocation's elements are its word t % 4
  for (var g = 0u; g < 3u; g += 1u) { xd[(b * 3u + g) * 2u + h][t % 4u] = words[g]; }
}
