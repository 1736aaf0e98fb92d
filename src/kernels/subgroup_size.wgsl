// The subgroup size each invocation of a workgroup of 64 sees: gpu::Context::subgroup_size measures it where the
// adapter reports none of one size (wgpu-native reports 0 for lavapipe's and NVIDIA's).
@group(0) @binding(0) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn subgroup_size(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) sg: u32) { out[lid] = sg; }
