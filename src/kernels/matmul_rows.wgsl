// Weight products on CPU adapters (Mesa lavapipe), for any number of tokens; compiled after matmul_common.wgsl
// (the weight layout, the bindings and the epilogues), rope_angle.wgsl and rope_kv_epilogue.wgsl.
//
// lavapipe runs a workgroup on one CPU thread, its invocations 8 (or 16) to a SIMD vector. Every storage load whose
// address is not a compile-time constant becomes a loop over the vector's lanes with a bounds check per 32-bit
// component, some 8 cycles per lane-word, even when all lanes read the same address (PERF.md): the cost of a kernel
// there is the number of (lane, word) pairs it loads, not its bytes. The GPU matvec spreads a row over 8 lanes that
// each load their own x: about 1.1 lane-words per weight. Here each invocation owns 2 RH adjacent rows (lanes = rows)
// and walks all their columns in step with the others, TT tokens at a time:
// - each quant word is loaded by one lane only (Q8_0: one lane-word per 4 weights, plus one scale word per block);
// - x and the RMSNorm weights are loaded once per 8 lanes (lane l loads vec4 l of the block) and shared by
//   subgroupBroadcast (XB), so they cost 1/8 of a lane-word per element for all 8 x 2 RH rows;
// - every sum stays in its invocation, in column order: a token's result does not depend on the tokens beside it
//   (a batch of sequences gets the bits each would get alone), and there is no reduction.
// A workgroup is RW_WG invocations (RW_WG * 2 RH rows) for TT tokens; the grid is p.row_tiles row tiles x token
// tiles. Host constants: RW_WG, RH (row pairs per invocation: 1, or 2 for the neox RoPE quads), RQ = RH / 2, TT, XB,
// XV4 (x bound as vec4 too). Sums live in named registers (acc<row>_<token>), never in an indexed array: lavapipe
// keeps dynamically indexed arrays in memory.

@group(0) @binding(12) var<storage, read> wu: array<u32>;  // the piece again, as words

// The f16 scale of Q8_0 / Q4_0 block i from one word (q_scale reads its vec4: four elements gathered for one; MXFP4's
// scale byte likewise, in load32).
fn scale_word(i: u32) -> f32 { return unpack2x16float(wu[4u * p.scale_off4 + (i >> 1u)])[i & 1u]; }

// The 32 elements of block blk of piece row r, each quant word and scale loaded once (load8 reads a Q8_0 / Q4_0 /
// MXFP4 block's vec4 and scale once per 8 elements, a K-quant's header once per 8 elements and each quant vec4 twice:
// four loads where one does).
struct W32 { a: W8, b: W8, c: W8, d: W8, }
fn load32(r: u32, blk: u32) -> W32 {
  let i = r * p.nb + blk;
  if (WTYPE == T_Q8_0) {
    let va = w[i * 2u];
    let vb = w[i * 2u + 1u];
    let d = scale_word(i);
    return W32(W8(d * i8x4(va.x), d * i8x4(va.y)), W8(d * i8x4(va.z), d * i8x4(va.w)),
               W8(d * i8x4(vb.x), d * i8x4(vb.y)), W8(d * i8x4(vb.z), d * i8x4(vb.w)));
  }
  if (WTYPE == T_Q4_0) {
    let v = w[i];
    let d = scale_word(i);
    return W32(W8(d * nib4(v.x), d * nib4(v.y)), W8(d * nib4(v.z), d * nib4(v.w)),
               W8(d * nib4(v.x >> 4u), d * nib4(v.y >> 4u)), W8(d * nib4(v.z >> 4u), d * nib4(v.w >> 4u)));
  }
  if (WTYPE == T_Q4_1 || WTYPE == T_Q5_0 || WTYPE == T_Q5_1) {  // 5 words (Q5_1 6): [d|m], [qh], 4 quant words, each
                                                                 // loaded once (load8_q45 reads qh for every unit)
    let b = i * select(5u, 6u, WTYPE == T_Q5_1);
    let o = b + select(1u, 2u, WTYPE == T_Q5_1);  // the quants
    let q = vec4<u32>(wu[o], wu[o + 1u], wu[o + 2u], wu[o + 3u]);
    var qh = 0u;
    var dm: vec2<f32>;  // Q5_0: d (in the scale array); the others: d, m
    if (WTYPE != T_Q4_1) { qh = wu[select(b, b + 1u, WTYPE == T_Q5_1)]; }
    if (WTYPE == T_Q5_0) {
      dm = vec2<f32>(scale_word(i), 0.0);
    } else {
      dm = unpack2x16float(wu[b]);
    }
    return W32(q45_unit(q.xy, qh, 0u, dm), q45_unit(q.zw, qh, 1u, dm), q45_unit(q.xy, qh, 2u, dm),
               q45_unit(q.zw, qh, 3u, dm));
  }
  if (WTYPE == T_MXFP4) {
    let v = w[i];
    let d = e8m0_half((wu[4u * p.scale_off4 + (i >> 2u)] >> (8u * (i & 3u))) & 255u);
    return W32(W8(d * mxfp4x4(v.x, 0u), d * mxfp4x4(v.y, 0u)), W8(d * mxfp4x4(v.z, 0u), d * mxfp4x4(v.w, 0u)),
               W8(d * mxfp4x4(v.x, 4u), d * mxfp4x4(v.y, 4u)), W8(d * mxfp4x4(v.z, 4u), d * mxfp4x4(v.w, 4u)));
  }
  if (WTYPE == T_Q4_K || WTYPE == T_Q5_K) {  // block j of super-block sb: header 1 vec4, quants 2 (Q5_K: + qh 2)
    let sb = r * (p.nb >> 3u) + (blk >> 3u);
    let j = blk & 7u;
    let b = (sb * select(36u, 44u, WTYPE == T_Q5_K)) >> 2u;  // in vec4
    let dm = k45_scale_min(w[b], j);
    let q0 = b + select(1u, 3u, WTYPE == T_Q5_K) + 2u * (j >> 1u);
    let va = w[q0];
    let vb = w[q0 + 1u];
    var ma = vec4<u32>(0u);
    var mb = vec4<u32>(0u);
    if (WTYPE == T_Q5_K) {
      ma = w[b + 1u];
      mb = w[b + 2u];
    }
    return W32(k45_unit(va.xy, ma.xy, j, dm), k45_unit(va.zw, ma.zw, j, dm), k45_unit(vb.xy, mb.xy, j, dm),
               k45_unit(vb.zw, mb.zw, j, dm));
  }
  if (WTYPE == T_Q6_K) {  // block j = 4 h + k: low quants 2 vec4, high quants 2, its two scales one word, d one
    let sb = r * (p.nb >> 3u) + (blk >> 3u);
    let j = blk & 7u;
    let h = j >> 2u;
    let k = j & 3u;
    let b = sb * 52u;  // in words
    let la = w[(b + 16u * h + 8u * (k & 1u)) >> 2u];
    let lb = w[((b + 16u * h + 8u * (k & 1u)) >> 2u) + 1u];
    let ha = w[(b + 32u + 8u * h) >> 2u];
    let hb = w[((b + 32u + 8u * h) >> 2u) + 1u];
    let si = 8u * h + 2u * k;  // its scales: bytes si, si + 1 of the 16 at word 48
    let sw = wu[b + 48u + (si >> 2u)] >> (8u * (si & 3u));
    let d = scale_word(sb);
    let d0 = d * f32(bitcast<i32>(sw << 24u) >> 24u);
    let d1 = d * f32(bitcast<i32>((sw >> 8u) << 24u) >> 24u);
    return W32(q6k_unit(la.xy, ha.xy, k, d0), q6k_unit(la.zw, ha.zw, k, d0), q6k_unit(lb.xy, hb.xy, k, d1),
               q6k_unit(lb.zw, hb.zw, k, d1));
  }
  let u = 4u * blk;  // F32, F16, BF16: one or two vec4 per unit, nothing loaded twice (the host keeps other types off)
  return W32(load8(r, u), load8(r, u + 1u), load8(r, u + 2u), load8(r, u + 3u));
}

// x[t][32 blk .. + 32) of the bound activation window. With XB (subgroups of at least 8 lanes, the host checks) lane
// l of each 8 loads vec4 l % 8 and the others take it by broadcast: one load per 8 lanes instead of one per lane.
fn load_x32(t: u32, blk: u32, sl: u32) -> W32 {
  if (XB && XV4) {  // whole blocks, the window 16-byte aligned (the host checks)
    return broadcast8(x4[(p.x_off + t * p.n_in) / 4u + 8u * blk + (sl & 7u)]);
  }
  if (XB) {
    let c = 32u * blk + 4u * (sl & 7u);
    let b = p.x_off + t * p.n_in + c;
    var v = vec4<f32>(0.0);
    if (c + 4u <= p.n_in) {
      v = vec4<f32>(x[b], x[b + 1u], x[b + 2u], x[b + 3u]);
    } else {
      //#unroll! k 4
      if (c + $ku < p.n_in) { v[$k] = x[b + $ku]; }
      //#end
    }
    return broadcast8(v);
  }
  let u = 4u * blk;
  return W32(load_x8(t, u), load_x8(t, u + 1u), load_x8(t, u + 2u), load_x8(t, u + 3u));
}

// The RMSNorm weights of block blk, shared like x with XB (the norm buffer holds n_in rounded up to 8 floats).
fn load_norm32(blk: u32, sl: u32) -> W32 {
  if (XB) { return broadcast8(norm[min(8u * blk + (sl & 7u), (p.n_in + 3u) / 4u - 1u)]); }
  let u = 4u * blk;
  return W32(norm8(u), norm8(u + 1u), norm8(u + 2u), norm8(u + 3u));
}

fn mul32(a: W32, b: W32) -> W32 {
  return W32(W8(a.a.lo * b.a.lo, a.a.hi * b.a.hi), W8(a.b.lo * b.b.lo, a.b.hi * b.b.hi),
             W8(a.c.lo * b.c.lo, a.c.hi * b.c.hi), W8(a.d.lo * b.d.lo, a.d.hi * b.d.hi));
}

fn dot32(a: W32, b: W32) -> f32 {
  return dot(a.a.lo, b.a.lo) + dot(a.a.hi, b.a.hi) + dot(a.b.lo, b.b.lo) + dot(a.b.hi, b.b.hi) +
         dot(a.c.lo, b.c.lo) + dot(a.c.hi, b.c.hi) + dot(a.d.lo, b.d.lo) + dot(a.d.hi, b.d.hi);
}

// The entry point `matmul_rows` (host prelude) passes the lane within the subgroup (0 without subgroups) and
// defines broadcast8(v): lanes 0..7's v, in lane order (only called with XB).
fn rows_main(wid: vec3<u32>, lid: u32, sl: u32) {
  let flat = wid.x + wid.y * p.grid_x;
  let row0 = ((flat % p.row_tiles) * RW_WG + lid) * 2u * RH;
  let t0 = (flat / p.row_tiles) * TT;
  let last_row = p.n_rows - 1u;
  let last_t = p.n_tokens - 1u;
  // Pair h is rows row0 + 2h (a) and row0 + 2h + 1 (b): a SwiGLU (gate, up) or RoPE pair.
  //#unroll! h RH
  let rowa$h = rope_row(min(row0 + 2u * $h, last_row));  // rows past the piece: read, never stored
  let rowb$h = rope_row(min(row0 + 2u * $h + 1u, last_row));
  //#end
  //#unroll! t TT
  let tok$t = min(t0 + $t, last_t);  // tokens past the dispatch: read, never stored
  var ss$t = 0.0;
  //#unroll! h RH
  var acca$h_$t = 0.0;
  var accb$h_$t = 0.0;
  //#end
  //#end
  for (var b = 0u; b < p.nb; b += 1u) {
    // x first (TT x 32 values; with FLAG_NORM its squares summed and the norm weights applied), then each row's
    // block used at once: few values live at a time
    let norm_on = has(FLAG_NORM);
    var g: W32;
    if (norm_on) { g = load_norm32(b, sl); }
    //#unroll! t TT
    var xg$t = load_x32(tok$t, b, sl);
    if (norm_on) {
      ss$t += dot32(xg$t, xg$t);
      xg$t = mul32(xg$t, g);
    }
    //#end
    //#unroll! h RH
    {
      let wa = load32(rowa$h, b);
      //#unroll! t TT
      acca$h_$t += dot32(wa, xg$t);
      //#end
      let wb = load32(rowb$h, b);
      //#unroll! t TT
      accb$h_$t += dot32(wb, xg$t);
      //#end
    }
    //#end
  }
  //#unroll! t TT
  if (t0 + $t < p.n_tokens) {
    var s = 1.0;
    if (has(FLAG_NORM)) { s = inv_rms(ss$t); }
    if (has(FLAG_SWIGLU)) {
      //#unroll! h RH
      if (row0 + 2u * $h < p.n_rows) { store_swiglu(t0 + $t, row0 + 2u * $h, acca$h_$t * s, accb$h_$t * s); }
      //#end
    } else if (has(FLAG_ROPE_KV) && has(FLAG_NEOX)) {
      // the host takes RH = 2 for neox: the invocation's four rows are one quad (rope_row)
      //#unroll! n RQ
      if (row0 < p.n_rows) { store_rope_kv_neox(row0, vec4<f32>(acca0_$t, accb0_$t, acca1_$t, accb1_$t) * s); }
      //#end
    } else if (has(FLAG_ROPE_KV)) {
      //#unroll! h RH
      if (row0 + 2u * $h < p.n_rows) { store_rope_kv(row0 + 2u * $h, acca$h_$t * s, accb$h_$t * s); }
      //#end
    } else {
      //#unroll! h RH
      if (row0 + 2u * $h < p.n_rows) { store_y(t0 + $t, row0 + 2u * $h, acca$h_$t * s); }
      if (row0 + 2u * $h + 1u < p.n_rows) { store_y(t0 + $t, row0 + 2u * $h + 1u, accb$h_$t * s); }
      //#end
    }
  }
  //#end
}
