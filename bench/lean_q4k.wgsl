// An experiment beside the matvec (`wgllm-bench ops --lean-q4k`): Q4_K's one-token product written for nothing but
// that, to see how close a product with the fewest registers and instructions comes to the streaming read.
// The weight is the matvec's layout (matmul_common.wgsl: a super-block is 9 vec4, header then quants 8); x arrives
// prepared (lean_prep): each element multiplied by the 2^-p of its nibble's lane (matmul_common.wgsl's P_NIB_LO
// for sub-blocks 2k, P_NIB_HI for 2k + 1), then the sum of every run of 16 elements of the unscaled x.
// A warp (32 lanes, LQ_W a workgroup) owns LQ_R adjacent rows; lane l takes part l % 8 of super-blocks l / 8,
// l / 8 + 4, ... of each: the quant vec4 l % 8 (16 bytes: elements 16 (i % 2) .. of sub-blocks 2 (i / 2) and the
// next, as low and high nibbles) and the super-block's header. LQ_KS warps share their rows (warp w starting at
// super-block 4 (w % LQ_KS)), LQ_STAGE copies x (prepared) into workgroup memory first, LQ_PIPE loads the next
// step's words before this step's products. Sums: f32, within the warp by subgroup shuffles (through workgroup memory
// for subgroups under 32 lanes and across the LQ_KS warps). PERF.md: "A Q4_K product written for nothing else".

struct LeanParams {
  n_rows: u32, nsb: u32, grid_x: u32, n_in: u32,
}

@group(0) @binding(0) var<uniform> p: LeanParams;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> xp: array<vec4<f32>>;  // n_in / 4 scaled x, then n_in / 64 vec4 of sums
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const LQ_WG: u32 = 32u * LQ_W;
var<workgroup> xs: array<vec4<f32>, LQ_XV4>;

fn lq_x(i: u32) -> vec4<f32> {
  if (LQ_STAGE) { return xs[i]; }
  return xp[i];
}

fn lq_lo(a: u32) -> vec4<f32> {
  return bitcast<vec4<f32>>(vec4<u32>(a & 0xFu, a & 0xF00u, a & 0xF0000u, (a >> 12u) & 0xF000u) |
                            vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0);
}
fn lq_hi(a: u32) -> vec4<f32> {
  return bitcast<vec4<f32>>(vec4<u32>(a & 0xF0u, a & 0xF000u, (a >> 12u) & 0xF00u, (a >> 12u) & 0xF0000u) |
                            vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0);
}

// (d * scale, dmin * min) of sub-blocks j = 2k and 2k + 1 of a header.
fn lq_scales(h: vec4<u32>, k: u32) -> vec4<f32> {
  let dm = unpack2x16float(h.x);
  let j0 = 2u * k;
  var out: vec4<f32>;
  for (var r = 0u; r < 2u; r += 1u) {
    let j = j0 + r;
    let jj = j & 3u;
    let s0 = (h.y >> (8u * jj)) & 255u;
    let s1 = (h.z >> (8u * jj)) & 255u;
    let s2 = (h.w >> (8u * jj)) & 255u;
    var sc = s0 & 63u;
    var mn = s1 & 63u;
    if (j >= 4u) {
      sc = (s2 & 15u) | ((s0 >> 6u) << 4u);
      mn = (s2 >> 4u) | ((s1 >> 6u) << 4u);
    }
    out[2u * r] = dm.x * f32(sc);
    out[2u * r + 1u] = dm.y * f32(mn);
  }
  return out;
}

var<workgroup> lq_red: array<f32, LQ_WG * LQ_R>;  // subgroups under 32 lanes: each subgroup's sums
var<workgroup> lq_ks: array<f32, LQ_W * LQ_R>;     // LQ_KS > 1: each warp's sums

@compute @workgroup_size(LQ_WG)
fn lean_q4k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
            @builtin(subgroup_size) sg: u32) {
  let flat = wid.x + wid.y * p.grid_x;
  let lane = lid % 32u;
  let warp = lid / 32u;
  let i = lane % 8u;
  let k = i / 2u;
  let row0 = (flat * (LQ_W / LQ_KS) + warp / LQ_KS) * LQ_R;  // LQ_KS warps share rows, each a share of the row
  let first = lane / 8u + 4u * (warp % LQ_KS);
  let n4 = p.n_in / 4u;
  if (LQ_STAGE) {
    for (var e = lid; e < n4 + n4 / 16u; e += LQ_WG) { xs[e] = xp[e]; }
    workgroupBarrier();
  }
  //#unroll! j LQ_R
  var acc$j = 0.0;
  let wr$j = min(row0 + $j, p.n_rows - 1u) * p.nsb;
  //#end
  // LQ_PIPE: the next step's quants and headers loaded before this step's products
  //#unroll! j LQ_R
  var qn$j = w[(wr$j + min(first, p.nsb - 1u)) * 9u + 1u + i];
  var hn$j = w[(wr$j + min(first, p.nsb - 1u)) * 9u];
  //#end
  for (var sb = first; sb < p.nsb; sb += 4u * LQ_KS) {
    //#unroll! j LQ_R
    var q$j: vec4<u32>;
    var h$j: vec4<u32>;
    if (LQ_PIPE) {
      q$j = qn$j;
      h$j = hn$j;
      let nx = min(sb + 4u * LQ_KS, p.nsb - 1u);
      qn$j = w[(wr$j + nx) * 9u + 1u + i];
      hn$j = w[(wr$j + nx) * 9u];
    } else {
      q$j = w[(wr$j + sb) * 9u + 1u + i];
      h$j = w[(wr$j + sb) * 9u];
    }
    //#end
    let xb = sb * 64u + 16u * k + 4u * (i % 2u);
    let sums = lq_x(n4 + (xb >> 4u));  // runs xb / 4 .. + 3: ours are xb / 4 (sub-block 2k) and xb / 4 + 2
    let s0 = select(sums.x, sums.y, (xb & 4u) != 0u);
    let s1 = select(sums.z, sums.w, (xb & 4u) != 0u);
    let x0 = lq_x(xb);
    let x1 = lq_x(xb + 1u);
    let x2 = lq_x(xb + 2u);
    let x3 = lq_x(xb + 3u);
    let x4 = lq_x(xb + 8u);
    let x5 = lq_x(xb + 9u);
    let x6 = lq_x(xb + 10u);
    let x7 = lq_x(xb + 11u);
    //#unroll! j LQ_R
    {
      let sc = lq_scales(h$j, k);
      let lo = dot(lq_lo(q$j.x), x0) + dot(lq_lo(q$j.y), x1) + dot(lq_lo(q$j.z), x2) + dot(lq_lo(q$j.w), x3);
      let hi = dot(lq_hi(q$j.x), x4) + dot(lq_hi(q$j.y), x5) + dot(lq_hi(q$j.z), x6) + dot(lq_hi(q$j.w), x7);
      acc$j += sc.x * lo - sc.y * s0 + sc.z * hi - sc.w * s1;
    }
    //#end
  }
  //#unroll! j LQ_R
  for (var m = 1u; m < min(sg, 32u); m <<= 1u) { acc$j += subgroupShuffleXor(acc$j, m); }
  //#end
  if (sg < 32u) {
    //#unroll! j LQ_R
    lq_red[lid * LQ_R + $j] = acc$j;
    //#end
    workgroupBarrier();
    if (lane == 0u) {
      //#unroll! j LQ_R
      for (var l = sg; l < 32u; l += sg) { acc$j += lq_red[(lid + l) * LQ_R + $j]; }
      //#end
    }
  }
  if (LQ_KS > 1u) {
    if (lane == 0u) {
      //#unroll! j LQ_R
      lq_ks[warp * LQ_R + $j] = acc$j;
      //#end
    }
    workgroupBarrier();
    if (lane == 0u) {
      //#unroll! j LQ_R
      for (var o = 1u; o < LQ_KS; o += 1u) { acc$j += lq_ks[(warp + o) * LQ_R + $j]; }
      //#end
    }
  }
  //#unroll! j LQ_R
  if (lane == 0u && warp % LQ_KS == 0u && row0 + $j < p.n_rows) { y[row0 + $j] = acc$j; }
  //#end
}

// x prepared for lean_q4k: the scaled x, then from element n_in the sums of the runs of 16 (one thread a run).
@group(0) @binding(4) var<storage, read> xp_in: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> xp_out: array<f32>;
@compute @workgroup_size(64)
fn lean_prep(@builtin(global_invocation_id) gid: vec3<u32>) {
  let run = gid.x;
  if (run >= p.n_in / 16u) { return; }
  let sub = run / 2u;  // sub-block (32 elements) of the run
  let lanes = select(vec4<f32>(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0 / 4096.0),
                     vec4<f32>(1.0 / 16.0, 1.0 / 4096.0, 1.0 / 256.0, 1.0 / 65536.0), (sub & 1u) == 1u);
  var s = 0.0;
  for (var e = 0u; e < 4u; e += 1u) {
    let v = xp_in[run * 4u + e];
    s += v.x + v.y + v.z + v.w;
    let o = v * lanes;
    xp_out[run * 16u + 4u * e] = o.x;
    xp_out[run * 16u + 4u * e + 1u] = o.y;
    xp_out[run * 16u + 4u * e + 2u] = o.z;
    xp_out[run * 16u + 4u * e + 3u] = o.w;
  }
  xp_out[p.n_in + run] = s;
}
