// Memory floors for benchmarks (`wgllm-bench ops` reports their GB/s beside the weight kernels').
// stream_read: every thread reads SR_LOADS vec4<u32> (16 bytes each, adjacent threads adjacent)
// of `src` and folds them; results are stored only if they match an impossible value, so the
// reads cannot be optimised away.

struct StreamParams {
  n_vec4: u32, grid_x: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: StreamParams;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> sink: array<u32>;

const SR_WG: u32 = 256u;
const SR_LOADS: u32 = 4u;

@compute @workgroup_size(SR_WG)
fn stream_read(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let base = (wid.x + wid.y * p.grid_x) * SR_WG * SR_LOADS + lid;
  var acc = vec4<u32>(0u);
  //#unroll! k SR_LOADS
  let v$k = src[min(base + $k * SR_WG, p.n_vec4 - 1u)];
  //#end
  //#unroll! k SR_LOADS
  acc ^= v$k;
  //#end
  if (all(acc == vec4<u32>(0x9E3779B9u, 0x7F4A7C15u, 0x85EBCA6Bu, 0xC2B2AE35u))) { sink[0] = 1u; }
}

// The row kernels below: rows of p._pad0 vec4 units; a workgroup of 128 threads is 4 groups of 32,
// each group reading 4 adjacent rows starting at first_row.
fn first_row(wid: vec3<u32>, lid: u32) -> u32 { return (wid.x + wid.y * p.grid_x) * 16u + (lid / 32u) * 4u; }

// Unit u of row r (rows past the end clamped to the last).
fn row_unit(r: u32, u: u32) -> vec4<u32> {
  let units = p._pad0;
  return src[min(r, p.n_vec4 / units - 1u) * units + u];
}

// The matvec's access pattern without its arithmetic (for comparison with stream_read): rows of
// p._pad0 vec4 units; a workgroup is 4 groups of 32 threads, a group reads 4 adjacent rows, thread
// lt units lt, lt + 32, ... of each.
@compute @workgroup_size(128)
fn stream_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let units = p._pad0;
  let row0 = first_row(wid, lid);
  var acc = vec4<u32>(0u);
  for (var u = lid % 32u; u < units; u += 32u) {
    //#unroll! j 4
    let v$j = row_unit(row0 + $j, u);
    //#end
    acc ^= v0 ^ v1 ^ v2 ^ v3;
  }
  if (all(acc == vec4<u32>(0x9E3779B9u, 0x7F4A7C15u, 0x85EBCA6Bu, 0xC2B2AE35u))) { sink[0] = 1u; }
}

// The same plus the matvec's f16 conversion and multiply-adds (x made up from the unit index, no
// reduction): what the matvec's arithmetic allows.
@compute @workgroup_size(128)
fn stream_rows_math(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let units = p._pad0;
  let row0 = first_row(wid, lid);
  var acc: array<f32, 4>;
  for (var u = lid % 32u; u < units; u += 32u) {
    let xv = vec4<f32>(f32(u), 1.0, 2.0, 3.0);
    //#unroll! j 4
    let v$j = row_unit(row0 + $j, u);
    acc[$j] += dot(vec4<f32>(unpack2x16float(v$j.x), unpack2x16float(v$j.y)), xv) +
               dot(vec4<f32>(unpack2x16float(v$j.z), unpack2x16float(v$j.w)), xv);
    //#end
  }
  if (acc[0] + acc[1] + acc[2] + acc[3] == 1.2345) { sink[0] = 1u; }
}

// A minimal F16 matvec in the same pattern: x from a binding (two vec4 per unit), loads through a
// helper returning eight floats, a shuffle butterfly per row, results stored by the group's lanes.
// What the real kernel (matvec.wgsl) should reach; on the H200 it does not (PERF.md).
@group(0) @binding(3) var<storage, read> xb: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> yb: array<f32>;

struct F8 { lo: vec4<f32>, hi: vec4<f32>, }
fn mini_load(r: u32, u: u32) -> F8 {
  let v = row_unit(r, u);
  return F8(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)), vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
}
@compute @workgroup_size(128)
fn stream_matvec(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let units = p._pad0;
  let row0 = first_row(wid, lid);
  let lt = lid % 32u;
  var acc: array<f32, 4>;
  for (var u = lt; u < units; u += 32u) {
    //#unroll! j 4
    let w$j = mini_load(row0 + $j, u);
    //#end
    let xa = xb[2u * u];
    let xc = xb[2u * u + 1u];
    //#unroll! j 4
    acc[$j] += dot(w$j.lo, xa) + dot(w$j.hi, xc);
    //#end
  }
  //#unroll! j 4
  for (var m = 1u; m < 32u; m <<= 1u) { acc[$j] += subgroupShuffleXor(acc[$j], m); }
  //#end
  var v = 0.0;
  //#unroll! j 4
  if (lt == $j) { v = acc[$j]; }
  //#end
  if (lt < 4u && row0 + lt < p.n_vec4 / units) { yb[row0 + lt] = v; }
}
