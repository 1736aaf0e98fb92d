// Batched causal prefill attention with f16 arithmetic (shader-f16): the contract of attention_prefill in
// attention.wgsl (read its header: GQA, paged KV pools, sliding window, chunked prefill via start_pos / q_base,
// empty window -> zeros), for an f16 KV cache and head_dim a multiple of 8 * CG.
//
// A workgroup owns BQ rows = (query, head) pairs sharing one kv head (the heads of a GQA group x consecutive
// queries, mapped as in attention.wgsl) and walks the BK-key tiles of their window once. Thread (rg, cg),
// rg < RG = BQ / 4, cg < CG, WG = RG * CG threads, owns
// - in S = Q K^T: rows 4 rg .. 4 rg + 3 x keys cg + CG j (j < TK = BK / CG): 4 x TK scores;
// - in O = P V:   the same 4 rows x dims 8 (cg + CG u) .. + 7 (u < TD8 = head_dim / (8 CG)): 4 x 8 TD8 outputs.
// Q (pre-scaled by scale * log2(e), so the softmax uses exp2), the K and V tiles and the tile of probabilities P
// live in workgroup memory as f16; the products are f16 multiply-adds on vec4<f16> (two f16 lanes per instruction
// on GPUs that pair them). Precision: each score is summed in f16 over QKB 8-dim chunks (at most 16 products per
// f16 lane) and those partial sums are added in f32; each tile's P V is summed in f16 over its BK keys and added
// into f32 outputs; the softmax state (running max m, sum l) is f32. Q and P are rounded to f16 once.
// Relative L2 error against float64 on random inputs: ~2e-3 (f32 arithmetic: ~3e-4, the f16 rounding of K/V).
//
// Per tile (FLOPs 4 * BQ * BK * head_dim: 1 MFLOP at 64 x 32 x 128) a thread issues
// - Q K^T: head_dim / 8 chunks x (4 + TK) 16-byte workgroup loads feeding 16 TK f16x2 multiply-adds;
// - P V: BK keys x (one 8-byte load of 4 probabilities + TD8 16-byte loads of V) feeding 16 TD8 f16x2
//   multiply-adds;
// - the softmax: 4 TK exp2, the row maxima over the CG threads of the row group (subgroup shuffles where a
//   subgroup holds CG lanes, else through workgroup memory), the f16 P tile (TK 8-byte stores), and 32 TD8 f32
//   multiply-adds that rescale O and add the tile's f16 sums.
// At 64 x 32 x 128 (TK = 2, TD8 = 1): 160 loads and 1,024 f16x2 multiply-adds per thread per tile, ~300 other
// instructions: ~70 % of the issue slots multiply-add, one workgroup-memory load per 6.4 of them. Global traffic
// per tile: the K and V tiles once, 2 * BK * head_dim * 2 bytes (16 KiB), i.e. BQ = 64 FLOPs per byte from L2
// (attention.wgsl reads the same, but converts each f16 to f32 and does all arithmetic in f32); each Q row is read
// once per workgroup. Workgroup memory: Q BQ x (head_dim + 8) f16, K BK x (head_dim + 8), V BK x head_dim,
// P BK x BQ f16 and the row exchange BQ x CG f32: 42 KiB at 64 x 32 x 128 (the padding of Q and K rows by one
// 16-byte chunk puts rows 4 apart and 16 consecutive keys in different banks). 3 barriers per tile (4 without
// shuffles). Registers per thread at 64 x 32 x 128: O 32 f32 + 16 of its f16 tile sums, 8 scores (f32 and f16),
// the next K/V chunks 16, operands ~24: ~120.
// Prediction on the H200 (issue-bound: 134 TFLOP/s of f16x2 at ~70 % of the slots, minus barrier and latency
// stalls with two 256-thread workgroups per SM): 45-60 TFLOP/s at (32, 8, 128, 4096, 0), against 16.5 for
// attention.wgsl's f32 kernel.
//
// Indexing: every workgroup array is indexed [thread-dependent][compile-time constant] where the first index
// is invariant across the key loop, so once unrolled (//#unroll) each load is a base register plus an immediate
// offset and the bound clamp of the first index is computed once.
//
// Host prelude: `enable f16;` and the constants BQ, BK, CG, HD8 (head_dim / 8), QKB (chunks per f16 partial sum
// of a score; divides HD8) and those derived from them (below). Needs subgroups (the subgroup_size builtin).
// Barriers stay in the entry point, in uniform control flow.

@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
// 8 f16 (16 bytes): the unit of every load and store below. (naga cannot bitcast u32 words to f16 pairs, so the
// f16 values travel as f16 types throughout.)
struct H8 {
  a: vec4<f16>,
  b: vec4<f16>,
}

alias KvUnit = H8;  // the f16 KV pools, 8 elements per unit

const TQ: u32 = 4u;  // rows per thread (one vec4 of P per key)
// From the host (the //#unroll counts must be literals): RG = BQ / TQ row groups, WG = RG * CG threads,
// TK = BK / CG keys per thread in S, TD8 = HD8 / CG 8-dim chunks per thread in O (TD16 = 2 * TD8), NQB = HD8 / QKB
// f16 partial sums per score, NS = TQ * TK scores and NO = TQ * TD16 vec4 outputs ([row][chunk][half]) per thread,
// NLQ / NLK = ceil(BQ * HD8 / WG) / ceil(BK * HD8 / WG) Q / K (and V) chunks each thread stages.
const QP: u32 = HD8 + 1u;  // padded row of the Q and K tiles, in 16-byte chunks
const LOG2E: f32 = 1.4426950408889634;

var<workgroup> qs: array<array<H8, QP>, BQ>;            // [row][chunk]
var<workgroup> ks: array<array<H8, QP>, BK>;            // [key][chunk]
var<workgroup> vs: array<array<H8, HD8>, BK>;           // [key][chunk]
var<workgroup> ps: array<array<vec4<f16>, RG>, BK>;     // [key][row group]: P of rows 4 rg .. 4 rg + 3
var<workgroup> red: array<array<vec4<f32>, CG>, RG>;    // without shuffles: each thread's 4 row maxima / sums

// The K/V tile of keys [kb, kb + BK) of kv head kvh into registers, zeros past kv_end: thread tid takes chunks
// tid, tid + WG, ... of the [BK][HD8] tile.
fn fetch_tile(kb: u32, kv_end: u32, kvh: u32, tid: u32,
              pk: ptr<function, array<H8, NLK>>, pv: ptr<function, array<H8, NLK>>) {
  let loc = kv_row(kb, 0u, 8u);  // a tile never straddles a page
  let n_keys = min(BK, kv_end - kb);
  let row8 = p.kv_dim / 8u;
  let tile_base = loc.y + kvh * HD8;
  let v_shift = p.page_size * row8;
  //#unroll! P 4
  if (loc.x == $P) {
    //#unroll r NLK
    {
      let i = tid + $r * WG;
      var kx = H8();
      var vx = H8();
      if (i < BK * HD8 && i / HD8 < n_keys) {
        let e = tile_base + (i / HD8) * row8 + i % HD8;
        kx = pool$P[e];
        vx = pool$P[e + v_shift];
      }
      (*pk)[$r] = kx;
      (*pv)[$r] = vx;
    }
    //#end
  }
  //#end
}

// Max (or sum) of v over the CG lanes of a row group (subgroups of at least CG lanes only).
fn lanes_max(v: f32) -> f32 {
  var x = v;
  if (CG > 1u) { x = max(x, subgroupShuffleXor(x, 1u)); }
  if (CG > 2u) { x = max(x, subgroupShuffleXor(x, 2u)); }
  if (CG > 4u) { x = max(x, subgroupShuffleXor(x, 4u)); }
  if (CG > 8u) { x = max(x, subgroupShuffleXor(x, 8u)); }
  if (CG > 16u) { x = max(x, subgroupShuffleXor(x, 16u)); }
  return x;
}
fn lanes_sum(v: f32) -> f32 {
  var x = v;
  if (CG > 1u) { x += subgroupShuffleXor(x, 1u); }
  if (CG > 2u) { x += subgroupShuffleXor(x, 2u); }
  if (CG > 4u) { x += subgroupShuffleXor(x, 4u); }
  if (CG > 8u) { x += subgroupShuffleXor(x, 8u); }
  if (CG > 16u) { x += subgroupShuffleXor(x, 16u); }
  return x;
}

@compute @workgroup_size(WG)
fn attention_prefill_f16(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(local_invocation_index) tid: u32,
                         @builtin(subgroup_size) sg_size: u32) {
  let group = p.n_heads / p.n_kv_heads;
  let hpw = min(group, BQ);                       // heads per workgroup
  let head_chunks = (group + hpw - 1u) / hpw;
  let qpw = BQ / hpw;                             // queries per workgroup
  let q_blocks = (p.n_queries + qpw - 1u) / qpw;
  let flat = wid.x + wid.y * p.grid_x;
  let qb = q_blocks - 1u - flat % q_blocks;       // longest windows first: less tail imbalance
  let kvh = flat / q_blocks / head_chunks;
  let chunk = (flat / q_blocks) % head_chunks;
  if (kvh >= p.n_kv_heads) { return; }            // grid padding: uniform per workgroup

  let rg = tid / CG;
  let cg = tid % CG;
  // The row maxima and sums over a row group's CG threads: subgroup shuffles where a subgroup holds whole row
  // groups (lanes rg * CG .. rg * CG + CG - 1), else through workgroup memory (a barrier each). The same for all
  // invocations of the dispatch, so the branches below stay uniform.
  let shuffle = sg_size >= CG;
  // The workgroup's longest window is its last query's: the loop bound is uniform; its first query's window
  // starts lowest: the tiles below it are skipped.
  let last_q = min(qb * qpw + qpw, p.n_queries) - 1u;
  let kv_end = min(p.start_pos + p.q_base + last_q + 1u, p.max_seq);
  let kv_begin = min(first_key(p.start_pos + p.q_base + qb * qpw) / BK * BK, kv_end);

  // The Q tile as f16, scaled by scale * log2(e); zeros for rows past the queries or the group.
  let q_scale = p.scale * LOG2E;
  //#unroll n NLQ
  {
    let e = tid + $n * WG;
    if (e < BQ * HD8) {
      let row = e / HD8;
      let c = e % HD8;
      let q_local = qb * qpw + row / hpw;
      let head_in_group = chunk * hpw + row % hpw;
      var w = H8();
      if (row < qpw * hpw && q_local < p.n_queries && head_in_group < group) {
        let at = (p.q_offset + q_local * p.q_stride) / 4u + (kvh * group + head_in_group) * (HD8 * 2u) + c * 2u;
        w = H8(vec4<f16>(q[at] * q_scale), vec4<f16>(q[at + 1u] * q_scale));
      }
      qs[row][c] = w;
    }
  }
  //#end

  // Per row: the end of its window (0 for rows that are not there) and its first key; the softmax state.
  var win: array<u32, TQ>;
  var lo: array<u32, TQ>;
  var m: array<f32, TQ>;
  var l: array<f32, TQ>;  // this thread's part of the row sum (its keys), at the row's common max m
  //#unroll i TQ
  {
    let row = rg * TQ + $i;
    let q_local = qb * qpw + row / hpw;
    let row_ok = row < qpw * hpw && q_local < p.n_queries && chunk * hpw + row % hpw < group;
    win[$i] = select(0u, min(p.start_pos + p.q_base + q_local + 1u, p.max_seq), row_ok);
    lo[$i] = first_key(p.start_pos + p.q_base + q_local);
    m[$i] = NEG_BIG;
    l[$i] = 0.0;
  }
  //#end
  var o: array<vec4<f32>, NO>;
  //#unroll a NO
  o[$a] = vec4<f32>(0.0);
  //#end

  // Software pipelining: the next tile's K/V travel into registers while this one is used.
  var pk: array<H8, NLK>;
  var pv: array<H8, NLK>;
  fetch_tile(kv_begin, kv_end, kvh, tid, &pk, &pv);
  for (var kb = kv_begin; kb < kv_end; kb += BK) {
    workgroupBarrier();  // the previous tile's K, V and P are consumed (and, first time round, Q is staged)
    //#unroll n NLK
    {
      let i = tid + $n * WG;
      if (i < BK * HD8) {
        ks[i / HD8][i % HD8] = pk[$n];
        vs[i / HD8][i % HD8] = pv[$n];
      }
    }
    //#end
    workgroupBarrier();
    if (kb + BK < kv_end) { fetch_tile(kb + BK, kv_end, kvh, tid, &pk, &pv); }

    // S: 4 rows x TK keys, f16 products summed per QKB chunks, then in f32.
    var s: array<f32, NS>;
    //#unroll a NS
    s[$a] = 0.0;
    //#end
    //#unroll b NQB
    {
      var acc: array<vec4<f16>, NS>;
      //#unroll a NS
      acc[$a] = vec4<f16>();
      //#end
      //#unroll c QKB
      {
        var qv: array<H8, TQ>;
        var kv: array<H8, TK>;
        //#unroll i TQ
        qv[$i] = qs[rg * TQ + $i][$b * QKB + $c];
        //#end
        //#unroll j TK
        kv[$j] = ks[cg + $j * CG][$b * QKB + $c];
        //#end
        //#unroll i TQ
        //#unroll j TK
        acc[$i * TK + $j] = acc[$i * TK + $j] + qv[$i].a * kv[$j].a + qv[$i].b * kv[$j].b;
        //#end
        //#end
      }
      //#end
      //#unroll a NS
      {
        let h = acc[$a].xy + acc[$a].zw;
        s[$a] += f32(h.x) + f32(h.y);
      }
      //#end
    }
    //#end

    // The row maxima of the tile (keys outside a row's window masked), over the row group's CG threads.
    var tmax: array<f32, TQ>;
    //#unroll i TQ
    {
      var mx = NEG_BIG;
      //#unroll j TK
      {
        let key = kb + cg + $j * CG;
        let x = select(NEG_BIG, s[$i * TK + $j], key >= lo[$i] && key < win[$i]);
        s[$i * TK + $j] = x;
        mx = max(mx, x);
      }
      //#end
      tmax[$i] = mx;
    }
    //#end
    if (shuffle) {
      //#unroll i TQ
      tmax[$i] = lanes_max(tmax[$i]);
      //#end
    } else {
      red[rg][cg] = vec4<f32>(tmax[0], tmax[1], tmax[2], tmax[3]);
      workgroupBarrier();
      var mx = red[rg][0];
      //#unroll g CG
      mx = max(mx, red[rg][$g]);
      //#end
      tmax = array<f32, TQ>(mx.x, mx.y, mx.z, mx.w);
    }

    // P = exp2(s - m_new) (exact zeros where masked), the correction of the old state, P to workgroup memory.
    var corr: array<f32, TQ>;
    //#unroll i TQ
    {
      let m_new = max(m[$i], tmax[$i]);
      let m_use = select(m_new, 0.0, m_new == NEG_BIG);  // no key of the row yet: everything stays 0
      corr[$i] = exp2(m[$i] - m_use);
      m[$i] = m_new;
      var sum = 0.0;
      //#unroll j TK
      {
        s[$i * TK + $j] = exp2(s[$i * TK + $j] - m_use);
        sum += s[$i * TK + $j];
      }
      //#end
      l[$i] = l[$i] * corr[$i] + sum;
    }
    //#end
    //#unroll j TK
    ps[cg + $j * CG][rg] = vec4<f16>(vec4<f32>(s[$j], s[TK + $j], s[2u * TK + $j], s[3u * TK + $j]));
    //#end
    workgroupBarrier();

    // O = O * corr + P V: the tile's products summed in f16, then added in f32.
    var o16: array<vec4<f16>, NO>;
    //#unroll a NO
    o16[$a] = vec4<f16>();
    //#end
    //#unroll k BK
    {
      let pp = ps[$k][rg];
      //#unroll u TD8
      {
        let v = vs[$k][cg + $u * CG];
        //#unroll i TQ
        o16[($i * TD8 + $u) * 2u] = o16[($i * TD8 + $u) * 2u] + pp[$i] * v.a;
        o16[($i * TD8 + $u) * 2u + 1u] = o16[($i * TD8 + $u) * 2u + 1u] + pp[$i] * v.b;
        //#end
      }
      //#end
    }
    //#end
    //#unroll i TQ
    //#unroll a TD16
    o[$i * TD16 + $a] = o[$i * TD16 + $a] * corr[$i] + vec4<f32>(o16[$i * TD16 + $a]);
    //#end
    //#end
  }

  // The row sums over the row group's threads, then out = O / l (0 for an empty window, never NaN).
  var lt: array<f32, TQ>;
  if (shuffle) {
    //#unroll i TQ
    lt[$i] = lanes_sum(l[$i]);
    //#end
  } else {
    red[rg][cg] = vec4<f32>(l[0], l[1], l[2], l[3]);
    workgroupBarrier();
    var sm = vec4<f32>(0.0);
    //#unroll g CG
    sm += red[rg][$g];
    //#end
    lt = array<f32, TQ>(sm.x, sm.y, sm.z, sm.w);
  }
  //#unroll i TQ
  {
    let row = rg * TQ + $i;
    let q_local = qb * qpw + row / hpw;
    let head_in_group = chunk * hpw + row % hpw;
    if (row < qpw * hpw && q_local < p.n_queries && head_in_group < group) {
      let head = kvh * group + head_in_group;
      let lsum = lt[$i] + sink_term_log2(head, m[$i]);
      let inv = select(0.0, 1.0 / lsum, lsum > 0.0);
      let o_row = (p.out_offset + q_local * p.out_stride) / 4u + head * (HD8 * 2u);
      //#unroll u TD8
      {
        let at = o_row + (cg + $u * CG) * 2u;
        out[at] = o[($i * TD8 + $u) * 2u] * inv;
        out[at + 1u] = o[($i * TD8 + $u) * 2u + 1u] * inv;
      }
      //#end
    }
  }
  //#end
}
