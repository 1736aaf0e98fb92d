// RMSNorm over rows of `dim` floats: y = x / sqrt(mean(x^2) + eps) * w (w: [dim] f32).
// One workgroup per row (grid folded: row = wid.x + wid.y * grid_x). The same kernel serves the
// model norms (rows = tokens, dim = n_embd) and qwen3's per-head q/k norm (rows = tokens x
// heads, dim = head_dim). With IN_PLACE it reads and writes `y`; with ACCUMULATE it adds the norm to `y` and scales
// the sum by p.scale (gemma's post-attention and post-FFN norms into the residual stream, Gemma 4's layer output
// scale after the layer's last one); with GATED it multiplies the norm by silu(gate) element by element (qwen35's
// DeltaNet output: per value head, gated by z).

struct NormParams {
  n_rows: u32, dim: u32, eps: f32, grid_x: u32,
  scale: f32, _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: NormParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> gate: array<f32>;  // [n_rows][dim] with GATED (else a placeholder)

// 256 invocations, each loading NU elements of a pass before it uses any: a row of 1536 takes 2 passes, not 12
// round trips to memory (a single-row norm is latency, not bandwidth: PERF.md, "Gemma 4 small").
const WG: u32 = 256u;
const NU: u32 = 4u;
var<workgroup> red: array<f32, WG>;

// IN_PLACE: read the row from `y` itself (then `x` is a placeholder binding, never read).
override IN_PLACE: bool = false;
override ACCUMULATE: bool = false;
override GATED: bool = false;

fn src(i: u32) -> f32 {
  if (IN_PLACE) { return y[i]; }
  return x[i];
}

@compute @workgroup_size(WG)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let row = wid.x + wid.y * p.grid_x;
  if (row >= p.n_rows) { return; }  // uniform per workgroup
  let base = row * p.dim;
  let last = p.dim - 1u;
  var ss = 0.0;
  for (var i0 = lid; i0 < p.dim; i0 += WG * NU) {
    var v: array<f32, NU>;
    //#unroll u NU
    v[$u] = src(base + min(i0 + $u * WG, last));
    //#end
    //#unroll u NU
    if (i0 + $u * WG < p.dim) { ss += v[$u] * v[$u]; }
    //#end
  }
  red[lid] = ss;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { red[lid] += red[lid + s]; }
    workgroupBarrier();
  }
  let inv = 1.0 / sqrt(red[0] / f32(p.dim) + p.eps);
  for (var i0 = lid; i0 < p.dim; i0 += WG * NU) {
    var v: array<f32, NU>;
    var g: array<f32, NU>;
    var a: array<f32, NU>;
    //#unroll u NU
    {
      let i = min(i0 + $u * WG, last);
      v[$u] = src(base + i) * inv * w[i];
      if (GATED) { g[$u] = gate[base + i]; }
      if (ACCUMULATE) { a[$u] = y[base + i]; }
    }
    //#end
    //#unroll u NU
    {
      let i = i0 + $u * WG;
      var r = v[$u];
      if (GATED) { r *= g[$u] / (1.0 + exp(-g[$u])); }
      if (ACCUMULATE) { r = (a[$u] + r) * p.scale; }
      if (i < p.dim) { y[base + i] = r; }
    }
    //#end
  }
}
