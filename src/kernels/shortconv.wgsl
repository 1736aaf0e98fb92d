// LFM2's gated short convolution, between in_proj and out_proj, for n tokens at positions pos .. pos + n - 1 of one
// sequence (E channels, L taps). With bx(q) = B(q) * x(q), the product of in_proj's first and third chunks:
//   y[t][c] = C(t)[c] * sum_k taps[c][k] * bx(pos + t - (L-1) + k)[c]      (tap 0 meets the oldest position)
// where bx of a position before pos comes from the conv state, a ring of R rows holding bx(q) at row q % R, and
// bx(q) = 0 for q < 0. Each token's bx is written to its ring row for the next call. The host keeps
// n + L - 1 <= R, so the rows this dispatch writes (pos .. pos+n-1) are never the rows it reads (pos-L+1 .. pos-1).
// One invocation per (token, channel): flat index i = (wid.x + wid.y * grid_x) * WG + lid, t = i / E, c = i % E.
// The ring starts at element p.ring_base of its binding (a sequence's ring in a pool of several sequences' rings).
// shortconv_rows: a decode step of several sequences, row r one token of its own sequence, at the position and ring
// (in a pool of rings) seqs[r] gives, each row's arithmetic exactly as a call of shortconv for that token alone.

struct ConvParams {
  n: u32, n_embd: u32, taps: u32, pos: u32,
  ring_rows: u32, grid_x: u32, row: u32, ring_base: u32,
}

@group(0) @binding(0) var<uniform> p: ConvParams;
@group(0) @binding(1) var<storage, read> bcx: array<f32>;         // [row + n][3E]: B, C, x
@group(0) @binding(2) var<storage, read> taps: array<f32>;        // [E][L]
@group(0) @binding(3) var<storage, read_write> ring: array<f32>;  // [R][E] from ring_base (rows: the pool)
@group(0) @binding(4) var<storage, read_write> y: array<f32>;     // [row + n][E]

const WG: u32 = 256u;

// Channel c of token t of a call whose tokens start at row `first_row` of bcx and y and at position `pos`, its
// sequence's ring from element `base`.
fn conv_token(first_row: u32, pos: u32, t: u32, c: u32, base: u32) {
  let E = p.n_embd;
  let row = (first_row + t) * 3u * E;
  let bx_t = bcx[row + c] * bcx[row + 2u * E + c];
  // Positions q = pos + t - (L-1) + k as i32 (before position 0 they are zero).
  let first = i32(pos + t) - i32(p.taps - 1u);
  var acc = 0.0;
  for (var k = 0u; k < p.taps; k++) {
    let q = first + i32(k);
    if (q < 0) { continue; }
    var v: f32;
    if (u32(q) >= pos) {  // a token of this call
      let r = (first_row + u32(q) - pos) * 3u * E;
      v = bcx[r + c] * bcx[r + 2u * E + c];
    } else {
      v = ring[base + (u32(q) % p.ring_rows) * E + c];
    }
    acc += taps[c * p.taps + k] * v;
  }
  ring[base + ((pos + t) % p.ring_rows) * E + c] = bx_t;
  y[(first_row + t) * E + c] = bcx[row + E + c] * acc;
}

@compute @workgroup_size(WG)
fn shortconv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.x + wid.y * p.grid_x) * WG + lid;
  let E = p.n_embd;
  if (i >= p.n * E) { return; }
  let t = i / E;
  conv_token(p.row, p.pos, t, i - t * E, p.ring_base);  // rows from p.row on: a decode step of several sequences
}

@group(0) @binding(5) var<storage, read> seqs: array<vec2<u32>>;  // shortconv_rows: [n] (position, ring base)

@compute @workgroup_size(WG)
fn shortconv_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let i = (wid.x + wid.y * p.grid_x) * WG + lid;
  let E = p.n_embd;
  if (i >= p.n * E) { return; }
  let r = i / E;
  let s = seqs[r];
  conv_token(r, s.x, 0u, i - r * E, s.y);
}
