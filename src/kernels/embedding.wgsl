// The embedding gather; compiled after matmul_common.wgsl, which documents the weight layout and bindings.
//
// Embedding gather: one workgroup per token writes row ids[t] of the table (dequantised) to
// y[t][0 .. n_in). A table split into pieces is gathered by one dispatch per piece; each writes
// the tokens whose id falls in its rows (the last piece also writes zeros for ids past the end).
@compute @workgroup_size(64)
fn embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let t = wid.x + wid.y * p.grid_x;
  if (t >= p.n_tokens) { return; }
  let id = ids[p.x_off + t];
  let in_piece = id >= p.row_begin && id - p.row_begin < p.n_rows;
  let past_end = (p.flags & FLAG_LAST_PIECE) != 0u && id >= p.row_begin + p.n_rows;
  if (!in_piece && !past_end) { return; }
  let r = id - p.row_begin;
  for (var u = lid; u < p.nb * 4u; u += 64u) {
    var v = W8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (in_piece) { v = load8(r, u); }
    let c = u * 8u;
    let o = p.y_off + t * p.n_in + c;
    for (var i = 0u; i < 4u; i += 1u) {
      if (c + i < p.n_in) { y[o + i] = v.lo[i]; }
      if (c + 4u + i < p.n_in) { y[o + 4u + i] = v.hi[i]; }
    }
  }
}
