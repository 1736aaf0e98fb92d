// Matrix-vector products (decode); compiled after matmul_common.wgsl, which documents the
// weight layout, the bindings and the epilogues, and rope_angle.wgsl (the fused RoPE epilogue).

// Matrix-vector (decode). A workgroup is MV_G groups of MV_T threads; a group owns MV_R
// adjacent rows (host constants, per adapter). Thread lt of a group reads units lt, lt + MV_T,
// ... of each of its rows (adjacent threads read adjacent 16-byte units: coalesced; MV_R loads
// in flight per step) and keeps MV_R x NT partial dots plus NT partial sums of x^2 (for
// FLAG_NORM). Each x unit is read once per group for all MV_R rows: as two vec4 when XV4.
// The group's partials are summed with subgroup shuffles over min(MV_T, subgroup size) lanes,
// then through workgroup memory. Traffic: the piece's weight bytes once per dispatch, NT tokens.
// The entry point `matvec` (host prelude) passes the subgroup size (1 without subgroups).
const MV_WG: u32 = MV_T * MV_G;
const MV_ROWS: u32 = MV_G * MV_R;
// MV_NV = MV_R * NT + NT (host constant): values per thread, dots [row][token] then x^2 [token].
// MV_SLOTS (host constant): partial sums per group and value left after the shuffles, MV_T / the
// smallest subgroup size possible (4 with subgroups, else 1).
var<workgroup> red: array<f32, MV_NV * MV_G * MV_SLOTS>;

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

fn mv_x8(t: u32, u: u32) -> W8 {
  if (XV4) {
    let i = (p.x_off + t * p.n_in) / 4u + 2u * u;
    return W8(x4[i], x4[i + 1u]);
  }
  return load_x8(t, u);
}

fn matvec_main(wid: vec3<u32>, lid: u32, sg_size: u32) {
  let flat = wid.x + wid.y * p.grid_x;
  let grp = lid / MV_T;
  let lt = lid % MV_T;
  let row0 = flat * MV_ROWS + grp * MV_R;
  let last_row = p.n_rows - 1u;
  //#unroll! j MV_R
  let wrow$j = rope_row(min(row0 + $j, last_row));  // rows past the piece: loaded, never stored
  //#end
  // vals is indexed only inside //#unroll blocks: constant indices keep it in registers on GPUs.
  var vals: array<f32, MV_NV>;
  //#unroll k MV_NV
  vals[$k] = 0.0;
  //#end
  let n_units = p.nb * 4u;
  // Each step covers MV_U units per row (MV_R x MV_U weight loads in flight); units past the row
  // are clamped to its last one and their x zeroed.
  for (var u0 = lt; u0 < n_units; u0 += MV_T * MV_U) {
    //#unroll! k MV_U
    let u$k = min(u0 + $k * MV_T, n_units - 1u);
    //#unroll! j MV_R
    let w$j_$k = load8(wrow$j, u$k);
    //#end
    //#end
    //#unroll! k MV_U
    {
      var g = W8(vec4<f32>(1.0), vec4<f32>(1.0));
      if (has(FLAG_NORM)) { g = norm8(u$k); }
      let live = u0 + $k * MV_T < n_units;
      //#unroll t NT
      {
        var xr = mv_x8($t, u$k);
        if (!live) { xr = W8(vec4<f32>(0.0), vec4<f32>(0.0)); }
        vals[MV_R * NT + $t] += dot(xr.lo, xr.lo) + dot(xr.hi, xr.hi);
        let xv = W8(xr.lo * g.lo, xr.hi * g.hi);
        //#unroll! j MV_R
        vals[$j * NT + $t] += dot(w$j_$k.lo, xv.lo) + dot(w$j_$k.hi, xv.hi);
        //#end
      }
      //#end
    }
    //#end
  }
  // Sum each value over the group's lanes: a butterfly of shuffles within aligned chunks of
  // lanes. When the group fits one subgroup (chunk == MV_T) every lane then holds the sums and
  // lane lt < MV_R * NT finishes value lt (row row0 + lt / NT, token lt % NT) at once; otherwise
  // one slot per chunk goes through workgroup memory (on the H200 that path halved the rate of
  // 256-thread groups; PERF.md).
  let chunk = min(MV_T, sg_size);
  //#unroll k MV_NV
  vals[$k] = mv_lane_sum(vals[$k], chunk);
  //#end
  let j = lt / NT;
  let t = lt % NT;
  var dot_sum = 0.0;
  var up_sum = 0.0;  // the next row's dot: the up half of a SwiGLU pair, the partner of a RoPE pair
  var dot2 = 0.0;    // and the two after it (neox RoPE quads)
  var dot3 = 0.0;
  var ss = 0.0;
  if (chunk == MV_T) {
    if (lt >= MV_R * NT) { return; }
    //#unroll k MV_NV
    if ($k == lt) { dot_sum = vals[$k]; }
    if ($k == lt + NT) { up_sum = vals[$k]; }
    if ($k == lt + 2u * NT) { dot2 = vals[$k]; }
    if ($k == lt + 3u * NT) { dot3 = vals[$k]; }
    if ($k == MV_R * NT + t) { ss = vals[$k]; }
    //#end
  } else {
    //#unroll k MV_NV
    if (lt % chunk == 0u) { red[($k * MV_G + grp) * MV_SLOTS + lt / chunk] = vals[$k]; }
    //#end
    workgroupBarrier();
    if (lt >= MV_R * NT) { return; }
    for (var c = 0u; c < MV_T / chunk; c += 1u) {
      dot_sum += red[(lt * MV_G + grp) * MV_SLOTS + c];
      if (j + 1u < MV_R) { up_sum += red[((lt + NT) * MV_G + grp) * MV_SLOTS + c]; }
      if (j + 3u < MV_R) {
        dot2 += red[((lt + 2u * NT) * MV_G + grp) * MV_SLOTS + c];
        dot3 += red[((lt + 3u * NT) * MV_G + grp) * MV_SLOTS + c];
      }
      ss += red[((MV_R * NT + t) * MV_G + grp) * MV_SLOTS + c];
    }
  }
  let r = row0 + j;
  var scale = 1.0;
  if (has(FLAG_NORM)) { scale = inv_rms(ss); }
  if (r >= p.n_rows) { return; }
  if (has(FLAG_SWIGLU)) {
    if (j % 2u == 0u) { store_swiglu(t, r, dot_sum * scale, up_sum * scale); }
  } else if (has(FLAG_ROPE_KV)) {
    if (has(FLAG_NEOX)) {
      if (j % 4u == 0u) { store_rope_kv_neox(r, vec4<f32>(dot_sum, up_sum, dot2, dot3) * scale); }
    } else if (j % 2u == 0u) {
      store_rope_kv(r, dot_sum * scale, up_sum * scale);
    }
  } else {
    store_y(t, r, dot_sum * scale);
  }
}
