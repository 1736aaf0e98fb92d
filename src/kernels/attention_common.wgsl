// What every attention kernel shares (attention.wgsl, attention_f16.wgsl, attention_baseline.wgsl; each pipeline
// compiles this file followed by one of them): the parameters, the bindings of the page table and the KV pools
// (array<KvUnit>, the unit each kernel names with an alias), and the page walk.
//
// Contract (checked host-side by encode_attention_prefill / encode_attention_decode in
// attention.cpp; the shaders also clamp so a bad parameter cannot read out of bounds):
// - local query i (0 <= i < n_queries) sits at position P = start_pos + q_base + i and attends
//   keys [first_key(P), min(P + 1, max_seq)): all of them, or with a sliding window W > 0 the last W
//   (P - W, P]; tiles wholly below a workgroup's first key are skipped. Its q row starts at float
//   q_offset + i * q_stride of the q binding (out likewise).
// - GQA: head h reads kv head h / (n_heads / n_kv_heads).
// - KV cache: pages of page_size positions, each page = K rows then V rows ([page_size][kv_dim]
//   each), in up to 4 pool bindings; page_table maps logical -> physical page. Key tiles (BK for
//   prefill, DEC_WG for decode, both dividing 128) never straddle a page: page_size % 128 == 0,
//   or a single page.
// - online softmax, one pass over K/V, no scores buffer; workgroup memory bounded by the tile.
// - an empty window writes zeros, never NaN.

struct AttentionParams {
  n_heads: u32, n_kv_heads: u32, head_dim: u32, kv_dim: u32,
  max_seq: u32, start_pos: u32, n_queries: u32, q_base: u32,
  q_stride: u32, out_stride: u32, page_size: u32, pages_per_pool: u32,
  n_pages: u32, n_pools: u32, scale: f32, n_splits: u32,
  split_len: u32, grid_x: u32, q_offset: u32, out_offset: u32,
  window: u32, per_query: u32, sinks: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: AttentionParams;
@group(0) @binding(3) var<storage, read> page_table: array<u32>;
// Bindings 4-7, pool0 .. pool3 (array<KvUnit>): declared by the host's prelude, read-only, or read-write for the
// decode that appends the new token itself (attention_decode_fresh.wgsl).

const NEG_BIG: f32 = -3.402823e+38;

// Attention sinks (gpt-oss; p.sinks != 0): a learned logit per query head that joins each row's softmax as one more
// key with no value, out = sum_j e^(s_j) v_j / (sum_j e^(s_j) + e^(sink)). The kernels add e^(sink - m) to the
// denominator l of a row whose running maximum is m where they normalise (for a split row, the reduce); an empty
// window (m = NEG_BIG) gets an infinite denominator and so still writes zeros.
@group(0) @binding(10) var<storage, read> sinks: array<f32>;

fn sink_term(head: u32, m: f32) -> f32 {
  if (p.sinks == 0u) { return 0.0; }
  return exp(sinks[head] - m);
}

// The same for a maximum m in log2 units (scores pre-scaled by log2(e)).
fn sink_term_log2(head: u32, m: f32) -> f32 {
  if (p.sinks == 0u) { return 0.0; }
  return exp2(sinks[head] * 1.4426950408889634 - m);
}

// The first key a query at position `pos` sees: 0 without a sliding window, else pos + 1 - window (or 0).
fn first_key(pos: u32) -> u32 {
  return select(0u, pos + 1u - p.window, p.window > 0u && pos + 1u > p.window);
}

// (pool, offset in units of `unit` elements of K[t][0]) for the view whose page table starts at page_base; V[t][0]
// is page_size * kv_dim / unit further. Clamped.
fn kv_row(t: u32, page_base: u32, unit: u32) -> vec2<u32> {
  let page = min(t / p.page_size, p.n_pages - 1u);
  let phys = page_table[page_base + page];
  let pool = min(phys / p.pages_per_pool, p.n_pools - 1u);
  let slot = phys % p.pages_per_pool;
  return vec2<u32>(pool, (slot * 2u * p.page_size + t % p.page_size) * (p.kv_dim / unit));
}
