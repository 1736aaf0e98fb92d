// Sampling on the GPU: from n f32 logits to one token id, with the repetition penalty, top-k, top-p, min-p and
// temperature of api/sampling.h, and a uniform u in [0, 1) that the host draws per step. The id goes where the next
// decode step reads its input, so sampled decoding needs no round trip to the host between steps. The algorithm is
// cpu::sample_reference (src/cpu/sample.h), step for step:
//   penalty  work = logits, then work[id] = logits[id] * (1 / penalty) if > 0 else * penalty for every recent id
//            (written from the original logit, so an id that occurs twice is penalised once)
//   greedy   temperature <= 0: the argmax of work, the lowest id among equals
//   top-k    the k largest in the order (value falling, id rising): a radix select of the k-th key over the float
//            bits (4 passes of 8 bits), the ties at it taken by rising id
//   top-p    over the survivors, w = exp(v - max): keep v >= T for the largest value T whose mass sum(w, v >= T)
//            reaches top_p * sum(w) (a bisection over the float bits; the tie group at T is kept whole)
//   min-p    keep w >= min_p
//   draw     q = exp((v - max) / temperature); the first survivor in rising id order whose running sum of q
//            exceeds u * sum(q)
// Non-finite logits (NaN, +-inf) mean the forward pass broke down: the answer is NON_FINITE instead of an id.
//
// Three dispatches of one workgroup each (the general path; a fast path is further down), sharing state through
// `scratch` (u32 words: [0, 16) state, then the penalised logits [n], then the survivors as (value bits, id) pairs
// in rising id order [2n], then the fast path's regions):
//   sample_prepare  copy + penalty + max (greedy and non-finite answers end here)
//   sample_select   top-k, then the survivors compacted in id order
//   sample_draw     top-p, min-p, temperature and the draw over the survivors
// Traffic: about 8 reads of n words with top-k on (copy, max, 4 radix passes, tie cut, compaction), then
// ~34 passes over the survivors for top-p and the draw (over all n when top-k is off).

struct SampleParams {
  n: u32, top_k: u32, top_p: f32, min_p: f32,              // top_k: k < n, or n when off
  temperature: f32, penalty: f32, inv_penalty: f32, u: f32,
  n_recent: u32, recent_slot: u32, recent_cap: u32, out_index: u32,  // recent_cap 0: no ring to append to
  fast: u32, n_chunks: u32, per_lane: u32, logits_base: u32,  // the fast path (below); chunks of WG * per_lane ids
  scratch_base: u32, recent_base: u32, _pad0: u32, _pad1: u32,  // where this row's logits, scratch, recent ids start
}

// Several rows at once (sample_rows, continuous batching): workgroups (., i) draw row i with its own parameters,
// entry i of `rows` (the host's prelude declares it, binding 5, and params_of reads it); one row: params_of(0) is the
// uniform. Every entry point first takes its row's parameters into p.
@group(0) @binding(0) var<uniform> one: SampleParams;
var<private> p: SampleParams;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> recent: array<u32>;   // ring of recent ids, [recent_cap]
@group(0) @binding(3) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
const NON_FINITE: u32 = 0xffffffffu;  // kSampleNonFinite
// state words
const S_MAX: u32 = 0u;    // bits of the largest penalised logit
const S_DONE: u32 = 1u;   // 1: the answer is written (greedy or non-finite)
const S_COUNT: u32 = 2u;  // survivors after top-k
const S_FLOOR: u32 = 3u;  // fast path: the key every candidate reaches
const S_CAND: u32 = 4u;   // fast path: candidates
const WORK: u32 = 16u;    // the penalised logits start here (fast path: the candidates' values)

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;
var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> n_bad: atomic<u32>;
var<workgroup> pick: atomic<u32>;
var<workgroup> last_kept: atomic<u32>;
var<workgroup> bc_u: u32;  // broadcasts (read back with workgroupUniformLoad)
var<workgroup> bc_u2: u32;
var<workgroup> bc_f: f32;

fn non_finite(v: f32) -> bool {
  return (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u;
}

// The u32 whose order is the float order (-0 taken as +0): larger value, larger key.
fn key_of(v: f32) -> u32 {
  var b = bitcast<u32>(v);
  if (b == 0x80000000u) { b = 0u; }
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// Fast-path regions: per-chunk slots of (value bits, id) [2n] (where the survivors go later), the candidates' ids
// [n], then per chunk its largest key, whether it saw a non-finite logit, and how many of its ids are candidates.
fn slot(j: u32) -> u32 { return WORK + p.n + 2u * j; }
fn ids_at() -> u32 { return WORK + 3u * p.n; }
fn chunk_word(which: u32, g: u32) -> u32 { return WORK + 4u * p.n + which * WG + g; }

fn work(i: u32) -> f32 { return bitcast<f32>(scratch[p.scratch_base + WORK + i]); }
fn cand_v(j: u32) -> f32 { return bitcast<f32>(scratch[p.scratch_base + WORK + p.n + 2u * j]); }
fn cand_id(j: u32) -> u32 { return scratch[p.scratch_base + WORK + p.n + 2u * j + 1u]; }

// The contiguous range of `count` items that lane lid walks when an order by position matters.
fn chunk(lid: u32, count: u32) -> vec2<u32> {
  let c = (count + WG - 1u) / WG;
  return vec2<u32>(min(count, lid * c), min(count, lid * c + c));
}

// Exclusive prefix sum of x over the lanes (Hillis-Steele); .y is the total.
fn scan_u32(lid: u32, x: u32) -> vec2<u32> {
  red_u[lid] = x;
  workgroupBarrier();
  for (var off = 1u; off < WG; off = off * 2u) {
    let add = select(0u, red_u[select(0u, lid - off, lid >= off)], lid >= off);
    workgroupBarrier();
    red_u[lid] += add;
    workgroupBarrier();
  }
  let r = vec2<u32>(red_u[lid] - x, red_u[WG - 1u]);
  workgroupBarrier();
  return r;
}

fn scan_f32(lid: u32, x: f32) -> vec2<f32> {
  red_f[lid] = x;
  workgroupBarrier();
  for (var off = 1u; off < WG; off = off * 2u) {
    let add = select(0.0, red_f[select(0u, lid - off, lid >= off)], lid >= off);
    workgroupBarrier();
    red_f[lid] += add;
    workgroupBarrier();
  }
  let r = vec2<f32>(red_f[lid] - x, red_f[WG - 1u]);
  workgroupBarrier();
  return r;
}

// (v, i) beats (bv, bi): larger, or equal with a lower id.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  return v > bv || (v == bv && i < bi);
}

fn finish(id: u32) {
  out[p.out_index] = id;
  if (p.recent_cap > 0u && id != NON_FINITE) { recent[p.recent_base + p.recent_slot] = id; }
}

@compute @workgroup_size(WG)
fn sample_prepare(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  p = params_of(wg.y);
  if (p.fast != 0u) { return; }  // (rows: a row on the fast path)
  // Cleared by hand: wgpu may skip WGSL's zero-initialisation of workgroup memory (see argmax.wgsl).
  if (lid == 0u) { atomicStore(&n_bad, 0u); }
  workgroupBarrier();
  var bad = false;
  for (var i = lid; i < p.n; i += WG) {
    let v = logits[p.logits_base + i];
    bad = bad || non_finite(v);
    scratch[p.scratch_base + WORK + i] = bitcast<u32>(v);
  }
  storageBarrier();  // every copy lands before a penalised value overwrites it
  if (p.penalty != 1.0) {
    for (var j = lid; j < p.n_recent; j += WG) {
      let id = recent[p.recent_base + j];
      if (id < p.n) {
        let v = logits[p.logits_base + id];
        scratch[p.scratch_base + WORK + id] = bitcast<u32>(select(v * p.penalty, v * p.inv_penalty, v > 0.0));
      }
    }
  }
  storageBarrier();
  var bv = bitcast<f32>(0xff800000u);
  var bi = NONE;
  for (var i = lid; i < p.n; i += WG) {
    let v = work(i);
    if (beats(v, i, bv, bi)) { bv = v; bi = i; }
  }
  if (bad) { atomicAdd(&n_bad, 1u); }
  red_f[lid] = bv;
  red_u[lid] = bi;
  workgroupBarrier();
  for (var half = WG / 2u; half > 0u; half = half / 2u) {
    if (lid < half && beats(red_f[lid + half], red_u[lid + half], red_f[lid], red_u[lid])) {
      red_f[lid] = red_f[lid + half];
      red_u[lid] = red_u[lid + half];
    }
    workgroupBarrier();
  }
  if (lid == 0u) {
    let is_bad = atomicLoad(&n_bad) != 0u;
    scratch[p.scratch_base + S_MAX] = bitcast<u32>(red_f[0]);
    let done = is_bad || p.temperature <= 0.0;
    scratch[p.scratch_base + S_DONE] = select(0u, 1u, done);
    if (done) { finish(select(red_u[0], NON_FINITE, is_bad)); }
  }
}

// The float whose key_of is k (-0 comes back as +0).
fn value_of(k: u32) -> f32 {
  return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

// The fast path, taken when there is no penalty and 0 < top_k <= n_chunks (the host decides): the vocabulary in
// n_chunks chunks of WG * per_lane ids, a workgroup each, so the passes over all n logits use the whole GPU, and the
// one-workgroup kernels see only the candidates, the ids whose key reaches a floor:
//   sample_chunk_max   each chunk's largest key, and whether it holds a non-finite logit
//   sample_floor       one workgroup: the floor = the top_k-th largest chunk maximum (top_k different ids reach
//                      it, so it is at most the top_k-th largest key of all and every top-k survivor reaches it);
//                      the max, and the non-finite answer
//   sample_chunk_keep  each chunk's candidates, in rising id order, into its slots
//   sample_gather      one workgroup: the candidates packed in rising id order
// then sample_select and sample_draw over the candidates as over the whole vocabulary (the same survivors in the
// same order, so the same id as the general path and cpu::sample_reference).
fn lane_ids(g: u32, lid: u32) -> vec2<u32> {
  let lo = (g * WG + lid) * p.per_lane;
  return vec2<u32>(min(p.n, lo), min(p.n, lo + p.per_lane));
}

@compute @workgroup_size(WG)
fn sample_chunk_max(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  p = params_of(wg.y);
  if (p.fast == 0u) { return; }  // (rows: a row on the general path)
  if (lid == 0u) { atomicStore(&n_bad, 0u); }
  workgroupBarrier();
  let r = lane_ids(wg.x, lid);
  var best = 0u;
  var bad = false;
  for (var i = r.x; i < r.y; i++) {
    let v = logits[p.logits_base + i];
    bad = bad || non_finite(v);
    best = max(best, key_of(v));
  }
  if (bad) { atomicAdd(&n_bad, 1u); }
  red_u[lid] = best;
  workgroupBarrier();
  for (var half = WG / 2u; half > 0u; half = half / 2u) {
    if (lid < half) { red_u[lid] = max(red_u[lid], red_u[lid + half]); }
    workgroupBarrier();
  }
  if (lid == 0u) {
    scratch[p.scratch_base + chunk_word(0u, wg.x)] = red_u[0];
    scratch[p.scratch_base + chunk_word(1u, wg.x)] = atomicLoad(&n_bad);
  }
}

@compute @workgroup_size(WG)
fn sample_floor(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  p = params_of(wg.y);
  if (p.fast == 0u) { return; }  // (rows: a row on the general path)
  if (lid == 0u) { atomicStore(&n_bad, 0u); }
  workgroupBarrier();
  var key = 0u;
  if (lid < p.n_chunks) {
    key = scratch[p.scratch_base + chunk_word(0u, lid)];
    if (scratch[p.scratch_base + chunk_word(1u, lid)] != 0u) { atomicAdd(&n_bad, 1u); }
  }
  red_u[lid] = key;
  workgroupBarrier();
  var above = 0u;  // chunks ranked before this one: a larger maximum, or an equal one on a lower chunk
  for (var o = 0u; o < p.n_chunks; o++) {
    let k = red_u[o];
    above += select(0u, 1u, k > key || (k == key && o < lid));
  }
  if (lid < p.n_chunks && above == p.top_k - 1u) { bc_u = key; }
  if (lid < p.n_chunks && above == 0u) { bc_u2 = key; }
  let floor_key = workgroupUniformLoad(&bc_u);
  let max_key = workgroupUniformLoad(&bc_u2);
  if (lid == 0u) {
    let is_bad = atomicLoad(&n_bad) != 0u;
    scratch[p.scratch_base + S_MAX] = bitcast<u32>(value_of(max_key));
    scratch[p.scratch_base + S_FLOOR] = floor_key;
    scratch[p.scratch_base + S_DONE] = select(0u, 1u, is_bad);
    if (is_bad) { finish(NON_FINITE); }
  }
}

@compute @workgroup_size(WG)
fn sample_chunk_keep(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  p = params_of(wg.y);
  if (p.fast == 0u) { return; }  // (rows: a row on the general path)
  if (lid == 0u) {
    bc_u = scratch[p.scratch_base + S_DONE];
    bc_u2 = scratch[p.scratch_base + S_FLOOR];
  }
  if (workgroupUniformLoad(&bc_u) != 0u) { return; }
  let floor_key = workgroupUniformLoad(&bc_u2);
  let r = lane_ids(wg.x, lid);
  var mine = 0u;
  for (var i = r.x; i < r.y; i++) { mine += select(0u, 1u, key_of(logits[p.logits_base + i]) >= floor_key); }
  let s = scan_u32(lid, mine);
  var at = wg.x * WG * p.per_lane + s.x;
  for (var i = r.x; i < r.y; i++) {
    let v = logits[p.logits_base + i];
    if (key_of(v) >= floor_key) {
      scratch[p.scratch_base + slot(at)] = bitcast<u32>(v);
      scratch[p.scratch_base + slot(at) + 1u] = i;
      at += 1u;
    }
  }
  if (lid == 0u) { scratch[p.scratch_base + chunk_word(2u, wg.x)] = s.y; }
}

@compute @workgroup_size(WG)
fn sample_gather(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  p = params_of(wg.y);
  if (p.fast == 0u) { return; }  // (rows: a row on the general path)
  if (lid == 0u) { bc_u = scratch[p.scratch_base + S_DONE]; }
  if (workgroupUniformLoad(&bc_u) != 0u) { return; }
  var count = 0u;
  if (lid < p.n_chunks) { count = scratch[p.scratch_base + chunk_word(2u, lid)]; }
  let s = scan_u32(lid, count);
  let base = lid * WG * p.per_lane;
  for (var j = 0u; j < count; j++) {
    scratch[p.scratch_base + WORK + s.x + j] = scratch[p.scratch_base + slot(base + j)];
    scratch[p.scratch_base + ids_at() + s.x + j] = scratch[p.scratch_base + slot(base + j) + 1u];
  }
  if (lid == 0u) { scratch[p.scratch_base + S_CAND] = s.y; }
}

@compute @workgroup_size(WG)
fn sample_select(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  p = params_of(wg.y);
  if (lid == 0u) {
    bc_u = scratch[p.scratch_base + S_DONE];
    bc_u2 = select(p.n, scratch[p.scratch_base + S_CAND], p.fast != 0u);
  }
  if (workgroupUniformLoad(&bc_u) != 0u) { return; }
  // The penalised logits, or on the fast path the candidates (their ids at ids_at(), rising).
  let n = workgroupUniformLoad(&bc_u2);
  // Survivors of top-k: key > cut_key, or key == cut_key and id <= id_cut.
  var cut_key = 0u;
  var id_cut = NONE;
  if (p.top_k < n) {
    // Radix select, top byte first: `prefix` holds the decided high bits of the k-th key, `remaining` how many of
    // the keys sharing them are still to be passed over (counting down from the largest).
    var prefix = 0u;
    var remaining = p.top_k;
    for (var shift = 24u; shift < 32u; shift -= 8u) {
      atomicStore(&hist[lid], 0u);
      workgroupBarrier();
      let hi_mask = select(0xffffffffu << (shift + 8u), 0u, shift == 24u);
      for (var i = lid; i < n; i += WG) {
        let k = key_of(work(i));
        if ((k & hi_mask) == prefix) { atomicAdd(&hist[(k >> shift) & 255u], 1u); }
      }
      workgroupBarrier();
      if (lid == 0u) {
        var acc = 0u;
        var b = 255u;
        loop {
          let c = atomicLoad(&hist[b]);
          if (acc + c >= remaining || b == 0u) { break; }
          acc += c;
          b -= 1u;
        }
        bc_u = prefix | (b << shift);
        bc_u2 = remaining - acc;
      }
      prefix = workgroupUniformLoad(&bc_u);
      remaining = workgroupUniformLoad(&bc_u2);
    }
    cut_key = prefix;
    // The `remaining`-th tie at cut_key in rising id order is the last one kept.
    let r = chunk(lid, n);
    var ties = 0u;
    for (var i = r.x; i < r.y; i++) { ties += select(0u, 1u, key_of(work(i)) == cut_key); }
    let before = scan_u32(lid, ties).x;
    if (before < remaining && remaining <= before + ties) {
      var seen = before;
      for (var i = r.x; i < r.y; i++) {
        if (key_of(work(i)) == cut_key) {
          seen += 1u;
          if (seen == remaining) { bc_u = i; break; }
        }
      }
    }
    id_cut = workgroupUniformLoad(&bc_u);
  }
  // Compaction of the survivors in rising id order.
  let r = chunk(lid, n);
  var mine = 0u;
  for (var i = r.x; i < r.y; i++) {
    let k = key_of(work(i));
    mine += select(0u, 1u, k > cut_key || (k == cut_key && i <= id_cut));
  }
  let s = scan_u32(lid, mine);
  var at = s.x;
  for (var i = r.x; i < r.y; i++) {
    let v = work(i);
    let k = key_of(v);
    if (k > cut_key || (k == cut_key && i <= id_cut)) {
      scratch[p.scratch_base + WORK + p.n + 2u * at] = bitcast<u32>(v);
      var id = i;
      if (p.fast != 0u) { id = scratch[p.scratch_base + ids_at() + i]; }
      scratch[p.scratch_base + WORK + p.n + 2u * at + 1u] = id;
      at += 1u;
    }
  }
  if (lid == 0u) { scratch[p.scratch_base + S_COUNT] = s.y; }
}

@compute @workgroup_size(WG)
fn sample_draw(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  p = params_of(wg.y);
  if (lid == 0u) {
    bc_u = scratch[p.scratch_base + S_DONE];
    bc_u2 = scratch[p.scratch_base + S_COUNT];
    bc_f = bitcast<f32>(scratch[p.scratch_base + S_MAX]);
  }
  if (workgroupUniformLoad(&bc_u) != 0u) { return; }
  let count = workgroupUniformLoad(&bc_u2);
  let m = workgroupUniformLoad(&bc_f);
  // top-p: the largest key t_key with sum(w, key >= t_key) >= top_p * sum(w), by bisection between the smallest
  // survivor key (whose sum is the whole mass) and the largest.
  var t_key = 0u;
  if (p.top_p < 1.0) {
    var lo_key = NONE;
    for (var j = lid; j < count; j += WG) { lo_key = min(lo_key, key_of(cand_v(j))); }
    red_u[lid] = lo_key;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half = half / 2u) {
      if (lid < half) { red_u[lid] = min(red_u[lid], red_u[lid + half]); }
      workgroupBarrier();
    }
    if (lid == 0u) { bc_u = red_u[0]; }
    var lo = workgroupUniformLoad(&bc_u);
    var hi = key_of(m);
    var goal = -1.0;  // set by the first pass, which sums every survivor
    var mid = lo;
    loop {
      var sum = 0.0;
      for (var j = lid; j < count; j += WG) {
        let v = cand_v(j);
        if (key_of(v) >= mid) { sum += exp(v - m); }
      }
      red_f[lid] = sum;
      workgroupBarrier();
      for (var half = WG / 2u; half > 0u; half = half / 2u) {
        if (lid < half) { red_f[lid] += red_f[lid + half]; }
        workgroupBarrier();
      }
      if (lid == 0u) { bc_f = red_f[0]; }
      let total = workgroupUniformLoad(&bc_f);
      if (goal < 0.0) {
        goal = p.top_p * total;
      } else if (total >= goal) {
        lo = mid;
      } else {
        hi = mid - 1u;
      }
      if (lo >= hi) { break; }
      mid = lo + (hi - lo + 1u) / 2u;
    }
    t_key = lo;
  }
  // min-p and the temperature; the draw in rising id order.
  let r = chunk(lid, count);
  var own = 0.0;
  for (var j = r.x; j < r.y; j++) {
    let v = cand_v(j);
    if (key_of(v) >= t_key && exp(v - m) >= p.min_p) { own += exp((v - m) / p.temperature); }
  }
  let s = scan_f32(lid, own);
  let goal = p.u * s.y;
  if (lid == 0u) {
    atomicStore(&pick, NONE);
    atomicStore(&last_kept, 0u);
  }
  workgroupBarrier();
  var run = 0.0;
  for (var j = r.x; j < r.y; j++) {
    let v = cand_v(j);
    if (key_of(v) >= t_key && exp(v - m) >= p.min_p) {
      run += exp((v - m) / p.temperature);
      atomicMax(&last_kept, j + 1u);
      if (goal < s.x + run) {
        atomicMin(&pick, j);
        break;
      }
    }
  }
  workgroupBarrier();
  if (lid == 0u) {
    let j = atomicLoad(&pick);
    finish(cand_id(select(atomicLoad(&last_kept) - 1u, j, j != NONE)));
  }
}
