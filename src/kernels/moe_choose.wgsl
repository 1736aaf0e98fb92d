// A token's experts from its router logits, in one workgroup of CH_WG invocations (kernels/moe.h): what moe_route
// (moe.wgsl) writes, and what the expert products choose for themselves when they take the routing
// (matvec_route.wgsl). The includer defines CH_WG and `fn ch_logit(e: u32) -> f32` (the token's logit of expert e)
// and `fn ch_bias(e: u32) -> f32` (CH_SIGMOID's selection bias of expert e).
//
// moe_choose(n_expert, n_used, flags, lid): p = softmax(z) in f32, the n_used largest logits in order (ties: the lower
// expert first) into ch_top_e[r], their p into ch_top_w[r], divided by the sum of the n_used with CH_NORM_TOP; with
// CH_SIGMOID p = sigmoid(z), the experts ranked by p + ch_bias (lfm2moe's selection bias), the weights their unbiased
// p (summed in rank order, at least 2^-14 as llama.cpp clamps it; the softmax's own sum then cancels and is not taken).
// Each expert's rank is counted against all the others at once, so the top k take no sequential rounds; the softmax's
// sum over all experts goes through a fixed tree over CH_WG lanes, so nothing depends on timing. Ranks left empty by
// NaN logits hold expert 0 and a NaN weight. Call from uniform control flow; ch_top_* are ready on return.

const CH_NORM_TOP: u32 = 1u;
const CH_SIGMOID: u32 = 2u;  // p = sigmoid(z), ranked by p + ch_bias
const CH_MAX: u32 = 512u;    // kMoeMaxExperts
const CH_USED: u32 = 32u;    // kMoeMaxUsed
var<workgroup> ch_z: array<f32, CH_MAX>;  // what experts are ranked by: the logit, or p + selection bias
var<workgroup> ch_p: array<f32, CH_MAX>;  // sigmoid gating: p
var<workgroup> ch_top_e: array<u32, CH_USED>;
var<workgroup> ch_top_z: array<f32, CH_USED>;
var<workgroup> ch_top_w: array<f32, CH_USED>;
var<workgroup> ch_sum: array<f32, CH_WG>;

// Expert e's rank among the token's n_expert logits: how many come before it (larger, or equal and lower).
fn ch_rank(e: u32, n_expert: u32) -> u32 {
  let z = ch_z[e];
  var r = 0u;
  for (var o = 0u; o < n_expert; o += 1u) {
    let zo = ch_z[o];
    r += select(0u, 1u, zo > z || (zo == z && o < e));
  }
  return r;
}

fn moe_choose(n_expert: u32, n_used: u32, flags: u32, lid: u32) {
  let sigmoid = (flags & CH_SIGMOID) != 0u;
  for (var e = lid; e < n_expert; e += CH_WG) {
    let z = ch_logit(e);
    if (sigmoid) {
      let q = 1.0 / (1.0 + exp(-z));
      ch_p[e] = q;
      ch_z[e] = q + ch_bias(e);
    } else {
      ch_z[e] = z;
    }
  }
  if (lid < n_used) {
    ch_top_e[lid] = 0u;
    ch_top_z[lid] = bitcast<f32>(0x7FC00000u);
    ch_top_w[lid] = bitcast<f32>(0x7FC00000u);
  }
  workgroupBarrier();
  for (var e = lid; e < n_expert; e += CH_WG) {
    let r = ch_rank(e, n_expert);
    if (r < n_used) {
      ch_top_e[r] = e;
      ch_top_z[r] = ch_z[e];
      if (sigmoid) { ch_top_w[r] = ch_p[e]; }
    }
  }
  workgroupBarrier();
  var total = 1.0;
  if (sigmoid) {
    if ((flags & CH_NORM_TOP) != 0u && lid < n_used) {
      total = 0.0;
      for (var r = 0u; r < n_used; r += 1u) { total += ch_top_w[r]; }
      total = max(total, 6.103515625e-5);
    }
  } else if ((flags & CH_NORM_TOP) != 0u) {
    // p_r = e^(z_r - mx) / sum over all experts; renormalised, the sum over the top n_used alone (in rank order).
    if (lid < n_used) {
      total = 0.0;
      for (var r = 0u; r < n_used; r += 1u) { total += exp(ch_top_z[r] - ch_top_z[0]); }
    }
  } else {
    var s = 0.0;
    for (var e = lid; e < n_expert; e += CH_WG) { s += exp(ch_z[e] - ch_top_z[0]); }
    ch_sum[lid] = s;
    for (var h = CH_WG / 2u; h > 0u; h >>= 1u) {  // a fixed tree: the same sum whatever the timing
      workgroupBarrier();
      if (lid < h) { ch_sum[lid] += ch_sum[lid + h]; }
    }
    workgroupBarrier();
    total = ch_sum[0];
  }
  workgroupBarrier();  // every lane has read ch_top_* before its own is rewritten
  if (lid < n_used) {
    if (sigmoid) {
      ch_top_w[lid] = ch_top_w[lid] / total;
    } else {
      ch_top_w[lid] = exp(ch_top_z[lid] - ch_top_z[0]) / total;
    }
  }
  workgroupBarrier();
}
