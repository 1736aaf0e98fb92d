// Decode (one token) for models with per-head q/k RMSNorm (qwen3), in one dispatch instead of four:
// each q and k head is RMS-normalised (times q_norm / k_norm), rotated (RoPE, normal or neox, the
// first rope_dim dims; angles from rope_angle.wgsl, compiled first), q written back in place and k
// written into the KV cache; v heads are copied into the cache (with v_norm RMS-normalised first, no gain: Gemma 4).
// One workgroup per head: heads [0, n_head) are q, [n_head, n_head + n_kv) k, the rest v. The cache pool holding
// position pos is bound as `kv`, its K row at element kv_k_off and V row at kv_v_off (kv_cache.h).

struct Params {
  n_head: u32, n_kv: u32, head_dim: u32, rope_dim: u32,
  pos: u32, neox: u32, kv_f16: u32, kv_k_off: u32,
  kv_v_off: u32, eps: f32, norm: u32, row: u32,
  v_norm: u32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> turns: array<vec4<f32>>;  // [rope_dim / 2] (hi, mid, lo, 0)
@group(0) @binding(2) var<storage, read_write> q: array<f32>;      // [row + 1][n_head * head_dim]
@group(0) @binding(3) var<storage, read> k: array<f32>;            // [row + 1][n_kv * head_dim]
@group(0) @binding(4) var<storage, read> v: array<f32>;            // [row + 1][n_kv * head_dim]
@group(0) @binding(5) var<storage, read> q_norm: array<f32>;       // [head_dim]
@group(0) @binding(6) var<storage, read> k_norm: array<f32>;       // [head_dim]
@group(0) @binding(7) var<storage, read_write> kv: array<u32>;     // the cache pool

const WG: u32 = 128u;
const MAX_HEAD_DIM: u32 = 512u;
var<workgroup> row: array<f32, MAX_HEAD_DIM>;  // the head, normalised, then rotated
var<workgroup> red: array<f32, WG>;

// K or V element e (of n_kv * head_dim) pair (e, e + 1) into the cache row starting at element `at`.
fn store_pair(at: u32, e: u32, a: f32, b: f32) {
  if (p.kv_f16 != 0u) {
    kv[(at + e) / 2u] = pack2x16float(vec2<f32>(a, b));
  } else {
    kv[at + e] = bitcast<u32>(a);
    kv[at + e + 1u] = bitcast<u32>(b);
  }
}

@compute @workgroup_size(WG)
fn qk_norm_rope_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  head(wid.x, lid, p.row, p.pos, p.kv_k_off, p.kv_v_off);
}

// Several sequences' tokens at once (continuous batching): workgroup (h, i) does head h of the token in row i, at
// the position and cache offsets rows[i] gives (every sequence's cache a view of the one pool bound as `kv`).
@group(0) @binding(8) var<storage, read> rows: array<vec4<u32>>;  // [n] (pos, k offset, v offset, 0)

@compute @workgroup_size(WG)
fn qk_norm_rope_kv_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let r = rows[wid.y];
  head(wid.x, lid, wid.y, r.x, r.y, r.z);
}

// The sum over the workgroup of each thread's ss (every thread gets it).
fn workgroup_sum(lid: u32, ss: f32) -> f32 {
  red[lid] = ss;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { red[lid] += red[lid + s]; }
    workgroupBarrier();
  }
  return red[0];
}

// Head h of the token in row `tok` of q, k, v at position `pos`; its K and V rows start at elements k_off and v_off
// of the pool. A workgroup's h is uniform, so every barrier below is reached by all of its threads or none.
fn head(h: u32, lid: u32, tok: u32, pos: u32, k_off: u32, v_off: u32) {
  let hd = p.head_dim;
  let is_q = h < p.n_head;
  let kv_row = tok * p.n_kv * hd;  // the token's first element in k and v
  if (h >= p.n_head + p.n_kv) {  // a v head: copied (normalised with v_norm)
    let base = kv_row + (h - p.n_head - p.n_kv) * hd;
    var inv = 1.0;
    if (p.v_norm != 0u) {
      var ss = 0.0;
      for (var i = lid; i < hd; i += WG) { ss += v[base + i] * v[base + i]; }
      inv = inverseSqrt(workgroup_sum(lid, ss) / f32(hd) + p.eps);
    }
    for (var w = lid; w < hd / 2u; w += WG) {
      store_pair(v_off, base - kv_row + 2u * w, v[base + 2u * w] * inv, v[base + 2u * w + 1u] * inv);
    }
    return;
  }
  let base = select(h - p.n_head, h, is_q) * hd;
  let q_row = tok * p.n_head * hd;
  var ss = 0.0;
  for (var i = lid; i < hd; i += WG) {
    let x = select(k[kv_row + base + i], q[q_row + base + i], is_q);
    row[i] = x;
    ss += x * x;
  }
  let total = workgroup_sum(lid, ss);
  let normed = p.norm != 0u;  // off: RoPE and the append alone (models without q/k norms)
  let inv = select(1.0, inverseSqrt(total / f32(hd) + p.eps), normed);
  // Pair j: j < rope_dim / 2 rotates (2j, 2j + 1) (normal) or (j, j + rope_dim / 2) (neox) by frequency j;
  // the rest, (rope_dim + 2m, rope_dim + 2m + 1), only get the norm. Each element belongs to one pair.
  let half = p.rope_dim / 2u;
  var r0: array<f32, 4>;  // this thread's results: up to 2 pairs (head_dim <= 2 * 2 * WG)
  var i0s: array<u32, 4>;
  var n = 0u;
  for (var j = lid; j < hd / 2u; j += WG) {
    var i0 = half * 2u + 2u * (j - half);
    var i1 = i0 + 1u;
    if (j < half) {
      i0 = select(2u * j, j, p.neox != 0u);
      i1 = select(2u * j + 1u, j + half, p.neox != 0u);
    }
    var w0 = 1.0;
    var w1 = 1.0;
    if (normed) {
      w0 = select(k_norm[i0], q_norm[i0], is_q);
      w1 = select(k_norm[i1], q_norm[i1], is_q);
    }
    var a = row[i0] * inv * w0;
    var b = row[i1] * inv * w1;
    if (j < half) {
      let cs = rope_cos_sin(turns[j], pos);
      let ra = a * cs.x - b * cs.y;
      b = a * cs.y + b * cs.x;
      a = ra;
    }
    r0[n] = a;
    r0[n + 1u] = b;
    i0s[n] = i0;
    i0s[n + 1u] = i1;
    n += 2u;
  }
  workgroupBarrier();  // every row[] read above
  for (var m = 0u; m < n; m += 1u) { row[i0s[m]] = r0[m]; }
  workgroupBarrier();
  if (is_q) {
    for (var i = lid; i < hd; i += WG) { q[q_row + base + i] = row[i]; }
  } else {
    for (var w = lid; w < hd / 2u; w += WG) { store_pair(k_off, base + 2u * w, row[2u * w], row[2u * w + 1u]); }
  }
}
