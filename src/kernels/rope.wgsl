// Rotary position embedding, in place on x: [n_tokens][row_stride floats], each row holding
// n_heads heads of head_dim starting at float head_offset, and on x2 ([n_tokens][n_heads2 heads],
// dense; k beside q in one dispatch) when n_heads2 > 0. Token t sits at position
// start_pos + t; the first rope_dim dims of each head rotate in pairs (2i, 2i+1) (normal) or
// (i, i + rope_dim/2) (neox) by angle pos * inv_freq[i] (rope_angle.wgsl, compiled first). One
// thread per (token, head, pair).

struct RopeParams {
  n_tokens: u32, n_heads: u32, head_dim: u32, rope_dim: u32,
  start_pos: u32, neox: u32, row_stride: u32, head_offset: u32,
  grid_x: u32, n_heads2: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: RopeParams;
@group(0) @binding(1) var<storage, read> turns: array<vec4<f32>>;  // [rope_dim / 2] (hi, mid, lo, 0)
@group(0) @binding(3) var<storage, read_write> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> x2: array<f32>;

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let half = p.rope_dim / 2u;
  let heads = p.n_heads + p.n_heads2;
  let idx = (wid.x + wid.y * p.grid_x) * WG + lid;
  if (idx >= p.n_tokens * heads * half) { return; }
  let i = idx % half;
  let h = (idx / half) % heads;
  let t = idx / half / heads;
  let cs = rope_cos_sin(turns[i], p.start_pos + t);
  let c = cs.x;
  let s = cs.y;
  let second = h >= p.n_heads;  // a head of x2
  let base = select(t * p.row_stride + p.head_offset + h * p.head_dim,
                    (t * p.n_heads2 + h - p.n_heads) * p.head_dim, second);
  let i0 = select(base + 2u * i, base + i, p.neox != 0u);
  let i1 = select(base + 2u * i + 1u, base + i + half, p.neox != 0u);
  var x0: f32;
  var x1: f32;
  if (second) {
    x0 = x2[i0];
    x1 = x2[i1];
  } else {
    x0 = x[i0];
    x1 = x[i1];
  }
  let y0 = x0 * c - x1 * s;
  let y1 = x0 * s + x1 * c;
  if (second) {
    x2[i0] = y0;
    x2[i1] = y1;
  } else {
    x[i0] = y0;
    x[i1] = y1;
  }
}
