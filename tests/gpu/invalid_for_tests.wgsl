// A shader that must fail to compile: the tests check that the error names this file and line 6.
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1)
fn main() {
  let x: f32 = 1.0;
  out[0] = x + undefined_name;
}
