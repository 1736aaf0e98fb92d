// A decoded token's per-head RMSNorm (times q_norm / k_norm) and RoPE, shared by qk_norm_rope_kv.wgsl and the decode
// attention that takes the new token itself (attention_decode_fresh.wgsl), so that both give the same bits. Compiled
// after rope_angle.wgsl; the including file defines NR_MAX (the longest head) and NR_SLOTS (heads held at once).
//
// Threads 0 .. NR_WG - 1 of a workgroup do the arithmetic; any others only meet the barriers. A head's elements sit
// in a slot of nr_row. Each thread sums the squares of elements lid, lid + NR_WG, ... in that order, the sums meet in
// one fixed tree, and each element pair is normalised and rotated by one thread: the bits depend on nothing else.

const NR_WG: u32 = 128u;
@group(0) @binding(13) var<storage, read> nr_turns: array<vec4<f32>>;  // [rope_dim / 2] (hi, mid, lo, 0)
@group(0) @binding(14) var<storage, read> nr_q_norm: array<f32>;        // [head_dim]
@group(0) @binding(15) var<storage, read> nr_k_norm: array<f32>;        // [head_dim]
var<workgroup> nr_row: array<f32, NR_SLOTS * NR_MAX>;
var<workgroup> nr_red: array<vec4<f32>, NR_WG>;

// Up to four sums of squares at once (one per component), over the workgroup's first NR_WG threads' partial sums;
// every thread gets them. Call from uniform control flow.
fn nr_sums(lid: u32, ss: vec4<f32>) -> vec4<f32> {
  if (lid < NR_WG) { nr_red[lid] = ss; }
  workgroupBarrier();
  for (var s = NR_WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { nr_red[lid] += nr_red[lid + s]; }
    workgroupBarrier();
  }
  return nr_red[0];
}

// A thread's share of one head: up to two element pairs (head_dim <= 4 * NR_WG), values and where they go.
struct NrPairs {
  v: array<f32, 4>,
  at: array<u32, 4>,
  n: u32,
}

// Thread lid's pairs of the head in slot `slot` (hd elements): each element times inv and its weight (weights 0:
// none, 1: q_norm, 2: k_norm); pair j < rope_dim / 2 rotates (2j, 2j + 1) (normal) or (j, j + rope_dim / 2) (neox)
// by frequency j at position pos, the rest, (rope_dim + 2m, rope_dim + 2m + 1), only get the norm. Reads nr_row only:
// the caller stores the pairs (nr_store) between two barriers.
fn nr_pairs(slot: u32, lid: u32, hd: u32, rope_dim: u32, neox: bool, pos: u32, inv: f32, weights: u32) -> NrPairs {
  var r: NrPairs;
  r.n = 0u;
  if (lid >= NR_WG) { return r; }
  let half = rope_dim / 2u;
  let base = slot * NR_MAX;
  for (var j = lid; j < hd / 2u; j += NR_WG) {
    var i0 = half * 2u + 2u * (j - half);
    var i1 = i0 + 1u;
    if (j < half) {
      i0 = select(2u * j, j, neox);
      i1 = select(2u * j + 1u, j + half, neox);
    }
    var w0 = 1.0;
    var w1 = 1.0;
    if (weights == 1u) {
      w0 = nr_q_norm[i0];
      w1 = nr_q_norm[i1];
    } else if (weights == 2u) {
      w0 = nr_k_norm[i0];
      w1 = nr_k_norm[i1];
    }
    var a = nr_row[base + i0] * inv * w0;
    var b = nr_row[base + i1] * inv * w1;
    if (j < half) {
      let cs = rope_cos_sin(nr_turns[j], pos);
      let ra = a * cs.x - b * cs.y;
      b = a * cs.y + b * cs.x;
      a = ra;
    }
    r.v[r.n] = a;
    r.v[r.n + 1u] = b;
    r.at[r.n] = i0;
    r.at[r.n + 1u] = i1;
    r.n += 2u;
  }
  return r;
}

fn nr_store(slot: u32, r: NrPairs) {
  for (var m = 0u; m < r.n; m += 1u) { nr_row[slot * NR_MAX + r.at[m]] = r.v[m]; }
}
