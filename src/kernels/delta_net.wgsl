// Gated DeltaNet (qwen35's linear attention) for n tokens at positions pos .. pos + n - 1 of one sequence, in two
// dispatches (three with the chunked rule) after the in-projections. K key heads of DK and H value heads of DV; a
// token's row of qkv holds q (K x DK), k (K x DK), v (H x DV): W = 2 K DK + H DV channels. Value head h reads key
// head h % K.
//
// delta_conv: the causal depthwise convolution of every channel over the last L positions, silu, and q, k
// L2-normalised per head (q also by 1 / sqrt(DK)):
//   c(t)[i] = silu(sum_k taps[i][k] x(pos + t - (L-1) + k)[i])      (tap 0 meets the oldest position)
//   q = c_q / sqrt(|c_q|^2 + eps) / sqrt(DK),  k = c_k / sqrt(|c_k|^2 + eps),  v = c_v
// where x of a position before pos comes from the conv state, a ring of R >= L rows holding x(q) at row q % R
// (x(q) = 0 for q < 0). The rows the next call reads go into the ring: with `store` (n + L - 1 <= R, so the rows
// written are never rows read) each token's own row from here, else the last L - 1 by delta_ring after it. One
// workgroup per (head slot, token): slots 0..K-1 the q heads, K..2K-1 the k heads, 2K.. the v heads; invocation i
// owns channel i of the slot.
//
// delta_rule: the recurrence over the tokens, in order, on each value head's state S [DK][DV] (f32, kept in
// registers for the whole call, read from `state` (zeros instead when `fresh`: a sequence's first tokens) and
// written to `state_out`, another buffer or another range of one, so the state before the call survives it):
//   g = exp(a softplus(alpha + dt_bias)),  b = sigmoid(beta)
//   S = g S;  S += k (b (v - S^T k))^T;  o = S^T q
// The columns of S are independent: a workgroup owns VB columns of one head, KS invocations per column each holding
// KPT = DK / KS rows of it; the two sums over DK (S^T k and S^T q) are each KS partial sums through workgroup memory
// (one barrier per token).
// The per-head output norm and its silu(z) gate run after it (norm.wgsl, swiglu.wgsl).
//
// delta_conv uses bindings 1-4, delta_rule 5-11, the chunked rule (delta_chunk_prep, delta_chunk; below) also 12,
// delta_step 1-11, delta_step_norm also 13-14, their rows entries also 15. The host prepends the shape: const DK, DV,
// VB, KS, KPT, CW, CH: u32 (CW, delta_conv's workgroup, a power of two >= max(DK, DV); CH the chunked rule's tokens
// per chunk).

struct DeltaParams {
  n: u32, k_heads: u32, v_heads: u32, row: u32,
  pos: u32, ring_rows: u32, taps: u32, eps: f32,
  ab_stride: u32, beta_offset: u32, fresh: u32, store: u32,
  norm_eps: f32, ring_base: u32, state_base: u32, out_base: u32,
}

@group(0) @binding(0) var<uniform> p: DeltaParams;

// The call's sequence (take_call: p's) or, in delta_step_rows, the row's (take_row: its entry of `steps`): its
// position and activation row, where its ring and its states before and after the step start in their buffers
// (elements; a pool of several sequences' states holds each at its own), and whether it starts from zeros.
var<private> at_pos: u32 = 0u;
var<private> at_row: u32 = 0u;
var<private> ring_at: u32 = 0u;
var<private> state_at: u32 = 0u;
var<private> out_at: u32 = 0u;
var<private> from_zeros: bool = false;

fn take_call() {
  at_pos = p.pos;
  at_row = p.row;
  ring_at = p.ring_base;
  state_at = p.state_base;
  out_at = p.out_base;
  from_zeros = p.fresh != 0u;
}

// ---- delta_conv
@group(0) @binding(1) var<storage, read> x: array<f32>;           // [row + n][W] the in-projection
@group(0) @binding(2) var<storage, read> taps: array<f32>;        // [W][L]
@group(0) @binding(3) var<storage, read_write> ring: array<f32>;  // [R][W]
@group(0) @binding(4) var<storage, read_write> c: array<f32>;     // [row + n][W] q, k (normalised), v

var<workgroup> sq: array<f32, CW>;

// silu(conv) of channel ch at position pos + t: the taps over x's rows for the call's positions and the ring's
// rows for those before pos (zeros before position 0). delta_conv and delta_step.
fn conv_silu_at(ch: u32, t: u32, W: u32) -> f32 {
  let first = i32(at_pos + t) - i32(p.taps - 1u);
  var acc = 0.0;
  for (var k = 0u; k < p.taps; k++) {
    let q = first + i32(k);
    if (q < 0) { continue; }
    var xv: f32;
    if (u32(q) >= at_pos) {
      xv = x[(at_row + u32(q) - at_pos) * W + ch];
    } else {
      xv = ring[ring_at + (u32(q) % p.ring_rows) * W + ch];
    }
    acc += taps[ch * p.taps + k] * xv;
  }
  return acc / (1.0 + exp(-acc));
}

@compute @workgroup_size(CW)
fn delta_conv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  take_call();
  let K = p.k_heads;
  let W = 2u * K * DK + p.v_heads * DV;
  let slot = wid.x;
  let t = wid.y;
  let qk = slot < 2u * K;
  let dim = select(DV, DK, qk);
  let ch = select(2u * K * DK + (slot - 2u * K) * DV, slot * DK, qk) + lid;
  let live = lid < dim;
  var val = 0.0;
  if (live) {
    val = conv_silu_at(ch, t, W);
    if (p.store == 1u) { ring[ring_at + ((p.pos + t) % p.ring_rows) * W + ch] = x[(p.row + t) * W + ch]; }
  }
  // |c|^2 of the head (q and k slots; the v slots run the same barriers and leave val as it is)
  sq[lid] = val * val;
  workgroupBarrier();
  for (var s = CW / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { sq[lid] += sq[lid + s]; }
    workgroupBarrier();
  }
  if (qk) {
    val /= sqrt(sq[0] + p.eps);
    if (slot < K) { val /= sqrt(f32(DK)); }
  }
  if (live) { c[(p.row + t) * W + ch] = val; }
}

// delta_ring: after delta_conv without `store` (a ring of fewer than n + L - 1 rows, whose rows the chunk's own
// would overwrite while they are read), the x rows of the chunk's last min(n, L - 1) positions into the ring, the
// rows the next call reads. One invocation per (row, channel).
const RING_WG: u32 = 256u;

@compute @workgroup_size(RING_WG)
fn delta_ring(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  take_call();
  let W = 2u * p.k_heads * DK + p.v_heads * DV;
  let kept = min(p.n, p.taps - 1u);
  let i = wid.x * RING_WG + lid;
  if (i >= kept * W) { return; }
  let q = p.pos + p.n - kept + i / W;  // a position of this chunk
  let ch = i % W;
  ring[ring_at + (q % p.ring_rows) * W + ch] = x[(p.row + q - p.pos) * W + ch];
}

// ---- delta_rule
@group(0) @binding(5) var<storage, read> qkv: array<f32>;          // [row + n][W], delta_conv's output
@group(0) @binding(6) var<storage, read> alpha: array<f32>;        // [row + n][ab_stride]: alpha at h
@group(0) @binding(7) var<storage, read> beta: array<f32>;         // [row + n][ab_stride]: beta at beta_offset + h
@group(0) @binding(8) var<storage, read> consts: array<f32>;       // [2H]: dt_bias, then a (= -exp(A_log))
// [H][DK][DV] before the call at state_at (read_write, never written: so that it may be state_out's buffer, a pool)
@group(0) @binding(9) var<storage, read_write> state: array<f32>;
@group(0) @binding(10) var<storage, read_write> o: array<f32>;      // [row + n][H][DV]
@group(0) @binding(11) var<storage, read_write> state_out: array<f32>;  // [H][DK][DV] after it, at out_at

// Column v of value head h's state, the rows j = ks + KS i this invocation holds (zeros where dead, and when `fresh`):
// delta_rule, delta_chunk and delta_step keep it in registers; store_state_column writes it to state_out.
fn state_column(h: u32, v: u32, ks: u32, live: bool) -> array<f32, KPT> {
  var S: array<f32, KPT>;
  for (var i = 0u; i < KPT; i++) {
    let j = ks + KS * i;
    S[i] = select(0.0, state[state_at + (h * DK + j) * DV + v], live && j < DK && !from_zeros);
  }
  return S;
}

fn store_state_column(S: array<f32, KPT>, h: u32, v: u32, ks: u32, live: bool) {
  for (var i = 0u; i < KPT; i++) {
    let j = ks + KS * i;
    if (live && j < DK) { state_out[out_at + (h * DK + j) * DV + v] = S[i]; }
  }
}

// Partial sums of S^T k and S^T q, double-buffered by token parity: one barrier per token. A token's S^T k partials
// are summed right after the barrier that follows their writes; its S^T q partials after the next token's barrier
// (the buffer a token writes is next written two tokens later, past a barrier every reader has reached).
var<workgroup> part_k: array<f32, 2u * VB * KS>;
var<workgroup> part_q: array<f32, 2u * VB * KS>;

@compute @workgroup_size(VB * KS)
fn delta_rule(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  take_call();
  let K = p.k_heads;
  let H = p.v_heads;
  let W = 2u * K * DK + H * DV;
  let blocks = (DV + VB - 1u) / VB;
  let h = wid.x / blocks;
  let vl = lid % VB;
  let v = (wid.x % blocks) * VB + vl;
  let ks = lid / VB;
  let kh = h % K;
  let live = v < DV;
  var S = state_column(h, v, ks, live);
  let dt = consts[h];
  let a = consts[H + h];
  // The token's inputs (this invocation's rows of k and q, its v, the gates' logits), loaded a token ahead.
  var kr: array<f32, KPT>;
  var qr: array<f32, KPT>;
  var vv: f32;
  var xa: f32;
  var xb: f32;
  var nk: array<f32, KPT>;
  var nq: array<f32, KPT>;
  var nv = 0.0;
  var na = 0.0;
  var nb = 0.0;
  {
    let base = p.row * W;
    for (var i = 0u; i < KPT; i++) {
      let j = ks + KS * i;
      kr[i] = select(0.0, qkv[base + K * DK + kh * DK + j], j < DK);
      qr[i] = select(0.0, qkv[base + kh * DK + j], j < DK);
    }
    vv = select(0.0, qkv[base + 2u * K * DK + h * DV + v], live);
    xa = alpha[p.row * p.ab_stride + h];
    xb = beta[p.row * p.ab_stride + p.beta_offset + h];
  }
  for (var t = 0u; t < p.n; t++) {
    let r = p.row + t;
    let buf = (t % 2u) * VB * KS;
    let xd = xa + dt;
    let g = exp(a * select(log(1.0 + exp(xd)), xd, xd > 20.0));
    let b = 1.0 / (1.0 + exp(-xb));
    // S^T k, KS partial sums per column
    var pk = 0.0;
    for (var i = 0u; i < KPT; i++) { pk += S[i] * kr[i]; }
    part_k[buf + lid] = pk;
    if (t + 1u < p.n) {
      let base = (r + 1u) * W;
      for (var i = 0u; i < KPT; i++) {
        let j = ks + KS * i;
        nk[i] = select(0.0, qkv[base + K * DK + kh * DK + j], j < DK);
        nq[i] = select(0.0, qkv[base + kh * DK + j], j < DK);
      }
      nv = select(0.0, qkv[base + 2u * K * DK + h * DV + v], live);
      na = alpha[(r + 1u) * p.ab_stride + h];
      nb = beta[(r + 1u) * p.ab_stride + p.beta_offset + h];
    }
    workgroupBarrier();
    if (t > 0u && ks == 0u && live) {  // the previous token's output, its partials complete
      let prev = VB * KS - buf;
      var acc = 0.0;
      for (var s = 0u; s < KS; s++) { acc += part_q[prev + s * VB + vl]; }
      o[((r - 1u) * H + h) * DV + v] = acc;
    }
    var kv = 0.0;
    for (var s = 0u; s < KS; s++) { kv += part_k[buf + s * VB + vl]; }
    let delta = b * (vv - g * kv);
    var pq = 0.0;
    for (var i = 0u; i < KPT; i++) {
      S[i] = g * S[i] + kr[i] * delta;
      pq += S[i] * qr[i];
    }
    part_q[buf + lid] = pq;
    kr = nk;
    qr = nq;
    vv = nv;
    xa = na;
    xb = nb;
  }
  workgroupBarrier();
  if (ks == 0u && live) {
    let last = ((p.n - 1u) % 2u) * VB * KS;
    var acc = 0.0;
    for (var s = 0u; s < KS; s++) { acc += part_q[last + s * VB + vl]; }
    o[((p.row + p.n - 1u) * H + h) * DV + v] = acc;
  }
  store_state_column(S, h, v, ks, live);
}

// ---- delta_chunk_prep, delta_chunk: delta_rule's recurrence CH tokens at a time (the same results; the host picks
// it for longer calls). Within a chunk of C <= CH tokens, with S0 the state before it, G_i = sum_{m <= i} log g_m:
//   A_ij = b_i e^(G_i - G_j) k_i.k_j (j < i),  T = (I + A)^-1 (unit lower triangular, forward substitution)
//   U = T Y,  Y_i = b_i (v_i - e^(G_i) S0^T k_i)
//   o_i = e^(G_i) S0^T q_i + sum_{j <= i} M_ij u_j,  M_ij = e^(G_i - G_j) q_i.k_j (j <= i)
//   S = e^(G_C) S0 + sum_j e^(G_C - G_j) k_j u_j^T
// (cpu::delta_rule_chunked, the same in double). Every factor e^(G_i - G_j), j <= i, is at most 1.
// delta_chunk_prep: T and M of every (value head, chunk) into tm, all chunks at once (they need no state): a
// workgroup of CH x CH invocations per (head, chunk), each summing one pair's k_i.k_j and q_i.k_j over the chunk's
// rows staged through workgroup memory DB dimensions at a time (read coalesced; rows padded against bank
// conflicts), then CH of them solving T's columns.
// delta_chunk: the recurrence over the chunks, in order. A workgroup owns VB columns of one value head as in
// delta_rule (KS invocations per column, KPT rows each, S in registers); per chunk S0's columns go to workgroup
// memory and the rows staged the same way feed S0^T k and S0^T q (one (token, column) per invocation), then Y, U, the
// outputs and the state. 2 DK / DB + 5 barriers per chunk (13 at DK 128) where delta_rule has one per token.
// The host prepends CH and sizes both workgroups to CH x CH = VB x KS invocations, CH x VB at most that.
const DB: u32 = 32u;
const RS: u32 = DB + 1u;  // a staged row's stride
@group(0) @binding(12) var<storage, read_write> tm: array<f32>;  // [H][chunks][2][CH][CH]: T, then M

var<workgroup> ch_s: array<f32, DK * VB>;       // S0 [DK][VB]
var<workgroup> ch_kq: array<f32, 2u * CH * RS>;  // k, then q: [CH][RS] each, dimensions d0 .. d0 + DB
var<workgroup> ch_p: array<f32, CH * VB>;       // S0^T k_i, then Y
var<workgroup> ch_r: array<f32, CH * VB>;       // S0^T q_i
var<workgroup> ch_u: array<f32, CH * VB>;       // U
var<workgroup> ch_a: array<f32, CH * CH>;       // A
var<workgroup> ch_t: array<f32, CH * CH>;       // T
var<workgroup> ch_g: array<f32, CH>;            // log g_i, then G_i
var<workgroup> ch_b: array<f32, CH>;            // b_i
var<workgroup> ch_eg: array<f32, CH>;           // e^(G_i)
var<workgroup> ch_el: array<f32, CH>;           // e^(G_C - G_i)

// The chunk's gates (invocations below CH): log g_i and b_i into ch_g, ch_b (zeros past the chunk).
fn chunk_gates(lid: u32, r0: u32, cn: u32, h: u32) {
  if (lid < CH) {
    var lg = 0.0;
    var b = 0.0;
    if (lid < cn) {
      let xd = alpha[(r0 + lid) * p.ab_stride + h] + consts[h];
      lg = consts[p.v_heads + h] * select(log(1.0 + exp(xd)), xd, xd > 20.0);
      b = 1.0 / (1.0 + exp(-beta[(r0 + lid) * p.ab_stride + p.beta_offset + h]));
    }
    ch_g[lid] = lg;
    ch_b[lid] = b;
  }
}

// Dimensions d0 .. d0 + DB of the chunk's k and q rows (key head at k_at, q_at) into ch_kq, zeros past the chunk.
fn stage_kq(lid: u32, d0: u32, r0: u32, cn: u32, W: u32, k_at: u32, q_at: u32) {
  for (var e = lid; e < 2u * CH * DB; e += CH * CH) {
    let i = (e / DB) % CH;
    let d = d0 + e % DB;
    let at = (r0 + min(i, cn - 1u)) * W + select(k_at, q_at, e >= CH * DB) + min(d, DK - 1u);  // in bounds
    ch_kq[(e / (CH * DB)) * CH * RS + i * RS + e % DB] = select(0.0, qkv[at], i < cn && d < DK);
  }
}

// G_i = the prefix sum of ch_g (invocations below CH; read before the caller's next barrier).
fn chunk_prefix(lid: u32) -> f32 {
  var G = 0.0;
  if (lid < CH) {
    for (var m = 0u; m <= lid; m++) { G += ch_g[m]; }
  }
  return G;
}

@compute @workgroup_size(CH * CH)
fn delta_chunk_prep(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let K = p.k_heads;
  let W = 2u * K * DK + p.v_heads * DV;
  let h = wid.x;
  let kh = h % K;
  let c0 = wid.y * CH;
  let cn = min(CH, p.n - c0);
  let r0 = p.row + c0;
  chunk_gates(lid, r0, cn, h);
  let pi = lid / CH;
  let pj = lid % CH;
  var G = 0.0;
  var kk = 0.0;
  var qk = 0.0;
  for (var d0 = 0u; d0 < DK; d0 += DB) {
    workgroupBarrier();  // the previous block read (the first time: the gates written)
    if (d0 == 0u) { G = chunk_prefix(lid); }
    stage_kq(lid, d0, r0, cn, W, K * DK + kh * DK, kh * DK);
    workgroupBarrier();
    for (var d = 0u; d < min(DB, DK - d0); d++) {
      let kj = ch_kq[pj * RS + d];
      kk += ch_kq[pi * RS + d] * kj;
      qk += ch_kq[CH * RS + pi * RS + d] * kj;
    }
  }
  workgroupBarrier();
  if (lid < CH) { ch_g[lid] = G; }
  workgroupBarrier();
  let decay = exp(ch_g[pi] - ch_g[min(pj, pi)]);
  let at = (h * ((p.n + CH - 1u) / CH) + wid.y) * 2u * CH * CH;
  ch_a[lid] = select(0.0, ch_b[pi] * decay * kk, pj < pi);
  tm[at + CH * CH + lid] = select(0.0, decay * qk, pj <= pi);
  workgroupBarrier();
  // T's column j (invocation j): T_jj = 1, T_ij = -sum_{j <= m < i} A_im T_mj
  if (lid < CH) {
    let j = lid;
    for (var i = 0u; i < CH; i++) {
      var t = select(0.0, 1.0, i == j);
      if (i > j) {
        for (var m = j; m < i; m++) { t -= ch_a[i * CH + m] * ch_t[m * CH + j]; }
      }
      ch_t[i * CH + j] = t;
    }
  }
  workgroupBarrier();
  tm[at + lid] = ch_t[lid];
}

@compute @workgroup_size(VB * KS)
fn delta_chunk(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  take_call();
  let K = p.k_heads;
  let H = p.v_heads;
  let W = 2u * K * DK + H * DV;
  let blocks = (DV + VB - 1u) / VB;
  let h = wid.x / blocks;
  let v0 = (wid.x % blocks) * VB;
  let vl = lid % VB;
  let v = v0 + vl;
  let ks = lid / VB;
  let kh = h % K;
  let live = v < DV;
  let q_at = kh * DK;           // a row's q of key head kh
  let k_at = K * DK + kh * DK;  // its k
  let chunks = (p.n + CH - 1u) / CH;
  var S = state_column(h, v, ks, live);
  // invocation lid's (token, column) of the chunk's [CH][VB] arrays (those below CH x VB)
  let ei = lid / VB;
  let ec = lid % VB;
  let mine = lid < CH * VB;
  for (var c = 0u; c < chunks; c++) {
    let c0 = c * CH;
    let cn = min(CH, p.n - c0);
    let r0 = p.row + c0;  // the chunk's first row
    let at = (h * chunks + c) * 2u * CH * CH;  // its T, then M, in tm
    chunk_gates(lid, r0, cn, h);
    for (var i = 0u; i < KPT; i++) {
      let j = ks + KS * i;
      if (j < DK) { ch_s[j * VB + vl] = S[i]; }
    }
    // S0^T k_i and S0^T q_i of (ei, ec); G_i
    var G = 0.0;
    var pk = 0.0;
    var pq = 0.0;
    for (var d0 = 0u; d0 < DK; d0 += DB) {
      workgroupBarrier();  // the previous block read (the first time: the gates and S0 written)
      if (d0 == 0u) { G = chunk_prefix(lid); }
      stage_kq(lid, d0, r0, cn, W, k_at, q_at);
      workgroupBarrier();
      if (mine) {
        for (var d = 0u; d < min(DB, DK - d0); d++) {
          let sv = ch_s[(d0 + d) * VB + ec];
          pk += ch_kq[ei * RS + d] * sv;
          pq += ch_kq[CH * RS + ei * RS + d] * sv;
        }
      }
    }
    workgroupBarrier();
    if (lid < CH) { ch_g[lid] = G; }
    workgroupBarrier();
    let G_last = ch_g[cn - 1u];
    if (lid < CH) {
      ch_eg[lid] = exp(G);
      ch_el[lid] = select(0.0, exp(G_last - G), lid < cn);
    }
    if (mine) {
      let col = v0 + ec;
      let vat = (r0 + min(ei, cn - 1u)) * W + 2u * K * DK + h * DV + min(col, DV - 1u);  // clamped: read in bounds
      ch_p[lid] = ch_b[ei] * (select(0.0, qkv[vat], ei < cn && col < DV) - exp(ch_g[ei]) * pk);
      ch_r[lid] = pq;
    }
    workgroupBarrier();
    if (mine) {  // U = T Y
      var u = 0.0;
      for (var m = 0u; m <= ei; m++) { u += tm[at + ei * CH + m] * ch_p[m * VB + ec]; }
      ch_u[lid] = u;
    }
    workgroupBarrier();
    if (mine && ei < cn && v0 + ec < DV) {
      var acc = ch_eg[ei] * ch_r[lid];
      for (var j = 0u; j <= ei; j++) { acc += tm[at + CH * CH + ei * CH + j] * ch_u[j * VB + ec]; }
      o[((r0 + ei) * H + h) * DV + v0 + ec] = acc;
    }
    let keep = exp(G_last);
    for (var i = 0u; i < KPT; i++) {
      let j = ks + KS * i;
      var acc = keep * S[i];
      if (j < DK) {
        for (var t = 0u; t < cn; t++) { acc += ch_el[t] * qkv[(r0 + t) * W + k_at + j] * ch_u[t * VB + vl]; }
      }
      S[i] = acc;
    }
    workgroupBarrier();  // the chunk's workgroup memory read before the next one's writes
  }
  store_state_column(S, h, v, ks, live);
}

// ---- delta_step: one token (a decode step), delta_conv and delta_rule in one dispatch (delta_rule's grid; the
// bindings of both). Each workgroup convolves its key head's q and k itself (2 DK channels, L2-normalised through
// workgroup memory) and its value columns; the ring rows of the q and k channels are written by the workgroup of
// block 0 of value head kh (the first that reads key head kh), those of v by the columns' own.
// delta_step_norm: the same with the output's per-head norm and gate of qwen35 in the same dispatch, one workgroup
// per value head (VB >= DV; its own prelude): y = o / sqrt(mean_head(o^2) + norm_eps) * norm_w * silu(z), written
// where delta_step writes o (bindings 13 and 14 besides).
// delta_step_rows, delta_step_norm_rows: a decode step of several sequences (continuous batching), row i (workgroups
// (., i)) the token of sequence i at the position, ring and states its entry of `steps` gives (binding 15), x, the
// gates, z and o at row i: each row the bits of delta_step (delta_step_norm) alone.
var<workgroup> qk_row: array<f32, 2u * DK>;  // the token's q then k of key head kh, convolved, before the norm

@group(0) @binding(15) var<storage, read> steps: array<vec4<u32>>;  // [rows] (position, ring, state, state after)

fn take_row(i: u32) {
  let e = steps[i];
  at_pos = e.x;
  at_row = i;
  ring_at = e.y;
  state_at = e.z;
  out_at = e.w;
  from_zeros = e.x == 0u;  // a sequence's first token
}

fn step_columns(wx: u32, lid: u32) {
  let blocks = (DV + VB - 1u) / VB;
  let h = wx / blocks;
  let v = (wx % blocks) * VB + lid % VB;
  let acc = step_column(h, wx % blocks, lid);
  if (lid / VB == 0u && v < DV) { o[(at_row * p.v_heads + h) * DV + v] = acc; }
}

@compute @workgroup_size(VB * KS)
fn delta_step(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  take_call();
  step_columns(wid.x, lid);
}

@compute @workgroup_size(VB * KS)
fn delta_step_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  take_row(wid.y);
  step_columns(wid.x, lid);
}

@group(0) @binding(13) var<storage, read> z: array<f32>;       // [row + 1][H][DV] the output gate
@group(0) @binding(14) var<storage, read> norm_w: array<f32>;  // [DV] the output norm's weights

@compute @workgroup_size(VB * KS)
fn delta_step_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  take_call();
  step_normed(wid.x, lid);
}

@compute @workgroup_size(VB * KS)
fn delta_step_norm_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  take_row(wid.y);
  step_normed(wid.x, lid);
}

fn step_normed(h: u32, lid: u32) {
  let v = lid % VB;
  let writes = lid / VB == 0u && v < DV;
  let acc = step_column(h, 0u, lid);
  // part_k's last reads were before step_column's last barrier
  if (lid < VB) { part_k[lid] = select(0.0, acc * acc, writes); }
  workgroupBarrier();
  for (var s = VB / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { part_k[lid] += part_k[lid + s]; }
    workgroupBarrier();
  }
  if (writes) {
    let i = (at_row * p.v_heads + h) * DV + v;
    let g = z[i];
    o[i] = acc * (1.0 / sqrt(part_k[0] / f32(DV) + p.norm_eps)) * norm_w[v] * (g / (1.0 + exp(-g)));
  }
}

// Row j of the token's q (at 0) or k (at DK) in qk_row, scaled; 0 past DK.
fn qk_scaled(at: u32, j: u32, scale: f32) -> f32 { return select(0.0, qk_row[at + min(j, DK - 1u)] * scale, j < DK); }

// delta_step's body for value head h's column block vb: the state columns updated and stored, S^T q of column
// vb VB + lid % VB returned to the invocations of KS slice 0 (0 to the others and to dead columns).
fn step_column(h: u32, vb: u32, lid: u32) -> f32 {
  let K = p.k_heads;
  let H = p.v_heads;
  let W = 2u * K * DK + H * DV;
  let vl = lid % VB;
  let v = vb * VB + vl;
  let ks = lid / VB;
  let kh = h % K;
  let live = v < DV;
  let owner = h == kh && vb == 0u;  // writes key head kh's q and k ring rows
  // the state's loads first, in flight while the token is convolved and normalised; the gates' likewise
  var S = state_column(h, v, ks, live);
  let a_in = alpha[at_row * p.ab_stride + h];
  let b_in = beta[at_row * p.ab_stride + p.beta_offset + h];
  // q and k of key head kh, convolved; their squared norms, reduced below
  var ssq = 0.0;
  var ssk = 0.0;
  for (var i = lid; i < 2u * DK; i += VB * KS) {
    let ch = select(K * DK + kh * DK + i - DK, kh * DK + i, i < DK);
    let val = conv_silu_at(ch, 0u, W);
    qk_row[i] = val;
    if (i < DK) { ssq += val * val; } else { ssk += val * val; }
    if (owner) { ring[ring_at + (at_pos % p.ring_rows) * W + ch] = x[at_row * W + ch]; }
  }
  let vch = 2u * K * DK + h * DV + v;
  var vv = 0.0;
  if (live) {
    vv = conv_silu_at(vch, 0u, W);
    if (ks == 0u) { ring[ring_at + (at_pos % p.ring_rows) * W + vch] = x[at_row * W + vch]; }
  }
  part_k[lid] = ssq;
  part_q[lid] = ssk;
  workgroupBarrier();
  for (var s = VB * KS / 2u; s > 0u; s >>= 1u) {
    if (lid < s) {
      part_k[lid] += part_k[lid + s];
      part_q[lid] += part_q[lid + s];
    }
    workgroupBarrier();
  }
  let q_scale = 1.0 / sqrt(part_k[0] + p.eps) / sqrt(f32(DK));
  let k_scale = 1.0 / sqrt(part_q[0] + p.eps);
  workgroupBarrier();  // every norm read before part_k, part_q take the partial sums
  let xd = a_in + consts[h];
  let g = exp(consts[H + h] * select(log(1.0 + exp(xd)), xd, xd > 20.0));
  let b = 1.0 / (1.0 + exp(-b_in));
  // k and q rows from qk_row as they are needed (not held: KPT registers each)
  var pk = 0.0;
  for (var i = 0u; i < KPT; i++) { pk += S[i] * qk_scaled(DK, ks + KS * i, k_scale); }
  part_k[lid] = pk;
  workgroupBarrier();
  var kv = 0.0;
  for (var s = 0u; s < KS; s++) { kv += part_k[s * VB + vl]; }
  let delta = b * (vv - g * kv);
  var pq = 0.0;
  for (var i = 0u; i < KPT; i++) {
    S[i] = g * S[i] + qk_scaled(DK, ks + KS * i, k_scale) * delta;
    pq += S[i] * qk_scaled(0u, ks + KS * i, q_scale);
  }
  part_q[lid] = pq;
  workgroupBarrier();
  var acc = 0.0;
  if (ks == 0u && live) {
    for (var s = 0u; s < KS; s++) { acc += part_q[s * VB + vl]; }
  }
  store_state_column(S, h, v, ks, live);
  return acc;
}
