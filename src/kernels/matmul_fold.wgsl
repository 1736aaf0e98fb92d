// The top of batch decode's split products (matmul.wgsl's MM_SPLIT); compiled after matmul_common.wgsl. part holds,
// for each group of lane classes, every output's subtree value [group][token][row] and then every token's subtree
// value of its sum of x^2 [group][token]. An invocation per token and pair of rows adds a value's groups as the lanes'
// tree does above them (pairs of groups up to a chunk of FOLD_LANES groups, the chunks then added in order to 0: the
// unsplit kernel's st[sum]), scales by the norm's 1 / rms and runs the epilogue, so the outputs are the bits the
// unsplit kernel gives. Host constants: MM_GROUPS, FOLD_LANES.
@group(0) @binding(10) var<storage, read_write> part: array<f32>;

// The groups' values part[first + g * stride] through the tree.
fn fold_tree(first: u32, stride: u32) -> f32 {
  var sum = 0.0;
  for (var j = 0u; j < MM_GROUPS; j += FOLD_LANES) {
    var v: array<f32, FOLD_LANES>;
    for (var i = 0u; i < FOLD_LANES; i += 1u) { v[i] = part[first + (j + i) * stride]; }
    for (var m = 1u; m < FOLD_LANES; m <<= 1u) {
      for (var i = 0u; i < FOLD_LANES; i += 2u * m) { v[i] = v[i] + v[i + m]; }
    }
    sum = sum + v[0];
  }
  return sum;
}

@compute @workgroup_size(64)
fn matmul_fold(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let pairs = (p.n_rows + 1u) / 2u;
  let i = (wid.x + wid.y * p.grid_x) * 64u + lid;
  if (i >= p.n_tokens * pairs) { return; }
  let t = i / pairs;
  let r = 2u * (i % pairs);
  let rows = p.n_tokens * p.n_rows;  // a group's values
  var f = 1.0;
  if (has(FLAG_NORM)) { f = inv_rms(fold_tree(MM_GROUPS * rows + t, p.n_tokens)); }
  let a = fold_tree(t * p.n_rows + r, rows) * f;
  if (has(FLAG_SWIGLU)) {  // (n_rows even)
    store_swiglu(t, r, a, fold_tree(t * p.n_rows + r + 1u, rows) * f);
    return;
  }
  store_y(t, r, a);
  if (r + 1u < p.n_rows) { store_y(t, r + 1u, fold_tree(t * p.n_rows + r + 1u, rows) * f); }
}
