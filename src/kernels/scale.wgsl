// In place over n floats: x = x * scale, then, with softcap > 0, x = softcap * tanh(x / softcap).
// gemma: the embedding rows times sqrt(n_embd), and the final logit softcapping.
// (flat index = (wid.x + wid.y * grid_x) * WG + lid).

struct ScaleParams {
  n: u32, grid_x: u32, scale: f32, softcap: f32,
}

@group(0) @binding(0) var<uniform> p: ScaleParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(WG)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.x + wid.y * p.grid_x) * WG + lid;
  if (i < p.n) {
    var v = x[i] * p.scale;
    // tanh is 1 in f32 past |z| = 9.1; clamping keeps implementations that compute it through e^2z finite.
    if (p.softcap > 0.0) { v = p.softcap * tanh(clamp(v / p.softcap, -15.0, 15.0)); }
    x[i] = v;
  }
}
