// The one-token RoPE + KV-append epilogue (FLAG_ROPE_KV) of the matrix-vector kernels (matvec.wgsl on GPUs,
// matmul_rows.wgsl on CPU adapters); compiled after matmul_common.wgsl and rope_angle.wgsl.

// FLAG_ROPE_KV (decode): the RoPE table (rope_angle.wgsl) and the KV cache pool holding position
// p.pos, whose K row starts at element p.kv_k_off and V row at p.kv_v_off (kv_cache.h).
@group(0) @binding(10) var<storage, read> turns: array<vec4<f32>>;
@group(0) @binding(11) var<storage, read_write> kv: array<u32>;

// The piece row a group reads for its row r. With FLAG_NEOX, the rows of every q and k head within
// rope_dim are read in quads (2i, 2i + 1, 2i + h, 2i + h + 1), h = rope_dim / 2: each quad of a
// group's rows then holds two neox pairs (the host keeps groups of 4 rows and the weight in one
// piece). Otherwise r itself.
fn rope_row(r: u32) -> u32 {
  let g = p.row_begin + r;
  if (!has(FLAG_NEOX) || g >= p.split2) { return r; }
  let d = select(g, g - p.split1, g >= p.split1) % p.head_dim;
  if (d >= p.rope_dim) { return r; }
  let q = d / 4u;
  let j = d % 4u;
  return r - d + select(2u * q + j - 2u + p.rope_dim / 2u, 2u * q + j, j < 2u);
}

// Piece rows r, r + 1 (a pair: r even) of the one token, under FLAG_ROPE_KV. Rows [0, split1) are q,
// [split1, split2) k, [split2, n_out) v, each of heads of head_dim; the first rope_dim dims of every
// q and k head rotate in adjacent pairs (2i, 2i + 1) by the angle of frequency i at p.pos (normal
// RoPE). q goes to y; k and v go into the cache (f16 pairs as one word, or two f32 words).
fn store_rope_kv(r: u32, a: f32, b: f32) {
  let g = p.row_begin + r;
  let bb = bias2(g);
  var v0 = a + bb.x;
  var v1 = b + bb.y;
  let is_v = g >= p.split2;
  let e = select(select(g - p.split1, g, g < p.split1), g - p.split2, is_v);  // element in its output
  let d = e % p.head_dim;
  if (!is_v && d < p.rope_dim) {
    let cs = rope_cos_sin(turns[d / 2u], p.pos);
    let r0 = v0 * cs.x - v1 * cs.y;
    v1 = v0 * cs.y + v1 * cs.x;
    v0 = r0;
  }
  if (g < p.split1) {
    y[p.y_off + g] = v0;
    y[p.y_off + g + 1u] = v1;
    return;
  }
  let at = select(p.kv_k_off, p.kv_v_off, is_v) + e;
  if (p.kv_f16 != 0u) {
    kv[at / 2u] = pack2x16float(vec2<f32>(v0, v1));
  } else {
    kv[at] = bitcast<u32>(v0);
    kv[at + 1u] = bitcast<u32>(v1);
  }
}

// Group rows r .. r + 3 (r a multiple of 4) under FLAG_ROPE_KV | FLAG_NEOX: v holds their dots, read
// through rope_row. Elements e0 .. e3 of their output: (2i, 2i + 1, 2i + h, 2i + h + 1) within
// rope_dim of a q or k head (rotating pairs (e0, e2) by frequency 2i and (e1, e3) by 2i + 1), else 4
// adjacent ones. (e0, e1) and (e2, e3) are adjacent: one f16 word each in the cache.
fn store_rope_kv_neox(r: u32, dots: vec4<f32>) {
  // rows r, r + 1 and r + 2, r + 3 are read as adjacent pairs
  var v = dots + vec4<f32>(bias2(p.row_begin + rope_row(r)), bias2(p.row_begin + rope_row(r + 2u)));
  let g = p.row_begin + r;
  let is_v = g >= p.split2;
  let local = select(select(g - p.split1, g, g < p.split1), g - p.split2, is_v);
  let d = local % p.head_dim;
  let head = local - d;
  var e = vec4<u32>(d, d + 1u, d + 2u, d + 3u);
  if (!is_v && d < p.rope_dim) {
    let i = d / 2u;
    let h = p.rope_dim / 2u;
    e = vec4<u32>(i, i + 1u, i + h, i + h + 1u);
    let c0 = rope_cos_sin(turns[i], p.pos);
    let c1 = rope_cos_sin(turns[i + 1u], p.pos);
    v = vec4<f32>(v.x * c0.x - v.z * c0.y, v.y * c1.x - v.w * c1.y, v.x * c0.y + v.z * c0.x, v.y * c1.y + v.w * c1.x);
  }
  e += vec4<u32>(head);
  if (g < p.split1) {
    y[p.y_off + e.x] = v.x;
    y[p.y_off + e.y] = v.y;
    y[p.y_off + e.z] = v.z;
    y[p.y_off + e.w] = v.w;
    return;
  }
  let base = select(p.kv_k_off, p.kv_v_off, is_v);
  if (p.kv_f16 != 0u) {
    kv[(base + e.x) / 2u] = pack2x16float(v.xy);
    kv[(base + e.z) / 2u] = pack2x16float(v.zw);
  } else {
    kv[base + e.x] = bitcast<u32>(v.x);
    kv[base + e.y] = bitcast<u32>(v.y);
    kv[base + e.z] = bitcast<u32>(v.z);
    kv[base + e.w] = bitcast<u32>(v.w);
  }
}
