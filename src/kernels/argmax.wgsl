// Greedy sampling on the GPU: the index of the largest of n f32 values, written where the next decode step
// reads its token id, so greedy decoding needs no round trip to the host between steps.
//
// Ties go to the lowest index (as std::max_element). Logits that are NaN or infinite mean the forward pass broke
// down: when any value is, the answer is NON_FINITE instead of an index, for the host to report.
// Two passes: argmax_partial reduces each chunk of `chunk` values to one (value, index) pair per workgroup (index
// BAD when the chunk holds a non-finite value); argmax_final (one workgroup) reduces the n_partials pairs and writes
// the index, or NON_FINITE, to out[out_index]. Several rows of n values at once (a batched decode step's logits):
// workgroup_id.y of the first pass and workgroup_id.x of the second is the row, row r's answer goes to
// out[out_index + r].

struct ArgmaxParams {
  n: u32, chunk: u32, n_partials: u32, out_index: u32,
}

@group(0) @binding(0) var<uniform> p: ArgmaxParams;
@group(0) @binding(1) var<storage, read> values: array<f32>;
@group(0) @binding(2) var<storage, read_write> partials: array<vec2<u32>>;  // (bits of the value, index)
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
const BAD: u32 = 0xfffffffeu;         // a partial whose chunk holds a non-finite value
const NON_FINITE: u32 = 0xffffffffu;  // the answer when any value is NaN or infinite (kArgmaxNonFinite)

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> n_bad: atomic<u32>;  // lanes that saw a non-finite value

// NaN and +-inf: every exponent bit set.
fn non_finite(v: f32) -> bool {
  return (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u;
}

// (v, i) beats (bv, bi): larger, or equal with a lower index.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  return v > bv || (v == bv && i < bi);
}

// Tree reduction of every lane's (v, i) over the workgroup; the winner ends in slot 0.
fn reduce_workgroup(lid: u32, v: f32, i: u32) {
  best_v[lid] = v;
  best_i[lid] = i;
  workgroupBarrier();
  for (var half = WG / 2u; half > 0u; half = half / 2u) {
    if (lid < half) {
      let ov = best_v[lid + half];
      let oi = best_i[lid + half];
      if (beats(ov, oi, best_v[lid], best_i[lid])) {
        best_v[lid] = ov;
        best_i[lid] = oi;
      }
    }
    workgroupBarrier();
  }
}

@compute @workgroup_size(WG)
fn argmax_partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  // Cleared by hand: wgpu may skip WGSL's zero-initialisation of workgroup memory (measured on lavapipe: a value
  // left by an earlier dispatch was seen).
  if (lid == 0u) { atomicStore(&n_bad, 0u); }
  workgroupBarrier();
  let row = wid.y * p.n;  // the row's first value
  let begin = wid.x * p.chunk;
  let end = min(p.n, begin + p.chunk);
  var bv = bitcast<f32>(0xff800000u);  // -inf
  var bi = NONE;
  var bad = false;
  for (var i = begin + lid; i < end; i += WG) {
    let v = values[row + i];
    bad = bad || non_finite(v);
    if (beats(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  if (bad) { atomicAdd(&n_bad, 1u); }
  reduce_workgroup(lid, bv, bi);  // its barriers order the atomic before the read below
  if (lid == 0u) {
    partials[wid.y * p.n_partials + wid.x] = select(vec2<u32>(bitcast<u32>(best_v[0]), best_i[0]), vec2<u32>(0u, BAD),
                             atomicLoad(&n_bad) != 0u);
  }
}

@compute @workgroup_size(WG)
fn argmax_final(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  if (lid == 0u) { atomicStore(&n_bad, 0u); }
  workgroupBarrier();
  var bv = bitcast<f32>(0xff800000u);
  var bi = NONE;
  var bad = false;
  for (var k = lid; k < p.n_partials; k += WG) {
    let pair = partials[wid.x * p.n_partials + k];
    bad = bad || pair.y == BAD;
    let v = bitcast<f32>(pair.x);
    if (pair.y != BAD && beats(v, pair.y, bv, bi)) {
      bv = v;
      bi = pair.y;
    }
  }
  if (bad) { atomicAdd(&n_bad, 1u); }
  reduce_workgroup(lid, bv, bi);
  if (lid == 0u) {
    out[p.out_index + wid.x] = select(best_i[0], NON_FINITE, atomicLoad(&n_bad) != 0u);
  }
}
