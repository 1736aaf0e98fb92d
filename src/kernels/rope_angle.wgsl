// The RoPE angle of one frequency at one position, shared by rope.wgsl and the matvec's fused
// RoPE epilogue (matvec.wgsl); each pipeline compiles this file before its kernel file.
//
// Accuracy: angles reach thousands of radians, where an f32 product and sin/cos lose ~1e-3. The
// host passes each frequency in turns (inv_freq / 2pi) split in three f32 parts (upload_rope_table):
// the first two carry 8 significant bits each, so pos * part is exact for pos < 2^16 and so is its
// fractional part; the third is 2^-16 smaller, so its product's rounding is negligible. The angle
// is reduced to [-pi, pi] before sin/cos.

// (cos, sin) of the angle pos * inv_freq, `turn` = (hi, mid, lo, 0) of inv_freq / 2pi.
fn rope_cos_sin(turn: vec4<f32>, pos: u32) -> vec2<f32> {
  let x = f32(pos);
  var r = fract(x * turn.x) + fract(x * turn.y) + x * turn.z;
  r = r - round(r);
  let angle = r * 6.283185307179586;
  return vec2<f32>(cos(angle), sin(angle));
}
