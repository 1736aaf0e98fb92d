// Decode (one token) for models with per-head q/k RMSNorm (qwen3), in one dispatch instead of four:
// each q and k head is RMS-normalised (times q_norm / k_norm), rotated (RoPE, normal or neox, the
// first rope_dim dims; the arithmetic from qk_norm_rope.wgsl, compiled first), q written back in place and k
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
@group(0) @binding(2) var<storage, read_write> q: array<f32>;      // [row + 1][n_head * head_dim]
@group(0) @binding(3) var<storage, read> k: array<f32>;            // [row + 1][n_kv * head_dim]
@group(0) @binding(4) var<storage, read> v: array<f32>;            // [row + 1][n_kv * head_dim]
@group(0) @binding(7) var<storage, read_write> kv: array<u32>;     // the cache pool
// bindings 13-15 (the RoPE table, q_norm, k_norm): qk_norm_rope.wgsl

const WG: u32 = NR_WG;
const NR_MAX: u32 = 512u;  // the longest head
const NR_SLOTS: u32 = 1u;

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
      inv = inverseSqrt(nr_sums(lid, vec4<f32>(ss, 0.0, 0.0, 0.0)).x / f32(hd) + p.eps);
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
    var x: f32;
    if (is_q) {  // (not a select: encode_qk_norm_rope_q binds a placeholder k)
      x = q[q_row + base + i];
    } else {
      x = k[kv_row + base + i];
    }
    nr_row[i] = x;
    ss += x * x;
  }
  let total = nr_sums(lid, vec4<f32>(ss, 0.0, 0.0, 0.0)).x;
  let normed = p.norm != 0u;  // off: RoPE and the append alone (models without q/k norms)
  let inv = select(1.0, inverseSqrt(total / f32(hd) + p.eps), normed);
  let pairs = nr_pairs(0u, lid, hd, p.rope_dim, p.neox != 0u, pos, inv, select(0u, select(2u, 1u, is_q), normed));
  workgroupBarrier();  // every nr_row read above
  nr_store(0u, pairs);
  workgroupBarrier();
  if (is_q) {
    for (var i = lid; i < hd; i += WG) { q[q_row + base + i] = nr_row[i]; }
  } else {
    for (var w = lid; w < hd / 2u; w += WG) {
      store_pair(k_off, base + 2u * w, nr_row[2u * w], nr_row[2u * w + 1u]);
    }
  }
}
