// Greedy sampling on the GPU: the index of the largest of n f32 values, written where the next decode step
// reads its token id, so greedy decoding needs no round trip to the host between steps.
//
// Ties go to the lowest index (as std::max_element); NaN never wins; when no value beats -inf the answer is 0.
// Two passes: argmax_partial reduces each chunk of `chunk` values to one (value, index) pair per workgroup;
// argmax_final (one workgroup) reduces the n_partials pairs and writes the index to out[out_index].

struct ArgmaxParams {
  n: u32, chunk: u32, n_partials: u32, out_index: u32,
}

@group(0) @binding(0) var<uniform> p: ArgmaxParams;
@group(0) @binding(1) var<storage, read> values: array<f32>;
@group(0) @binding(2) var<storage, read_write> partials: array<vec2<u32>>;  // (bits of the value, index)
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// (v, i) beats (bv, bi): larger, or equal with a lower index. NaN compares false: never better.
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
  let begin = wid.x * p.chunk;
  let end = min(p.n, begin + p.chunk);
  var bv = bitcast<f32>(0xff800000u);  // -inf
  var bi = NONE;
  for (var i = begin + lid; i < end; i += WG) {
    let v = values[i];
    if (beats(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  reduce_workgroup(lid, bv, bi);
  if (lid == 0u) {
    partials[wid.x] = vec2<u32>(bitcast<u32>(best_v[0]), best_i[0]);
  }
}

@compute @workgroup_size(WG)
fn argmax_final(@builtin(local_invocation_index) lid: u32) {
  var bv = bitcast<f32>(0xff800000u);
  var bi = NONE;
  for (var k = lid; k < p.n_partials; k += WG) {
    let pair = partials[k];
    let v = bitcast<f32>(pair.x);
    if (beats(v, pair.y, bv, bi)) {
      bv = v;
      bi = pair.y;
    }
  }
  reduce_workgroup(lid, bv, bi);
  if (lid == 0u) {
    out[p.out_index] = select(best_i[0], 0u, best_i[0] == NONE);
  }
}
