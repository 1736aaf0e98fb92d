// KV append: writes rows [start_pos, start_pos + n_tokens) of one layer's KV cache from f32 k, v
// ([n_tokens][kv_dim]) through the page table (layout: kv_cache.h). One dispatch per pool the
// rows touch; each writes only rows whose physical page lives in pool `pool`. One thread per
// 32-bit word: a pair of f16 elements (pack2x16float; kv_dim even) or one f32.

struct KvAppendParams {
  kv_dim: u32, start_pos: u32, n_tokens: u32, page_size: u32,
  pages_per_pool: u32, pool: u32, is_f16: u32, grid_x: u32,
}

@group(0) @binding(0) var<uniform> p: KvAppendParams;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> page_table: array<u32>;
@group(0) @binding(4) var<storage, read_write> pool: array<u32>;

const WG: u32 = 256u;

@compute @workgroup_size(WG)
fn kv_append(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let words = select(p.kv_dim, p.kv_dim / 2u, p.is_f16 != 0u);  // per row
  let idx = (wid.x + wid.y * p.grid_x) * WG + lid;
  if (idx >= p.n_tokens * words) { return; }
  let t = idx / words;
  let j = idx % words;
  let pos = p.start_pos + t;
  let phys = page_table[pos / p.page_size];
  if (phys / p.pages_per_pool != p.pool) { return; }
  let k_elem = ((phys % p.pages_per_pool) * 2u * p.page_size + pos % p.page_size) * p.kv_dim;
  let v_elem = k_elem + p.page_size * p.kv_dim;
  let src = t * p.kv_dim;
  if (p.is_f16 != 0u) {
    pool[k_elem / 2u + j] = pack2x16float(vec2<f32>(k[src + 2u * j], k[src + 2u * j + 1u]));
    pool[v_elem / 2u + j] = pack2x16float(vec2<f32>(v[src + 2u * j], v[src + 2u * j + 1u]));
  } else {
    pool[k_elem + j] = bitcast<u32>(k[src + j]);
    pool[v_elem + j] = bitcast<u32>(v[src + j]);
  }
}
