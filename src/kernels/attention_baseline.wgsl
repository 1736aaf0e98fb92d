// Baseline attention prefill (compiled after attention_common.wgsl): the seed's design, kept as the reference
// point for benchmarks and as a second GPU implementation in the tests. One workgroup per (query, head); 256
// threads each score one key of a 256-key tile (a full head_dim dot product read straight
// from the cache), tree reductions in workgroup memory, online softmax across tiles. Thread tid owns output
// dims tid, tid + 256 (heads up to 512).
//
// Traffic: every (query, head) re-reads its whole K/V window: 2 * window * head_dim elements,
// i.e. n_queries * n_heads times the cache. That re-reading is what the tiled kernel removes.
//
// The host prepends a prelude defining the KV element access (KvWord, kv_word_index,
// kv_word_value) for f16 (shader-f16), packed f16 in u32 (fallback) or f32 storage.
// All barriers sit in the entry point, in uniform control flow.

alias KvUnit = KvWord;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

const TILE: u32 = 256u;
const MAX_HEAD_DIM: u32 = 512u;

var<workgroup> q_sh: array<f32, MAX_HEAD_DIM>;
var<workgroup> acc: array<f32, MAX_HEAD_DIM>;
var<workgroup> probs: array<f32, TILE>;
var<workgroup> red: array<f32, TILE>;
var<workgroup> state: array<f32, 4>;  // running max, running sum, new max, correction

fn load_kv(pool: u32, i: u32) -> f32 {
  let w = kv_word_index(i);
  switch pool {
    case 0u: { return kv_word_value(pool0[w], i); }
    case 1u: { return kv_word_value(pool1[w], i); }
    case 2u: { return kv_word_value(pool2[w], i); }
    default: { return kv_word_value(pool3[w], i); }
  }
}

@compute @workgroup_size(256)
fn attention_prefill_baseline(@builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(local_invocation_index) tid: u32) {
  let head = wid.x;
  let q_local = wid.y;
  if (head >= p.n_heads || q_local >= p.n_queries) { return; }  // uniform per workgroup
  let head_dim = min(p.head_dim, MAX_HEAD_DIM);
  let kv_off = (head / (p.n_heads / p.n_kv_heads)) * head_dim;
  let window = min(p.start_pos + p.q_base + q_local + 1u, p.max_seq);
  let lo = min(first_key(p.start_pos + p.q_base + q_local), window);  // keys [lo, window)
  let q_off = p.q_offset + q_local * p.q_stride + head * head_dim;
  let out_off = p.out_offset + q_local * p.out_stride + head * head_dim;
  let v_shift = p.page_size * p.kv_dim;

  for (var d = tid; d < head_dim; d += TILE) {
    q_sh[d] = q[q_off + d] * p.scale;
    acc[d] = 0.0;
  }
  if (tid == 0u) {
    state[0] = NEG_BIG;
    state[1] = 0.0;
  }
  workgroupBarrier();

  for (var base = lo; base < window; base += TILE) {
    let t = base + tid;
    var score = NEG_BIG;
    if (t < window) {
      let loc = kv_row(t, 0u, 1u);
      var dot = 0.0;
      for (var d = 0u; d < head_dim; d += 1u) {
        dot += q_sh[d] * load_kv(loc.x, loc.y + kv_off + d);
      }
      score = dot;
    }
    red[tid] = score;
    workgroupBarrier();
    for (var stride = TILE / 2u; stride > 0u; stride /= 2u) {
      if (tid < stride) { red[tid] = max(red[tid], red[tid + stride]); }
      workgroupBarrier();
    }
    if (tid == 0u) {
      let m_new = max(state[0], red[0]);
      state[2] = m_new;
      state[3] = exp(state[0] - m_new);
    }
    workgroupBarrier();
    let m_new = state[2];
    let corr = state[3];
    var prob = 0.0;
    if (t < window) { prob = exp(score - m_new); }
    probs[tid] = prob;
    red[tid] = prob;
    workgroupBarrier();
    for (var stride = TILE / 2u; stride > 0u; stride /= 2u) {
      if (tid < stride) { red[tid] += red[tid + stride]; }
      workgroupBarrier();
    }
    for (var d = tid; d < head_dim; d += TILE) {
      var a = acc[d] * corr;
      let n = min(TILE, window - base);
      for (var j = 0u; j < n; j += 1u) {
        let loc = kv_row(base + j, 0u, 1u);
        a += probs[j] * load_kv(loc.x, loc.y + v_shift + kv_off + d);
      }
      acc[d] = a;
    }
    if (tid == 0u) {
      state[1] = state[1] * corr + red[0];
      state[0] = m_new;
    }
    workgroupBarrier();
  }
  let l = state[1] + sink_term(head, state[0]);
  for (var d = tid; d < head_dim; d += TILE) {
    out[out_off + d] = select(0.0, acc[d] / l, l > 0.0);  // empty window -> 0, never NaN
  }
}
