// The subgroup size each invocation of a workgroup of 64 sees (tests that need an adapter's subgroup size where it
// reports none: wgpu reports 0 for lavapipe's).
@group(0) @binding(0) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn subgroup_size(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) sg: u32) { out[lid] = sg; }
