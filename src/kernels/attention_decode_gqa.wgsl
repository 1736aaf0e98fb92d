// Grouped decode attention: one workgroup per (split, head block, query) serves GQ query heads that share one kv
// head (GQ divides n_heads / n_kv_heads, at most 8; a host constant). Compiled after attention_common.wgsl and
// attention.wgsl, whose bindings 0..8, parameters, kv_row, first_key, DEC_WG, KS and MAX_SUBGROUPS it uses; the same contract (causal or
// sliding window, paged KV, q_base / start_pos) and the same partials layout per query head, so
// attention_decode_reduce combines its splits. Not for per_query calls (encode_attention_decode_rows).
//
// Traffic: each K row and V row of the split is read once for the GQ heads, where attention_decode reads it once per
// query head (the repeats served by the cache at best): 2 * keys * head_dim KV elements per workgroup, GQ times
// fewer loads over the dispatch. The price: GQ times the ALU and registers per thread and GQ-fold softmax
// bookkeeping per tile, on n_heads / GQ times fewer workgroups, which loses while the window is short (PERF.md).
//
// Per 128-key tile: thread t scores key t against the GQ scaled queries (held in workgroup memory); per head the
// tile max (subgroups, then across them), the probabilities and their sum, with one barrier per phase for all GQ
// heads; then KS = DEC_WG / HD4 key slices x HD4 columns accumulate GQ outputs from each V load.

var<workgroup> gq: array<vec4<f32>, GQ * HD4>;
var<workgroup> gprob: array<f32, GQ * DEC_WG>;
var<workgroup> gmax: array<f32, GQ * MAX_SUBGROUPS>;
var<workgroup> gsum: array<f32, GQ * MAX_SUBGROUPS>;
var<workgroup> gacc: array<vec4<f32>, DEC_WG>;

@compute @workgroup_size(DEC_WG)
fn attention_decode_gqa(@builtin(workgroup_id) wid: vec3<u32>,
                        @builtin(local_invocation_index) tid: u32,
                        @builtin(subgroup_size) sg_size: u32,
                        @builtin(subgroup_invocation_id) sg_lane: u32) {
  let split = wid.x;
  let head0 = wid.y * GQ;
  let q_local = wid.z;
  if (head0 >= p.n_heads || q_local >= p.n_queries || split >= p.n_splits) { return; }  // uniform per workgroup
  let kvh = head0 / (p.n_heads / p.n_kv_heads);
  let pos = p.start_pos + p.q_base + q_local;
  let window = min(pos + 1u, p.max_seq);
  let lo = first_key(pos);
  let k_begin = min(lo / DEC_WG * DEC_WG + split * p.split_len, window);
  let k_end = min(k_begin + p.split_len, window);
  let n_sg = (DEC_WG + sg_size - 1u) / sg_size;
  let sg_id = tid / sg_size;
  let vs = p.kv_dim / 4u;
  let v_shift = p.page_size * vs;
  let col = tid % HD4;
  let slice = tid / HD4;

  // the GQ query rows of the block, scaled (heads head0 .. head0 + GQ - 1 are adjacent in the q row)
  let q_row = (p.q_offset + q_local * p.q_stride) / 4u + head0 * HD4;
  for (var i = tid; i < GQ * HD4; i += DEC_WG) { gq[i] = q[q_row + i] * p.scale; }
  workgroupBarrier();

  var m: array<f32, GQ>;
  var l: array<f32, GQ>;
  var o: array<vec4<f32>, GQ>;
  //#unroll h GQ
  m[$h] = NEG_BIG;
  l[$h] = 0.0;
  o[$h] = vec4<f32>(0.0);
  //#end
  for (var kb = k_begin; kb < k_end; kb += DEC_WG) {
    let t = kb + tid;
    let n = min(DEC_WG, k_end - kb);
    let loc = kv_row(kb, 0u, 4u);  // a tile never straddles a page
    let row = loc.y + tid * vs + kvh * HD4;
    let live = t < k_end && t >= lo;
    var score: array<f32, GQ>;
    //#unroll h GQ
    score[$h] = NEG_BIG;
    //#end
    if (live) {
      var acc: array<f32, GQ>;
      //#unroll h GQ
      acc[$h] = 0.0;
      //#end
      //#unroll! P 4
      if (loc.x == $P) {
        for (var c = 0u; c < HD4; c += 1u) {
          let k = kv_to_f32(pool$P[row + c]);
          //#unroll h GQ
          acc[$h] += dot(gq[$h * HD4 + c], k);
          //#end
        }
      }
      //#end
      //#unroll h GQ
      score[$h] = acc[$h];
      //#end
    }
    // per head: the subgroups' maxima
    //#unroll h GQ
    {
      let sg_max = subgroupMax(score[$h]);
      if (sg_lane == 0u) { gmax[$h * MAX_SUBGROUPS + sg_id] = sg_max; }
    }
    //#end
    workgroupBarrier();  // gmax written
    // per head: the tile max, the correction of the running state, this thread's probability and the subgroups' sums
    var corr: array<f32, GQ>;
    //#unroll h GQ
    {
      var tile_max = NEG_BIG;
      for (var g = 0u; g < n_sg; g += 1u) { tile_max = max(tile_max, gmax[$h * MAX_SUBGROUPS + g]); }
      let m_new = max(m[$h], tile_max);
      corr[$h] = exp(m[$h] - m_new);
      m[$h] = m_new;
      var prob = 0.0;
      if (live) { prob = exp(score[$h] - m_new); }
      gprob[$h * DEC_WG + tid] = prob;
      let sg_sum = subgroupAdd(prob);
      if (sg_lane == 0u) { gsum[$h * MAX_SUBGROUPS + sg_id] = sg_sum; }
    }
    //#end
    workgroupBarrier();  // gprob and gsum written
    //#unroll h GQ
    {
      var tile_sum = 0.0;
      for (var g = 0u; g < n_sg; g += 1u) { tile_sum += gsum[$h * MAX_SUBGROUPS + g]; }
      l[$h] = l[$h] * corr[$h] + tile_sum;
      o[$h] *= corr[$h];
    }
    //#end
    if (slice < KS) {
      let v_col = loc.y + v_shift + kvh * HD4 + col;
      //#unroll! P 4
      if (loc.x == $P) {
        for (var j = slice; j < n; j += KS) {
          let v = kv_to_f32(pool$P[v_col + j * vs]);
          //#unroll h GQ
          o[$h] += gprob[$h * DEC_WG + j] * v;
          //#end
        }
      }
      //#end
    }
    workgroupBarrier();  // gmax / gprob / gsum reused by the next tile
  }

  // per head: the key slices' partial outputs summed through workgroup memory, then the output or the split's partial
  //#unroll h GQ
  {
    gacc[tid] = o[$h];
    workgroupBarrier();
    if (tid < HD4) {
      var total = vec4<f32>(0.0);
      for (var k = 0u; k < KS; k += 1u) { total += gacc[k * HD4 + tid]; }
      let head = head0 + $h;
      if (p.n_splits == 1u) {
        let lt = l[$h] + sink_term(head, m[$h]);
        let inv = select(0.0, 1.0 / lt, lt > 0.0);
        out[(p.out_offset + q_local * p.out_stride) / 4u + head * HD4 + tid] = total * inv;
      } else {
        let base = ((q_local * p.n_heads + head) * p.n_splits + split) * (HD4 + 1u);
        if (tid == 0u) { partials[base] = vec4<f32>(m[$h], l[$h], 0.0, 0.0); }
        partials[base + 1u + tid] = total;
      }
    }
    workgroupBarrier();  // gacc reused by the next head
  }
  //#end
}
