// The expert products choosing their own experts (MV_ROUTE; ExpertOptions::route) and a router's product choosing the
// token's experts itself (MV_CHOOSE; MatmulOptions::choose), compiled after matvec.wgsl and moe_choose.wgsl. MV_ROUTE:
// decode's gate/up products, a pair per workgroup row, each workgroup taking its token's router
// logits and choosing as moe_route does (the same function, the same bits), so that no dispatch of its own runs
// between the router's product and the experts'. The first workgroup of each token's first pair also writes the
// token's experts and weights, which the down products read.
@group(0) @binding(19) var<storage, read> route_logits: array<f32>;          // [n_tokens][p.route_experts]
@group(0) @binding(20) var<storage, read_write> route_chosen: array<u32>;    // [n_tokens][n_used]
@group(0) @binding(21) var<storage, read_write> route_weights: array<f32>;   // [n_tokens][n_used]
@group(0) @binding(22) var<storage, read> route_bias: array<f32>;            // CH_SIGMOID: [p.route_experts]

const CH_WG: u32 = MV_WG;
var<private> mr_token: u32;
fn ch_logit(e: u32) -> f32 {
  if (MV_CHOOSE) { return y[p.y_off + e]; }  // this workgroup's own logits (mv_choose)
  return route_logits[mr_token * p.route_experts + e];
}
fn ch_bias(e: u32) -> f32 { return route_bias[e]; }

// Pair `pair`'s expert (pair = token * n_used + slot); with `writes`, its token's experts and weights stored.
fn mv_route(pair: u32, lid: u32, writes: bool) -> u32 {
  let t = pair / p.n_used;
  mr_token = t;
  moe_choose(p.route_experts, p.n_used, p.route_flags, lid);
  if (writes && lid < p.n_used) {
    route_chosen[t * p.n_used + lid] = ch_top_e[lid];
    route_weights[t * p.n_used + lid] = ch_top_w[lid];
  }
  return ch_top_e[pair % p.n_used];
}

// MV_CHOOSE: the workgroup computes the router's rows MV_ROWS at a time as the product's own workgroups would (the same
// lanes, sums and epilogue: the logits' bits are the product's), storing them to y, then reads them back (a storage
// barrier: this workgroup's own writes) and chooses as moe_route does, writing the token's experts and weights.
fn mv_choose(lid: u32, sg_size: u32) {
  let grp = lid / MV_T;
  let lt = lid % MV_T;
  for (var b = 0u; b < p.n_rows; b += MV_ROWS) {  // (uniform: the rows)
    let row0 = b + grp * MV_R;
    mv_finish(row0, mv_values(0u, row0, lt, sg_size), lid, sg_size);
    workgroupBarrier();  // the slots are free for the next rows
  }
  storageBarrier();
  mr_token = 0u;
  moe_choose(p.n_rows, p.n_used, p.route_flags, lid);
  if (lid < p.n_used) {
    route_chosen[lid] = ch_top_e[lid];
    route_weights[lid] = ch_top_w[lid];
  }
}
