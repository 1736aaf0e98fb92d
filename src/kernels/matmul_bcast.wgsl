// Batch decode's float-type products with x broadcast (matmul_bcast.h): y[t] = x[t] W^T for up to BC_NT tokens of a
// pass, each weight element read once per pass.
//
// A lane owns BC_R adjacent rows (a gate/up pair with BC_SWIGLU) and walks their words in step with the other lanes
// of its slice, so every lane reads the same x elements at once (one broadcast load per vec4 and token, not one per
// lane). A workgroup is BC_W slices of BC_L lanes; slice s takes the row's words [s * p.slice, (s + 1) * p.slice):
// each (row, token) sum is an fma chain over its slice's elements in order, then the slices' sums are added as a
// tree over workgroup memory (s + h into s for h = BC_W / 2, ..., 1). Nothing in that order depends on the tokens
// beside a token, BC_NT or BC_U (words a row per step): a token's outputs are the same bits alone or in any batch.
// Tokens past p.n_tokens read the last one and are never stored; rows past p.n_out read the last row.
//
// Host constants (prelude): BC_NT, BC_R, BC_L, BC_W, BC_U, BC_TYPE (0 F32: 4 elements a word; 1 F16, 2 BF16: 8),
// BC_F16_INT (F16 through integer ops), BC_BIAS, BC_ACC (y +=), BC_SWIGLU (act(row 2i) * row 2i+1 into y[i]),
// BC_GELU (the gate's activation gelu_tanh, else silu), BC_SPLIT (rows [0, split1) to y, [split1, split2) to y1,
// the rest to y2), BC_RN = BC_R * BC_NT (the sums a lane keeps: [row][token]), BC_RED (floats of the tree's
// workgroup memory, at least 1).

struct Params {
  n_out: u32,      // rows of the piece
  n_tokens: u32,   // tokens of this pass
  row_words: u32,  // vec4 words a row
  x_stride: u32,   // vec4 of x a token
  t0: u32,         // the pass's first token
  row_begin: u32,  // the piece's first row among the weight's
  slice: u32,      // words a slice (a multiple of BC_U)
  grid_x: u32,
  y_width: u32,    // floats a token of y, y1, y2
  y1_width: u32,
  y2_width: u32,
  split1: u32,
  split2: u32,
  pad0: u32,
  pad1: u32,
  pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> y1: array<f32>;
@group(0) @binding(6) var<storage, read_write> y2: array<f32>;

var<workgroup> red: array<f32, BC_RED>;

// f16 bits to f32 with integer ops and one multiply (exact for finite values, subnormals included).
fn f16_int(h: u32) -> f32 {
  let magnitude = bitcast<f32>((h & 0x7FFFu) << 13u) * 5.192296858534828e33;  // 2^112
  return bitcast<f32>(bitcast<u32>(magnitude) | ((h & 0x8000u) << 16u));
}
fn pair(v: u32) -> vec2<f32> {
  if (BC_TYPE == 2u) { return vec2<f32>(bitcast<f32>(v << 16u), bitcast<f32>(v & 0xFFFF0000u)); }
  if (BC_F16_INT) { return vec2<f32>(f16_int(v & 0xFFFFu), f16_int(v >> 16u)); }
  return unpack2x16float(v);
}
// A word's first (or only, F32) and second four elements.
fn lo4(v: vec4<u32>) -> vec4<f32> {
  if (BC_TYPE == 0u) { return bitcast<vec4<f32>>(v); }
  return vec4<f32>(pair(v.x), pair(v.y));
}
fn hi4(v: vec4<u32>) -> vec4<f32> { return vec4<f32>(pair(v.z), pair(v.w)); }
fn chain4(a: vec4<f32>, b: vec4<f32>, c: f32) -> f32 {
  return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, c))));
}

fn gate_act(a: f32) -> f32 {
  let z = select(a, 1.5957691216057308 * (a + 0.044715 * a * a * a), BC_GELU);
  return a / (1.0 + exp(-z));
}

fn bias_of(g: u32) -> f32 {
  if (BC_BIAS) { return bias[g]; }
  return 0.0;
}

// Output row g (of the whole weight) of token t.
fn store(t: u32, g: u32, v: f32) {
  let b = bias_of(g);
  if (BC_SPLIT) {
    if (g < p.split1) {
      y[t * p.y_width + g] = v + b;
    } else if (g < p.split2) {
      y1[t * p.y1_width + g - p.split1] = v + b;
    } else {
      y2[t * p.y2_width + g - p.split2] = v + b;
    }
    return;
  }
  let i = t * p.y_width + g;
  if (BC_ACC) {
    y[i] = y[i] + (v + b);
  } else {
    y[i] = v + b;
  }
}

@compute @workgroup_size(BC_L * BC_W)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let lane = li % BC_L;
  let s = li / BC_L;
  let r0 = ((wid.x + wid.y * p.grid_x) * BC_L + lane) * BC_R;  // the lane's first row in the piece
  let k0 = s * p.slice;
  let k1 = min(k0 + p.slice, p.row_words);
  // (arrays indexed only inside //#unroll blocks: constants on GPUs, so registers; loops on CPU adapters)
  var wb: array<u32, BC_R>;
  //#unroll j BC_R
  wb[$j] = min(r0 + $j, p.n_out - 1u) * p.row_words;
  //#end
  var xb: array<u32, BC_NT>;
  //#unroll t BC_NT
  xb[$t] = (p.t0 + min($t, p.n_tokens - 1u)) * p.x_stride;
  //#end
  var acc: array<f32, BC_RN>;
  var a: array<vec4<f32>, BC_R>;
  var b: array<vec4<f32>, BC_R>;
  for (var k = k0; k < k1; k += BC_U) {
    //#unroll u BC_U
    {
      let i = k + $u;
      //#unroll j BC_R
      {
        let v = w[wb[$j] + i];
        a[$j] = lo4(v);
        if (BC_TYPE != 0u) { b[$j] = hi4(v); }
      }
      //#end
      //#unroll t BC_NT
      if (BC_TYPE == 0u) {
        let xa = x[xb[$t] + i];
        //#unroll j BC_R
        acc[$j * BC_NT + $t] = chain4(a[$j], xa, acc[$j * BC_NT + $t]);
        //#end
      } else {
        let xa = x[xb[$t] + 2u * i];
        let xc = x[xb[$t] + 2u * i + 1u];
        //#unroll j BC_R
        acc[$j * BC_NT + $t] = chain4(b[$j], xc, chain4(a[$j], xa, acc[$j * BC_NT + $t]));
        //#end
      }
      //#end
    }
    //#end
  }
  // The slices' tree: slice s + h's sums into slice s's, h = BC_W / 2 .. 1 (lane-major: no bank conflicts).
  for (var h = BC_W / 2u; h > 0u; h = h / 2u) {
    if (s >= h && s < 2u * h) {
      //#unroll v BC_RN
      red[((s - h) * BC_RN + $v) * BC_L + lane] = acc[$v];
      //#end
    }
    workgroupBarrier();
    if (s < h) {
      //#unroll v BC_RN
      acc[$v] = acc[$v] + red[(s * BC_RN + $v) * BC_L + lane];
      //#end
    }
    workgroupBarrier();
  }
  if (s != 0u) { return; }
  //#unroll t BC_NT
  if ($t < p.n_tokens) {
    let t = p.t0 + $t;
    if (BC_SWIGLU) {
      //#unroll j BC_R
      if ($j % 2u == 0u && r0 + $j < p.n_out) {
        let g = p.row_begin + r0 + $j;
        let a = acc[$j * BC_NT + $t] + bias_of(g);
        let b = acc[($j + 1u) % BC_R * BC_NT + $t] + bias_of(g + 1u);
        y[t * p.y_width + g / 2u] = gate_act(a) * b;
      }
      //#end
    } else {
      //#unroll j BC_R
      if (r0 + $j < p.n_out) { store(t, p.row_begin + r0 + $j, acc[$j * BC_NT + $t]); }
      //#end
    }
  }
  //#end
}
