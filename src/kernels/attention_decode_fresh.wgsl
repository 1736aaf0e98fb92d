// Decode attention that takes the new token itself, for models with per-head q/k norms (qwen3, gemma3/4, lfm2, ...):
// the work of qk_norm_rope_kv.wgsl and attention_decode in one dispatch, one dependent link fewer a layer. Compiled
// after attention_common.wgsl, attention.wgsl (its parameters, bindings, decode_keys and workgroup memory; the host's
// prelude sets DEC_FRESH and declares the pools read-write), rope_angle.wgsl and qk_norm_rope.wgsl (the norm and RoPE
// arithmetic, shared with qk_norm_rope_kv.wgsl so that both give the same bits).
//
// Each workgroup (split, head) of the one query at position P = start_pos + q_base reads its q head and its kv head's
// k and v rows as the products wrote them (f32, before any norm), normalises and rotates q and k and normalises v
// (with v_norm) exactly as qk_norm_rope_kv does, and rounds k and v to the cache's type. The workgroup of the split
// holding P and the first head of each GQA group writes them into the cache's row P; every workgroup then takes key P
// from its own copy (dacc, kv_stash's bits), not from the cache: no workgroup depends on a row another one is writing.
// The output is the same bits as qk_norm_rope_kv followed by attention_decode. Without `append` (FreshParams) q alone:
// the bits of qk_norm_rope_q (qk_norm_rope_kv's q heads) followed by attention_decode.
// Several sequences' tokens at once (p.per_query, continuous batching): workgroup (split, head, i) takes query i, the
// token of q row i and k / v row i at the position and page base queries[i] gives, as attention_decode does: the
// bits of qk_norm_rope_kv_rows followed by attention_decode's per-query walk.

struct FreshParams {
  rope_dim: u32, neox: u32, norm: u32, v_norm: u32,
  eps: f32, kv_base: u32, append: u32, _pad1: u32,
}

@group(0) @binding(11) var<storage, read> fresh_k: array<f32>;  // the token's k row at element kv_base
@group(0) @binding(12) var<storage, read> fresh_v: array<f32>;  // and its v row
@group(0) @binding(16) var<uniform> f: FreshParams;

const NR_MAX: u32 = 4u * HD4;  // qk_norm_rope.wgsl: q, k and v of one head
const NR_SLOTS: u32 = 3u;

@compute @workgroup_size(DEC_T)
fn attention_decode_fresh(@builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(local_invocation_index) tid: u32,
                          @builtin(subgroup_size) sg_size: u32,
                          @builtin(subgroup_invocation_id) sg_lane: u32) {
  let split = wid.x;
  let head = wid.y;
  let q_local = wid.z;
  if (head >= p.n_heads || split >= p.n_splits || q_local >= p.n_queries) { return; }  // uniform per workgroup
  let group = p.n_heads / p.n_kv_heads;
  let kvh = head / group;
  var pos = p.start_pos + p.q_base;
  var page_base = 0u;
  if (p.per_query != 0u) {
    pos = queries[q_local].x;
    page_base = queries[q_local].y;
  }
  let hd = p.head_dim;

  // the three rows into nr_row's slots (q 0, k 1, v 2) and their sums of squares, in qk_norm_rope_kv's order
  let q_at = (p.q_offset + q_local * p.q_stride) / 4u + head * HD4;
  let kv_at = f.kv_base + (q_local * p.n_kv_heads + kvh) * hd;
  // (without append, q alone: a layer attending over another layer's cache, which already holds the token)
  let append = f.append != 0u;
  var ss = vec4<f32>(0.0);
  if (tid < NR_WG) {
    for (var i = tid; i < hd; i += NR_WG) {
      let xq = q[q_at + i / 4u][i % 4u];
      var xk = 0.0;
      var xv = 0.0;
      if (append) {
        xk = fresh_k[kv_at + i];
        xv = fresh_v[kv_at + i];
      }
      nr_row[i] = xq;
      nr_row[NR_MAX + i] = xk;
      nr_row[2u * NR_MAX + i] = xv;
      ss += vec4<f32>(xq * xq, xk * xk, xv * xv, 0.0);
    }
  }
  let sums = nr_sums(tid, ss);
  let normed = f.norm != 0u;
  let inv_q = select(1.0, inverseSqrt(sums.x / f32(hd) + f.eps), normed);
  let inv_k = select(1.0, inverseSqrt(sums.y / f32(hd) + f.eps), normed);
  let inv_v = select(1.0, inverseSqrt(sums.z / f32(hd) + f.eps), f.v_norm != 0u);
  let neox = f.neox != 0u;
  let pq = nr_pairs(0u, tid, hd, f.rope_dim, neox, pos, inv_q, select(0u, 1u, normed));
  var pk = NrPairs();
  if (append) { pk = nr_pairs(1u, tid, hd, f.rope_dim, neox, pos, inv_k, select(0u, 2u, normed)); }
  workgroupBarrier();  // every nr_row read above
  nr_store(0u, pq);
  nr_store(1u, pk);
  workgroupBarrier();

  // q scaled into dq; k and v as the cache holds them into dacc and, by the writer, into row P of the cache
  let window = min(pos + 1u, p.max_seq);
  let k_begin = min(first_key(pos) / DEC_WG * DEC_WG + split * p.split_len, window);
  let writer = append && head % group == 0u && pos >= k_begin && pos < min(k_begin + p.split_len, window);
  if (tid < HD4) {
    let i = 4u * tid;
    dq[tid] = vec4<f32>(nr_row[i], nr_row[i + 1u], nr_row[i + 2u], nr_row[i + 3u]) * p.scale;
    let kb = NR_MAX + i;
    let vb = 2u * NR_MAX + i;
    let ks = kv_stash(vec4<f32>(nr_row[kb], nr_row[kb + 1u], nr_row[kb + 2u], nr_row[kb + 3u]));
    let vs = kv_stash(vec4<f32>(nr_row[vb] * inv_v, nr_row[vb + 1u] * inv_v, nr_row[vb + 2u] * inv_v,
                                nr_row[vb + 3u] * inv_v));
    dacc[tid] = ks;
    dacc[HD4 + tid] = vs;
    if (writer) {
      let loc = kv_row(pos, page_base, 4u);
      let at = loc.y + kvh * HD4 + tid;
      let v_at = at + p.page_size * (p.kv_dim / 4u);
      //#unroll! P 4
      if (loc.x == $P) {
        pool$P[at] = kv_unit(ks);
        pool$P[v_at] = kv_unit(vs);
      }
      //#end
    }
  }
  workgroupBarrier();
  decode_keys(split, head, q_local, pos, page_base, tid, sg_size, sg_lane, select(NO_FRESH, pos, append));
}
