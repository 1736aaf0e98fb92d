// Mixture-of-experts routing and the weighted sum of the chosen experts (kernels/moe.h). The expert products
// themselves are the matvec kernel's (matvec.wgsl, MV_EXPERTS).
//
// moe_route: workgroup t (flat over x, y) takes token t's router logits z[t][0 .. n_expert): p = softmax(z) in f32,
// the n_used largest logits in order (ties: the lower expert first) into experts[t * n_used + r], their p into
// weights[..], divided by the sum of the n_used with FLAG_NORM_TOP (summed in rank order). Thread l holds experts
// l, l + RT_WG, ...; maxima and sums go through a fixed tree in workgroup memory, so the result does not depend on
// timing.
// moe_group (one workgroup): the step's pairs i = t * n_used + r ordered by their expert experts[i] into groups[0 ..
// pairs) (within an expert in no particular order), then from groups[pairs] tiles (expert, first, count, 0) of at most
// MOE_TILE pairs of one expert each, p.width tile slots in all, the unused with count 0: what the grouped expert
// products (matvec.wgsl, MV_EXPERTS) read.
// moe_combine: x[t][i] += sum over r of weights[t * n_used + r] * y[t * n_used + r][i], r in order.

struct MoeParams {
  n_tokens: u32, n_expert: u32, n_used: u32, flags: u32,
  width: u32, grid_x: u32, _pad0: u32, _pad1: u32,
}
const FLAG_NORM_TOP: u32 = 1u;

@group(0) @binding(0) var<uniform> p: MoeParams;
@group(0) @binding(1) var<storage, read> logits: array<f32>;        // route: [n_tokens][n_expert]
@group(0) @binding(2) var<storage, read_write> experts: array<u32>;  // route: [n_tokens][n_used]
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;  // route: out; combine: in ([n_tokens][n_used])
@group(0) @binding(4) var<storage, read> ys: array<f32>;             // combine: [n_tokens * n_used][width]
@group(0) @binding(5) var<storage, read_write> x: array<f32>;        // combine: [n_tokens][width]
@group(0) @binding(6) var<storage, read_write> groups: array<u32>;   // group: out

const RT_WG: u32 = 64u;
const RT_PER: u32 = 8u;  // experts per thread: at most RT_WG * RT_PER = 512 (kMoeMaxExperts)
var<workgroup> red_v: array<f32, RT_WG>;
var<workgroup> red_i: array<u32, RT_WG>;

// The maximum (with its lowest index) over the workgroup of each thread's (v, i).
fn arg_max(lid: u32, v: f32, i: u32) -> vec2<u32> {
  red_v[lid] = v;
  red_i[lid] = i;
  for (var s = RT_WG / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (lid < s) {
      let ov = red_v[lid + s];
      let oi = red_i[lid + s];
      if (ov > red_v[lid] || (ov == red_v[lid] && oi < red_i[lid])) {
        red_v[lid] = ov;
        red_i[lid] = oi;
      }
    }
  }
  workgroupBarrier();
  let r = vec2<u32>(bitcast<u32>(red_v[0]), red_i[0]);
  workgroupBarrier();
  return r;
}

fn sum_all(lid: u32, v: f32) -> f32 {
  red_v[lid] = v;
  for (var s = RT_WG / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (lid < s) { red_v[lid] += red_v[lid + s]; }
  }
  workgroupBarrier();
  let r = red_v[0];
  workgroupBarrier();
  return r;
}

const NEG_INF: f32 = -3.4028234663852886e38;

@compute @workgroup_size(RT_WG)
fn moe_route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x + wid.y * p.grid_x;
  if (t >= p.n_tokens) { return; }  // uniform: the whole workgroup
  var z: array<f32, RT_PER>;
  var mx = NEG_INF;
  var best = NEG_INF;
  var best_i = 0xFFFFFFFFu;
  for (var j = 0u; j < RT_PER; j += 1u) {
    let e = lid + j * RT_WG;
    z[j] = NEG_INF;
    if (e < p.n_expert) { z[j] = logits[t * p.n_expert + e]; }
    mx = max(mx, z[j]);
  }
  mx = bitcast<f32>(arg_max(lid, mx, 0u).x);
  var s = 0.0;
  for (var j = 0u; j < RT_PER; j += 1u) {
    if (lid + j * RT_WG < p.n_expert) { s += exp(z[j] - mx); }
  }
  let total = sum_all(lid, s);
  var picked = 0u;  // bit j: expert lid + j * RT_WG is chosen
  var sum_top = 0.0;
  for (var r = 0u; r < p.n_used; r += 1u) {
    var v = NEG_INF;
    var vi = 0xFFFFFFFFu;
    for (var j = 0u; j < RT_PER; j += 1u) {
      let e = lid + j * RT_WG;
      if (e < p.n_expert && (picked & (1u << j)) == 0u && (z[j] > v || vi == 0xFFFFFFFFu)) {
        v = z[j];
        vi = e;
      }
    }
    let top = arg_max(lid, v, vi);
    let e = select(top.y, 0u, top.y >= p.n_expert);  // none left only with NaN logits: expert 0, weight NaN
    if (e % RT_WG == lid) { picked |= 1u << (e / RT_WG); }
    let w = exp(bitcast<f32>(top.x) - mx) / total;
    sum_top += w;
    if (lid == 0u) {
      experts[t * p.n_used + r] = e;
      weights[t * p.n_used + r] = w;
    }
  }
  if ((p.flags & FLAG_NORM_TOP) != 0u && lid == 0u) {
    for (var r = 0u; r < p.n_used; r += 1u) { weights[t * p.n_used + r] = weights[t * p.n_used + r] / sum_top; }
  }
}

const GR_WG: u32 = 256u;
const MOE_TILE: u32 = 16u;  // kMoeTile: the grouped products' pairs per pass
var<workgroup> gr_count: array<atomic<u32>, 512>;
var<workgroup> gr_base: array<u32, 512>;
var<workgroup> gr_tiles: u32;

@compute @workgroup_size(GR_WG)
fn moe_group(@builtin(local_invocation_index) lid: u32) {
  let pairs = p.n_tokens * p.n_used;
  for (var e = lid; e < p.n_expert; e += GR_WG) { atomicStore(&gr_count[e], 0u); }
  workgroupBarrier();
  for (var i = lid; i < pairs; i += GR_WG) { atomicAdd(&gr_count[min(experts[i], p.n_expert - 1u)], 1u); }
  workgroupBarrier();
  if (lid == 0u) {
    var at = 0u;
    var n = 0u;
    for (var e = 0u; e < p.n_expert; e += 1u) {
      let c = atomicLoad(&gr_count[e]);
      gr_base[e] = at;
      for (var s = 0u; s < c; s += MOE_TILE) {
        let o = pairs + 4u * n;
        groups[o] = e;
        groups[o + 1u] = at + s;
        groups[o + 2u] = min(MOE_TILE, c - s);
        groups[o + 3u] = 0u;
        n += 1u;
      }
      at += c;
      atomicStore(&gr_count[e], 0u);  // now each expert's cursor
    }
    gr_tiles = n;
  }
  workgroupBarrier();
  for (var i = lid; i < pairs; i += GR_WG) {
    let e = min(experts[i], p.n_expert - 1u);
    groups[gr_base[e] + atomicAdd(&gr_count[e], 1u)] = i;
  }
  for (var t = gr_tiles + lid; t < p.width; t += GR_WG) { groups[pairs + 4u * t + 2u] = 0u; }
}

const CB_WG: u32 = 256u;

@compute @workgroup_size(CB_WG)
fn moe_combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let g = (wid.x + wid.y * p.grid_x) * CB_WG + lid;
  if (g >= p.n_tokens * p.width) { return; }
  let t = g / p.width;
  let i = g % p.width;
  var acc = 0.0;
  for (var r = 0u; r < p.n_used; r += 1u) {
    let pair = t * p.n_used + r;
    acc += weights[pair] * ys[pair * p.width + i];
  }
  x[g] += acc;
}
