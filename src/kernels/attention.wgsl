// FlashAttention for wgllm: batched causal prefill and split-K decode over a paged KV cache; compiled after
// attention_common.wgsl (the contract, the parameters, the page walk).
//
// The host prepends a prelude: KvVec / kv_to_f32 (4 KV elements as f16, packed u32 pairs or
// f32) and the tile constants BQ, BK, TPR, DV, RPT (rows per thread group), WG = BQ / RPT * TPR and
// NL = ceil(BK * HD4 / WG), the vec4 of K (and of V) each thread stages per tile, and DEC_TPK, the decode kernel's
// threads per key (attention_tiles()).
// head_dim = 4 * DV * TPR. Barriers stay in entry points, in uniform control flow.

alias KvUnit = KvVec;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
// decode only: per (query, head, split) partial state [m, l, 0, 0] then HD4 vec4 of o.
@group(0) @binding(8) var<storage, read_write> partials: array<vec4<f32>>;
// decode with per_query (one query per sequence, each over its own view of the pools): query i's position and the
// first page of its view in page_table.
@group(0) @binding(9) var<storage, read> queries: array<vec2<u32>>;

const HD4: u32 = DV * TPR;  // head_dim / 4

// ---------------------------------------------------------------------------------------
// Prefill. A workgroup owns BQ rows = (query, head) pairs that share one kv head (the heads of
// a GQA group x a block of consecutive queries) and streams the K/V tiles of that kv head once
// for all of them. Each row is held by TPR adjacent threads; thread `lane` of a row owns the
// interleaved vec4 columns lane, lane + TPR, ... of q and of the output accumulator (registers).
// Scores are all-reduced across the TPR lanes with subgroup shuffles.
//
// Traffic per workgroup: window * kv_dim/n_kv_heads * 2 elements of K/V (once, not once per
// row) + BQ rows of q and out. FLOPs: 4 * head_dim per (row, key).
var<workgroup> k_tile: array<vec4<f32>, BK * HD4>;
var<workgroup> v_tile: array<vec4<f32>, BK * HD4>;

// Loads the K/V tile of keys [kb, kb + BK) of kv head kvh into registers (zeros past kv_end):
// thread tid takes elements tid, tid + WG, ... of the [BK][HD4] tile.
fn fetch_tile(kb: u32, kv_end: u32, kvh: u32, tid: u32,
              pk: ptr<function, array<KvVec, NL>>, pv: ptr<function, array<KvVec, NL>>) {
  let loc = kv_row(kb, 0u, 4u);  // a tile never straddles a page
  let n_keys = min(BK, kv_end - kb);
  let tile_base = loc.y + kvh * HD4;
  let v_shift = p.page_size * (p.kv_dim / 4u);
  // A uniform branch per pool, so each load indexes one binding directly.
  //#unroll! P 4
  if (loc.x == $P) {
    //#unroll r NL
    {
      let i = tid + $r * WG;
      var kx = KvVec();
      var vx = KvVec();
      if (i < BK * HD4 && i / HD4 < n_keys) {
        let e = tile_base + (i / HD4) * (p.kv_dim / 4u) + i % HD4;
        kx = pool$P[e];
        vx = pool$P[e + v_shift];
      }
      (*pk)[$r] = kx;
      (*pv)[$r] = vx;
    }
    //#end
  }
  //#end
}

@compute @workgroup_size(WG)
fn attention_prefill(@builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(local_invocation_index) tid: u32) {
  let group = p.n_heads / p.n_kv_heads;
  let hpw = min(group, BQ);                       // heads per workgroup
  let head_chunks = (group + hpw - 1u) / hpw;
  let qpw = BQ / hpw;                             // queries per workgroup
  let q_blocks = (p.n_queries + qpw - 1u) / qpw;
  let flat = wid.x + wid.y * p.grid_x;
  let qb = q_blocks - 1u - flat % q_blocks;     // longest windows first: less tail imbalance
  let kvh = flat / q_blocks / head_chunks;
  let chunk = (flat / q_blocks) % head_chunks;
  if (kvh >= p.n_kv_heads) { return; }            // grid padding: uniform per workgroup

  // Thread group g (TPR adjacent threads) holds RPT rows: g, g + BQ/RPT, ... Each K/V value read from
  // workgroup memory then feeds RPT rows.
  let g = tid / TPR;
  let lane = tid % TPR;
  // The workgroup's longest window is its last query's: the loop bound is uniform.
  let last_q = min(qb * qpw + qpw, p.n_queries) - 1u;
  let kv_end = min(p.start_pos + p.q_base + last_q + 1u, p.max_seq);
  // ... and its first query's window starts lowest: the tiles below it are skipped (uniform too).
  let kv_begin = min(first_key(p.start_pos + p.q_base + qb * qpw) / BK * BK, kv_end);

  // q (pre-scaled), the output accumulators and the tile's scores: private arrays that the
  // //#unroll blocks index with constants only (so GPU compilers keep them in registers).
  var qr: array<vec4<f32>, DV * RPT>;
  var o: array<vec4<f32>, DV * RPT>;
  var win: array<u32, RPT>;
  var lo: array<u32, RPT>;
  var m: array<f32, RPT>;
  var l: array<f32, RPT>;
  //#unroll r RPT
  {
    let row = g + $r * (BQ / RPT);
    let q_local = qb * qpw + row / hpw;
    let head_in_group = chunk * hpw + row % hpw;
    let row_ok = row < qpw * hpw && q_local < p.n_queries && head_in_group < group;
    win[$r] = select(0u, min(p.start_pos + p.q_base + q_local + 1u, p.max_seq), row_ok);
    lo[$r] = first_key(p.start_pos + p.q_base + q_local);
    m[$r] = NEG_BIG;
    l[$r] = 0.0;
    let q_row = (p.q_offset + q_local * p.q_stride) / 4u + (kvh * group + head_in_group) * HD4;
    //#unroll v DV
    qr[$r * DV + $v] = vec4<f32>(0.0);
    o[$r * DV + $v] = vec4<f32>(0.0);
    if (row_ok) { qr[$r * DV + $v] = q[q_row + $v * TPR + lane] * p.scale; }
    //#end
  }
  //#end
  var s: array<f32, BK * RPT>;

  // Software pipelining: the next tile's K/V travel into registers while this one is used.
  var pk: array<KvVec, NL>;
  var pv: array<KvVec, NL>;
  fetch_tile(kv_begin, kv_end, kvh, tid, &pk, &pv);
  for (var kb = kv_begin; kb < kv_end; kb += BK) {
    workgroupBarrier();  // the previous tile is consumed
    //#unroll n NL
    {
      let i = tid + $n * WG;
      if (i < BK * HD4) {
        k_tile[i] = kv_to_f32(pk[$n]);
        v_tile[i] = kv_to_f32(pv[$n]);
      }
    }
    //#end
    workgroupBarrier();
    if (kb + BK < kv_end) { fetch_tile(kb + BK, kv_end, kvh, tid, &pk, &pv); }

    // Scores of my rows for the BK keys: partial dots over my columns, summed over the group's lanes.
    var tile_max: array<f32, RPT>;
    //#unroll r RPT
    tile_max[$r] = NEG_BIG;
    //#end
    //#unroll j BK
    {
      var d: array<f32, RPT>;
      //#unroll r RPT
      d[$r] = 0.0;
      //#end
      //#unroll v DV
      {
        let kx = k_tile[$j * HD4 + $v * TPR + lane];
        //#unroll r RPT
        d[$r] += dot(qr[$r * DV + $v], kx);
        //#end
      }
      //#end
      //#unroll r RPT
      {
        var x = d[$r];
        if (TPR > 1u) { x += subgroupShuffleXor(x, 1u); }
        if (TPR > 2u) { x += subgroupShuffleXor(x, 2u); }
        if (TPR > 4u) { x += subgroupShuffleXor(x, 4u); }
        s[$r * BK + $j] = select(NEG_BIG, x, kb + $j < win[$r] && kb + $j >= lo[$r]);
        tile_max[$r] = max(tile_max[$r], s[$r * BK + $j]);
      }
      //#end
    }
    //#end
    var m_new: array<f32, RPT>;
    var corr: array<f32, RPT>;
    var p_sum: array<f32, RPT>;
    //#unroll r RPT
    m_new[$r] = max(m[$r], tile_max[$r]);
    corr[$r] = exp(m[$r] - m_new[$r]);
    p_sum[$r] = 0.0;
    //#unroll v DV
    o[$r * DV + $v] *= corr[$r];
    //#end
    //#end
    //#unroll j BK
    {
      var pj: array<f32, RPT>;
      //#unroll r RPT
      pj[$r] = select(0.0, exp(s[$r * BK + $j] - m_new[$r]), kb + $j < win[$r] && kb + $j >= lo[$r]);
      p_sum[$r] += pj[$r];
      //#end
      //#unroll v DV
      {
        let vx = v_tile[$j * HD4 + $v * TPR + lane];
        //#unroll r RPT
        o[$r * DV + $v] += pj[$r] * vx;
        //#end
      }
      //#end
    }
    //#end
    //#unroll r RPT
    l[$r] = l[$r] * corr[$r] + p_sum[$r];
    m[$r] = m_new[$r];
    //#end
  }

  //#unroll r RPT
  {
    let row = g + $r * (BQ / RPT);
    let q_local = qb * qpw + row / hpw;
    let head_in_group = chunk * hpw + row % hpw;
    if (row < qpw * hpw && q_local < p.n_queries && head_in_group < group) {
      let head = kvh * group + head_in_group;
      let lt = l[$r] + sink_term(head, m[$r]);
      let inv = select(0.0, 1.0 / lt, lt > 0.0);  // empty window -> 0, never NaN
      let o_row = (p.out_offset + q_local * p.out_stride) / 4u + head * HD4;
      //#unroll v DV
      out[o_row + $v * TPR + lane] = o[$r * DV + $v] * inv;
      //#end
    }
  }
  //#end
}

// ---------------------------------------------------------------------------------------
// Decode: one workgroup per (split, head, query). The split covers keys
// [base + split * split_len, min(base + (split + 1) * split_len, P + 1)), base = the query's first key rounded
// down to a DEC_WG tile (so tiles stay within a page); keys below the first are masked. DEC_T = DEC_WG * DEC_TPK
// threads: DEC_TPK adjacent ones score each key of a DEC_WG-key tile (columns part, part + DEC_TPK, ... of a head_dim
// dot product read from the cache with vec4 loads, then added across the DEC_TPK lanes), then the threads split into
// DKS = DEC_T / HD4 key slices x HD4 columns to accumulate P.V with coalesced V reads. A wide head (256: 64 vec4)
// thus walks 16 loads a key and 32 keys of V per thread, not 64 and 64 (each a round trip to memory: the decode of a
// few heads is latency, PERF.md). With one split the output is written directly; otherwise the partial
// (m, l, o) goes to `partials` and attention_decode_reduce combines the splits.
//
// Traffic: 2 * window * head_dim KV elements per head (GQA heads of a group hit the same lines
// in cache) — decode is bound by reading the cache once.
const DEC_WG: u32 = 128u;  // keys per tile (and attention_decode_gqa.wgsl's threads)
const KS: u32 = DEC_WG / HD4;
const MAX_SUBGROUPS: u32 = DEC_WG / 4u;
const DEC_T: u32 = DEC_WG * DEC_TPK;
const DKS: u32 = DEC_T / HD4;
var<workgroup> dq: array<vec4<f32>, HD4>;
var<workgroup> dprob: array<f32, DEC_WG>;
var<workgroup> dred: array<f32, DEC_T / 4u>;
var<workgroup> dacc: array<vec4<f32>, DEC_T>;

@compute @workgroup_size(DEC_T)
fn attention_decode(@builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(local_invocation_index) tid: u32,
                    @builtin(subgroup_size) sg_size: u32,
                    @builtin(subgroup_invocation_id) sg_lane: u32) {
  let split = wid.x;
  let head = wid.y;
  let q_local = wid.z;
  if (head >= p.n_heads || q_local >= p.n_queries || split >= p.n_splits) { return; }
  var pos = p.start_pos + p.q_base + q_local;
  var page_base = 0u;
  if (p.per_query != 0u) {
    pos = queries[q_local].x;
    page_base = queries[q_local].y;
  }
  if (tid < HD4) {
    dq[tid] = q[(p.q_offset + q_local * p.q_stride) / 4u + head * HD4 + tid] * p.scale;
  }
  workgroupBarrier();
  decode_keys(split, head, q_local, pos, page_base, tid, sg_size, sg_lane, NO_FRESH);
}

const NO_FRESH: u32 = 0xffffffffu;  // no key (positions stay below max_seq)

// Key `fresh`'s K (dacc[c]) or V (dacc[HD4 + c], kv_stash's bits) where a DEC_FRESH kernel holds the new token
// itself, else x.
fn fresh_or(x: vec4<f32>, t: u32, fresh: u32, at: u32) -> vec4<f32> {
  return select(x, kv_unstash(dacc[at]), DEC_FRESH && t == fresh);
}

// The split-K walk of one (split, head, query) at position pos (its pages from page_base) once dq holds the scaled
// q. With DEC_FRESH, key `fresh` is read from dacc[0, HD4) (K) and dacc[HD4, 2 HD4) (V), not from the pools.
fn decode_keys(split: u32, head: u32, q_local: u32, pos: u32, page_base: u32, tid: u32, sg_size: u32, sg_lane: u32,
               fresh: u32) {
  let kvh = head / (p.n_heads / p.n_kv_heads);
  let window = min(pos + 1u, p.max_seq);
  let lo = first_key(pos);
  let k_begin = min(lo / DEC_WG * DEC_WG + split * p.split_len, window);
  let k_end = min(k_begin + p.split_len, window);
  let n_sg = (DEC_T + sg_size - 1u) / sg_size;
  let sg_id = tid / sg_size;
  let v_shift = p.page_size * (p.kv_dim / 4u);
  let col = tid % HD4;
  let slice = tid / HD4;
  let kt = tid / DEC_TPK;    // the key of a tile this thread scores
  let part = tid % DEC_TPK;  // its share of the key's columns

  var m = NEG_BIG;
  var l = 0.0;
  var o = vec4<f32>(0.0);
  for (var kb = k_begin; kb < k_end; kb += DEC_WG) {
    let t = kb + kt;
    let loc = kv_row(kb, page_base, 4u);  // a tile never straddles a page
    let row = loc.y + kt * (p.kv_dim / 4u) + kvh * HD4;
    let live = t < k_end && t >= lo;
    var acc = 0.0;
    if (live) {
      //#unroll! P 4
      if (loc.x == $P) {
        for (var c = part; c < HD4; c += DEC_TPK) {
          acc += dot(dq[c], fresh_or(kv_to_f32(pool$P[row + c]), t, fresh, c));
        }
      }
      //#end
    }
    // the key's DEC_TPK partial dots: adjacent lanes of one subgroup, every lane gets the same sum
    for (var mk = 1u; mk < DEC_TPK; mk <<= 1u) { acc += subgroupShuffleXor(acc, mk); }
    var score = NEG_BIG;
    if (live) { score = acc; }
    // tile max: subgroup max, then across subgroups through workgroup memory
    let sg_max = subgroupMax(score);
    if (sg_lane == 0u) { dred[sg_id] = sg_max; }
    workgroupBarrier();
    var tile_max = NEG_BIG;
    for (var g = 0u; g < n_sg; g += 1u) { tile_max = max(tile_max, dred[g]); }
    let m_new = max(m, tile_max);
    let corr = exp(m - m_new);
    var prob = 0.0;
    if (live && part == 0u) { prob = exp(score - m_new); }  // each key once
    if (part == 0u) { dprob[kt] = prob; }
    workgroupBarrier();  // dred read by all, dprob written
    let sg_sum = subgroupAdd(prob);
    if (sg_lane == 0u) { dred[sg_id] = sg_sum; }
    workgroupBarrier();
    var tile_sum = 0.0;
    for (var g = 0u; g < n_sg; g += 1u) { tile_sum += dred[g]; }
    l = l * corr + tile_sum;
    m = m_new;
    o *= corr;
    if (slice < DKS) {
      let n = min(DEC_WG, k_end - kb);
      let v_col = loc.y + v_shift + kvh * HD4 + col;
      let vs = p.kv_dim / 4u;
      //#unroll! P 4
      if (loc.x == $P) {
        // four keys per step: four independent loads in flight
        var j = slice;
        for (; j + 3u * DKS < n; j += 4u * DKS) {
          let v0 = fresh_or(kv_to_f32(pool$P[v_col + j * vs]), kb + j, fresh, HD4 + col);
          let v1 = fresh_or(kv_to_f32(pool$P[v_col + (j + DKS) * vs]), kb + j + DKS, fresh, HD4 + col);
          let v2 = fresh_or(kv_to_f32(pool$P[v_col + (j + 2u * DKS) * vs]), kb + j + 2u * DKS, fresh, HD4 + col);
          let v3 = fresh_or(kv_to_f32(pool$P[v_col + (j + 3u * DKS) * vs]), kb + j + 3u * DKS, fresh, HD4 + col);
          o += dprob[j] * v0 + dprob[j + DKS] * v1 + dprob[j + 2u * DKS] * v2 + dprob[j + 3u * DKS] * v3;
        }
        for (; j < n; j += DKS) {
          o += dprob[j] * fresh_or(kv_to_f32(pool$P[v_col + j * vs]), kb + j, fresh, HD4 + col);
        }
      }
      //#end
    }
    workgroupBarrier();  // dprob / dred reused by the next tile
  }

  dacc[tid] = o;
  workgroupBarrier();
  if (tid < HD4) {
    var total = vec4<f32>(0.0);
    for (var k = 0u; k < DKS; k += 1u) { total += dacc[k * HD4 + tid]; }
    if (p.n_splits == 1u) {
      let lt = l + sink_term(head, m);
      let inv = select(0.0, 1.0 / lt, lt > 0.0);
      out[(p.out_offset + q_local * p.out_stride) / 4u + head * HD4 + tid] = total * inv;
    } else {
      let base = ((q_local * p.n_heads + head) * p.n_splits + split) * (HD4 + 1u);
      if (tid == 0u) { partials[base] = vec4<f32>(m, l, 0.0, 0.0); }
      partials[base + 1u + tid] = total;
    }
  }
}

// Combines the splits of one (head, query): o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
// The 64 threads (HD4 of them for heads wider than 256) take the splits side by side (one load per
// split each, not a serial walk): the max and the weighted l through a workgroup tree, then
// RS = RED_WG / HD4 slices of splits per output column, summed through workgroup memory.
const RED_WG: u32 = max(64u, HD4);
const RS: u32 = RED_WG / HD4;
var<workgroup> rtree: array<f32, RED_WG>;
var<workgroup> racc: array<vec4<f32>, RED_WG>;

// Tree reduction over the workgroup (max when take_max, else sum); every thread gets the result.
fn reduce_splits(tid: u32, v: f32, take_max: bool) -> f32 {
  rtree[tid] = v;
  workgroupBarrier();
  for (var half = RED_WG / 2u; half > 0u; half = half / 2u) {
    if (tid < half) {
      let o = rtree[tid + half];
      rtree[tid] = select(rtree[tid] + o, max(rtree[tid], o), take_max);
    }
    workgroupBarrier();
  }
  let r = rtree[0];
  workgroupBarrier();  // rtree is reused by the next call
  return r;
}

@compute @workgroup_size(RED_WG)
fn attention_decode_reduce(@builtin(workgroup_id) wid: vec3<u32>,
                           @builtin(local_invocation_index) tid: u32) {
  let head = wid.x;
  let q_local = wid.y;
  if (head >= p.n_heads || q_local >= p.n_queries) { return; }  // uniform: the whole workgroup
  let first = (q_local * p.n_heads + head) * p.n_splits;
  var local_m = NEG_BIG;
  for (var s = tid; s < p.n_splits; s += RED_WG) { local_m = max(local_m, partials[(first + s) * (HD4 + 1u)].x); }
  let big_m = reduce_splits(tid, local_m, true);
  var local_l = 0.0;
  for (var s = tid; s < p.n_splits; s += RED_WG) {
    let st = partials[(first + s) * (HD4 + 1u)];
    local_l += st.y * exp(st.x - big_m);
  }
  let big_l = reduce_splits(tid, local_l, false) + sink_term(head, big_m);
  let inv = select(0.0, 1.0 / big_l, big_l > 0.0);
  let col = tid % HD4;
  let slice = tid / HD4;
  var total = vec4<f32>(0.0);
  if (slice < RS) {
    for (var s = slice; s < p.n_splits; s += RS) {
      let base = (first + s) * (HD4 + 1u);
      total += partials[base + 1u + col] * exp(partials[base].x - big_m);
    }
  }
  racc[tid] = total;
  workgroupBarrier();
  if (tid < HD4) {
    var o = vec4<f32>(0.0);
    for (var k = 0u; k < RS; k += 1u) { o += racc[k * HD4 + tid]; }
    out[(p.out_offset + q_local * p.out_stride) / 4u + head * HD4 + tid] = o * inv;
  }
}
