// The memory floor for benchmarks: every thread reads SR_LOADS vec4<u32> (16 bytes each, adjacent
// threads adjacent) of `src` and folds them; the result is stored only if it matches an
// impossible value, so the reads cannot be optimised away. `wgllm bench-ops` reports its GB/s
// beside the weight kernels'.

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
