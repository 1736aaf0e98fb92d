// Element-wise kernels over f32 vectors. The grid is folded (x, y) so any length fits
// the adapter's per-dimension workgroup limit: flat workgroup = wid.x + wid.y * grid_x.

struct ElementwiseParams {
  n: u32,        // element count
  grid_x: u32,   // workgroups along x (for unfolding)
  _pad0: u32,
  _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: ElementwiseParams;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

override WG: u32 = 256u;

// out = a + b (residual add)
@compute @workgroup_size(WG)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.x + wid.y * p.grid_x) * WG + lid;
  if (i < p.n) {
    out[i] = a[i] + b[i];
  }
}
