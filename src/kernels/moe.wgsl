// Mixture-of-experts routing and the weighted sum of the chosen experts (kernels/moe.h). The expert products
// themselves are the matvec kernel's (matvec.wgsl, MV_EXPERTS).
//
// moe_route: workgroup t (flat over x, y) takes token t's router logits z[t][0 .. n_expert): p = softmax(z) in f32,
// the n_used largest logits in order (ties: the lower expert first) into experts[t * n_used + r], their p into
// weights[..], divided by the sum of the n_used with FLAG_NORM_TOP; with FLAG_SIGMOID p = sigmoid(z), the experts
// ranked by p + sel_bias (lfm2moe's selection bias), the weights their unbiased p (summed in rank order; the softmax's own sum then
// cancels and is not taken). Each expert's rank is counted against all the others at once, so the top k take no
// sequential rounds; the softmax's sum goes through a fixed tree, so nothing depends on timing.
// moe_group (one workgroup): the step's pairs i = t * n_used + r ordered by their expert experts[i] into groups[0 ..
// pairs) (within an expert in no particular order), then from groups[pairs] tiles (expert, first, count, 0) of at most
// p.tile (moe_tile) pairs of one expert each, p.width tile slots in all, the unused with count 0: what the grouped expert
// products (matvec.wgsl, MV_EXPERTS) read.
// moe_combine: x[t][i] += sum over r of weights[t * n_used + r] * y[t * n_used + r][i], r in order.

struct MoeParams {
  n_tokens: u32, n_expert: u32, n_used: u32, flags: u32,
  width: u32, grid_x: u32, tile: u32, _pad1: u32,
}
const FLAG_NORM_TOP: u32 = 1u;
const FLAG_SIGMOID: u32 = 2u;  // route: p = sigmoid(z), ranked by p + sel_bias

@group(0) @binding(0) var<uniform> p: MoeParams;
@group(0) @binding(1) var<storage, read> logits: array<f32>;        // route: [n_tokens][n_expert]
@group(0) @binding(2) var<storage, read_write> experts: array<u32>;  // route: [n_tokens][n_used]
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;  // route: out; combine: in ([n_tokens][n_used])
@group(0) @binding(4) var<storage, read> ys: array<f32>;             // combine: [n_tokens * n_used][width]
@group(0) @binding(5) var<storage, read_write> x: array<f32>;        // combine: [n_tokens][width]
@group(0) @binding(6) var<storage, read_write> groups: array<u32>;   // group: out
@group(0) @binding(7) var<storage, read> sel_bias: array<f32>;       // route with FLAG_SIGMOID: [n_expert]

const RT_WG: u32 = 128u;
const RT_MAX: u32 = 512u;  // kMoeMaxExperts
const RT_USED: u32 = 32u;  // kMoeMaxUsed
var<workgroup> rt_z: array<f32, RT_MAX>;  // what experts are ranked by: the logit, or p + selection bias
var<workgroup> rt_p: array<f32, RT_MAX>;  // sigmoid gating: p
var<workgroup> rt_top_e: array<u32, RT_USED>;
var<workgroup> rt_top_z: array<f32, RT_USED>;
var<workgroup> rt_top_p: array<f32, RT_USED>;
var<workgroup> rt_sum: array<f32, RT_WG>;

// Expert e's rank among the token's n_expert logits: how many come before it (larger, or equal and lower).
fn rt_rank(e: u32) -> u32 {
  let z = rt_z[e];
  var r = 0u;
  for (var o = 0u; o < p.n_expert; o += 1u) {
    let zo = rt_z[o];
    r += select(0u, 1u, zo > z || (zo == z && o < e));
  }
  return r;
}

@compute @workgroup_size(RT_WG)
fn moe_route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x + wid.y * p.grid_x;
  if (t >= p.n_tokens) { return; }  // uniform: the whole workgroup
  let sigmoid = (p.flags & FLAG_SIGMOID) != 0u;
  for (var e = lid; e < p.n_expert; e += RT_WG) {
    let z = logits[t * p.n_expert + e];
    if (sigmoid) {
      let q = 1.0 / (1.0 + exp(-z));
      rt_p[e] = q;
      rt_z[e] = q + sel_bias[e];
    } else {
      rt_z[e] = z;
    }
  }
  if (lid < p.n_used) {  // expert 0 and a NaN weight where NaN logits leave a rank empty
    rt_top_e[lid] = 0u;
    rt_top_z[lid] = bitcast<f32>(0x7FC00000u);
    rt_top_p[lid] = bitcast<f32>(0x7FC00000u);
  }
  workgroupBarrier();
  // Every expert's rank at once (no k sequential rounds): the top n_used land in rank order.
  for (var e = lid; e < p.n_expert; e += RT_WG) {
    let r = rt_rank(e);
    if (r < p.n_used) {
      rt_top_e[r] = e;
      rt_top_z[r] = rt_z[e];
      if (sigmoid) { rt_top_p[r] = rt_p[e]; }
    }
  }
  workgroupBarrier();
  if (sigmoid) {  // weights p_r, renormalised: divided by their sum (at least 2^-14, as llama.cpp clamps it)
    var total = 1.0;
    if ((p.flags & FLAG_NORM_TOP) != 0u && lid < p.n_used) {
      total = 0.0;
      for (var r = 0u; r < p.n_used; r += 1u) { total += rt_top_p[r]; }
      total = max(total, 6.103515625e-5);
    }
    if (lid < p.n_used) {
      experts[t * p.n_used + lid] = rt_top_e[lid];
      weights[t * p.n_used + lid] = rt_top_p[lid] / total;
    }
    return;
  }
  let mx = rt_top_z[0];  // the largest logit
  // p_r = e^(z_r - mx) / sum over all experts; renormalised, the sum over the top n_used alone (in rank order).
  var total = 0.0;
  if ((p.flags & FLAG_NORM_TOP) != 0u) {
    if (lid < p.n_used) {
      for (var r = 0u; r < p.n_used; r += 1u) { total += exp(rt_top_z[r] - mx); }
    }
  } else {
    var s = 0.0;
    for (var e = lid; e < p.n_expert; e += RT_WG) { s += exp(rt_z[e] - mx); }
    rt_sum[lid] = s;
    for (var h = RT_WG / 2u; h > 0u; h >>= 1u) {  // a fixed tree: the same sum whatever the timing
      workgroupBarrier();
      if (lid < h) { rt_sum[lid] += rt_sum[lid + h]; }
    }
    workgroupBarrier();
    total = rt_sum[0];
  }
  if (lid < p.n_used) {
    experts[t * p.n_used + lid] = rt_top_e[lid];
    weights[t * p.n_used + lid] = exp(rt_top_z[lid] - mx) / total;
  }
}

const GR_WG: u32 = 256u;
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
      for (var s = 0u; s < c; s += p.tile) {
        let o = pairs + 4u * n;
        groups[o] = e;
        groups[o + 1u] = at + s;
        groups[o + 2u] = min(p.tile, c - s);
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
    acc = fma(weights[pair], ys[pair * p.width + i], acc);  // explicit: the same bits as matvec.wgsl's MV_COMBINE
  }
  x[g] += acc;
}
