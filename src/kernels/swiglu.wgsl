// SwiGLU: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g), over n floats
// (flat index = (wid.x + wid.y * grid_x) * WG + lid).

struct SwigluParams {
  n: u32, grid_x: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: SwigluParams;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(WG)
fn swiglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.x + wid.y * p.grid_x) * WG + lid;
  if (i < p.n) {
    let g = gate[i];
    // e^-g overflows to inf for g < -88: g / inf = -0, the right limit.
    out[i] = g / (1.0 + exp(-g)) * up[i];
  }
}
