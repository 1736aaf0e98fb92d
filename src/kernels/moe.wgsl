// Mixture-of-experts routing and the weighted sum of the chosen experts (kernels/moe.h); compiled after
// moe_choose.wgsl (the choice itself). The expert products are the matvec kernel's (matvec.wgsl, MV_EXPERTS).
//
// moe_route: workgroup t (flat over x, y) takes token t's router logits z[t][0 .. n_expert) and writes moe_choose's
// experts and weights (CH_NORM_TOP, CH_SIGMOID there) to experts[t * n_used + r] and weights[..].
// moe_group (one workgroup): the step's pairs i = t * n_used + r ordered by their expert experts[i] into groups[0 ..
// pairs) (within an expert in no particular order), then from groups[pairs] tiles (expert, first, count, 0) of at most
// p.tile (moe_tile) pairs of one expert each, p.width tile slots in all, the unused with count 0: what the grouped expert
// products (matvec.wgsl, MV_EXPERTS) read.
// moe_combine: x[t][i] += sum over r of weights[t * n_used + r] * y[t * n_used + r][i], r in order.

struct MoeParams {
  n_tokens: u32, n_expert: u32, n_used: u32, flags: u32,
  width: u32, grid_x: u32, tile: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: MoeParams;
@group(0) @binding(1) var<storage, read> logits: array<f32>;        // route: [n_tokens][n_expert]
@group(0) @binding(2) var<storage, read_write> experts: array<u32>;  // route: [n_tokens][n_used]
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;  // route: out; combine: in ([n_tokens][n_used])
@group(0) @binding(4) var<storage, read> ys: array<f32>;             // combine: [n_tokens * n_used][width]
@group(0) @binding(5) var<storage, read_write> x: array<f32>;        // combine: [n_tokens][width]
@group(0) @binding(6) var<storage, read_write> groups: array<u32>;   // group: out
@group(0) @binding(7) var<storage, read> sel_bias: array<f32>;       // route with CH_SIGMOID: [n_expert]

const CH_WG: u32 = 128u;
var<private> rt_token: u32;
fn ch_logit(e: u32) -> f32 { return logits[rt_token * p.n_expert + e]; }
fn ch_bias(e: u32) -> f32 { return sel_bias[e]; }

@compute @workgroup_size(CH_WG)
fn moe_route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x + wid.y * p.grid_x;
  if (t >= p.n_tokens) { return; }  // uniform: the whole workgroup
  rt_token = t;
  moe_choose(p.n_expert, p.n_used, p.flags, lid);
  if (lid < p.n_used) {
    experts[t * p.n_used + lid] = ch_top_e[lid];
    weights[t * p.n_used + lid] = ch_top_w[lid];
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
