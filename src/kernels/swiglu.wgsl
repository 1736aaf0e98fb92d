// SwiGLU: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g), over n floats
// (flat index = (wid.x + wid.y * grid_x) * WG + lid). act = 1: GeGLU, gelu_tanh(g) * up[i] with
// gelu_tanh(g) = g (1 + tanh(u)) / 2 = g / (1 + e^(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3). act = 2: gpt-oss's
// clamped SwiGLU, g' = min(g, 7), g' / (1 + e^(-1.702 g')) * (clamp(up[i], -7, 7) + 1). act = 3: the sigmoid gate,
// up[i] / (1 + e^-g).
// With width > 0, up is read in rows of width floats up_stride apart from up_offset: up[(i / width) * up_stride +
// up_offset + i % width] (gemma4's per-layer inputs, one layer's slice of each token's row).

struct SwigluParams {
  n: u32, grid_x: u32, act: u32, width: u32,
  up_stride: u32, up_offset: u32, _pad0: u32, _pad1: u32,
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
    var g = gate[i];
    let j = select(i, (i / max(p.width, 1u)) * p.up_stride + p.up_offset + i % max(p.width, 1u), p.width != 0u);
    var u = up[j];
    // e^-z overflows to inf for z < -88: g / inf = -0, the right limit.
    var z = select(g, 1.5957691216057308 * (g + 0.044715 * g * g * g), p.act == 1u);
    if (p.act == 2u) {
      g = min(g, 7.0);
      u = clamp(u, -7.0, 7.0) + 1.0;
      z = 1.702 * g;
    }
    if (p.act == 3u) {
      z = g;
      g = 1.0;
    }
    out[i] = g / (1.0 + exp(-z)) * u;
  }
}
