#!/usr/bin/env python3
"""What the adapter makes of WGSL's packed 4 x 8-bit integer dot products (dot4I8Packed / dot4U8Packed, the
`packed_4x8_integer_dot_product` language feature) beside an f32 vec4 dot in the same loop: T instructions/s and T
multiply-adds/s. naga lowers them to SPIR-V OpSDot / OpUDot where the device has integer dot products and to shifts
and multiplies otherwise; the rate tells which the driver runs.

Runs through wgpu-native as the `wgpu` Python package ships it (the same 29.0.1.1 the engine loads):

    python3 -m venv /tmp/pv && /tmp/pv/bin/pip install wgpu==0.32.0 numpy
    /tmp/pv/bin/python scripts/int_dot_probe.py [WORKGROUPS]

Each invocation runs 8 independent accumulation chains for ITERS steps; WORKGROUPS of 256 (default 2,112: 16 per
SM of an H200). PERF.md, "Packed int8 dot products through wgpu-native", has the H200's figures.
"""
import sys
import time

import numpy as np
import wgpu

ITERS = 4096
CHAINS = 8
WG = 256
GROUPS = int(sys.argv[1]) if len(sys.argv) > 1 else 132 * 16

HEAD = f"""
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
const ITERS: u32 = {ITERS}u;
"""
SRC = {
    "dot4I8Packed": HEAD + """
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  var b = a[gid.x & 1023u];
  var acc0 = 0; var acc1 = 0; var acc2 = 0; var acc3 = 0; var acc4 = 0; var acc5 = 0; var acc6 = 0; var acc7 = 0;
  let w0 = a[0]; let w1 = a[1]; let w2 = a[2]; let w3 = a[3]; let w4 = a[4]; let w5 = a[5]; let w6 = a[6]; let w7 = a[7];
  for (var i = 0u; i < ITERS; i += 1u) {
    acc0 += dot4I8Packed(w0, b); acc1 += dot4I8Packed(w1, b); acc2 += dot4I8Packed(w2, b); acc3 += dot4I8Packed(w3, b);
    acc4 += dot4I8Packed(w4, b); acc5 += dot4I8Packed(w5, b); acc6 += dot4I8Packed(w6, b); acc7 += dot4I8Packed(w7, b);
    b = b ^ u32(acc0 & 1);
  }
  out[gid.x] = u32(acc0 + acc1 + acc2 + acc3 + acc4 + acc5 + acc6 + acc7);
}
""",
    "dot4U8Packed": HEAD + """
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  var b = a[gid.x & 1023u];
  var acc0 = 0u; var acc1 = 0u; var acc2 = 0u; var acc3 = 0u; var acc4 = 0u; var acc5 = 0u; var acc6 = 0u; var acc7 = 0u;
  let w0 = a[0]; let w1 = a[1]; let w2 = a[2]; let w3 = a[3]; let w4 = a[4]; let w5 = a[5]; let w6 = a[6]; let w7 = a[7];
  for (var i = 0u; i < ITERS; i += 1u) {
    acc0 += dot4U8Packed(w0, b); acc1 += dot4U8Packed(w1, b); acc2 += dot4U8Packed(w2, b); acc3 += dot4U8Packed(w3, b);
    acc4 += dot4U8Packed(w4, b); acc5 += dot4U8Packed(w5, b); acc6 += dot4U8Packed(w6, b); acc7 += dot4U8Packed(w7, b);
    b = b ^ (acc0 & 1u);
  }
  out[gid.x] = acc0 + acc1 + acc2 + acc3 + acc4 + acc5 + acc6 + acc7;
}
""",
    "f32 vec4 dot": HEAD + """
fn wv(i: u32) -> vec4<f32> {
  return bitcast<vec4<f32>>((vec4<u32>(a[4u * i], a[4u * i + 1u], a[4u * i + 2u], a[4u * i + 3u]) & vec4<u32>(0x007FFFFFu)) |
                            vec4<u32>(0x3F800000u));
}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  var b = bitcast<vec4<f32>>(vec4<u32>(a[gid.x & 1023u]) & vec4<u32>(0x3F8FFFFFu));
  var acc0 = 0.0; var acc1 = 0.0; var acc2 = 0.0; var acc3 = 0.0; var acc4 = 0.0; var acc5 = 0.0; var acc6 = 0.0; var acc7 = 0.0;
  let w0 = wv(0u); let w1 = wv(1u); let w2 = wv(2u); let w3 = wv(3u); let w4 = wv(4u); let w5 = wv(5u); let w6 = wv(6u);
  let w7 = wv(7u);
  for (var i = 0u; i < ITERS; i += 1u) {
    acc0 += dot(w0, b); acc1 += dot(w1, b); acc2 += dot(w2, b); acc3 += dot(w3, b);
    acc4 += dot(w4, b); acc5 += dot(w5, b); acc6 += dot(w6, b); acc7 += dot(w7, b);
    b.x = b.x + 1e-30 * acc0;
  }
  out[gid.x] = bitcast<u32>(acc0 + acc1 + acc2 + acc3 + acc4 + acc5 + acc6 + acc7);
}
""",
}


def main():
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    print("adapter:", adapter.info.get("device", "?"), adapter.info.get("backend_type", ""))
    device = adapter.request_device_sync()
    n = WG * GROUPS
    rng = np.random.default_rng(1)
    a = device.create_buffer_with_data(data=rng.integers(0, 2**32, 1024, dtype=np.uint32).tobytes(),
                                       usage=wgpu.BufferUsage.STORAGE)
    out = device.create_buffer(size=n * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    for name, src in SRC.items():
        try:
            mod = device.create_shader_module(code=src)
            pipe = device.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})
        except Exception as e:  # noqa: BLE001 (a shader the adapter refuses: say so, go on)
            print(f"{name}: failed: {str(e)[:300]}")
            continue
        bg = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": a}}, {"binding": 1, "resource": {"buffer": out}}])

        def run(reps):
            enc = device.create_command_encoder()
            for _ in range(reps):
                p = enc.begin_compute_pass()
                p.set_pipeline(pipe)
                p.set_bind_group(0, bg)
                p.dispatch_workgroups(GROUPS)
                p.end()
            device.queue.submit([enc.finish()])
            device.queue.read_buffer(out, size=16)

        run(1)
        best = 1e9
        for _ in range(5):
            t = time.perf_counter()
            run(4)
            best = min(best, (time.perf_counter() - t) / 4)
        ops = n * ITERS * CHAINS
        print(f"{name}: {best * 1e3:.3f} ms per dispatch, {ops / best / 1e12:.3f} T instr/s, "
              f"{4 * ops / best / 1e12:.3f} T multiply-adds/s")


if __name__ == "__main__":
    main()
