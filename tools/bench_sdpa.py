#!/usr/bin/env python3
"""PyTorch SDPA (flash backend, f16) on the attention benchmark shapes of `wgllm-bench kernels`.

Shapes are (n_heads, n_kv_heads, head_dim, n_queries, start_pos); FLOPs are counted as wgllm
counts them: 4 * n_heads * head_dim * sum of causal window lengths. Needs a CUDA GPU.
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

SHAPES = [(32, 8, 64, 512, 0), (32, 8, 128, 2048, 0), (14, 14, 64, 512, 512), (32, 8, 128, 1, 8191),
          (32, 8, 128, 4096, 0)]


def flops(h, d, nq, start):
    return 4.0 * h * d * sum(start + i + 1 for i in range(nq))


def bench(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'shape':28} {'backend':10} {'ms':>10} {'TFLOP/s':>10}")
    for h, kvh, d, nq, start in SHAPES:
        seq = start + nq
        q = torch.randn(1, h, nq, d, device="cuda", dtype=torch.float16)
        k = torch.randn(1, kvh, seq, d, device="cuda", dtype=torch.float16)
        v = torch.randn(1, kvh, seq, d, device="cuda", dtype=torch.float16)
        # Flash needs equal head counts: expand the kv heads (GQA) outside the timed region.
        k, v = k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)
        if nq == 1:
            mask_kw = {}
        elif start == 0:
            mask_kw = {"is_causal": True}
        else:
            mask_kw = {"attn_mask": causal_lower_right(nq, seq)}
        for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
            try:
                with sdpa_kernel(backend):
                    ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, **mask_kw))
            except Exception as e:  # a backend may refuse a shape/mask
                print(f"{str((h, kvh, d, nq, start)):28} {name:10} unsupported: {str(e).splitlines()[0][:60]}")
                continue
            tf = flops(h, d, nq, start) / (ms * 1e-3) / 1e12
            print(f"{str((h, kvh, d, nq, start)):28} {name:10} {ms:10.4f} {tf:10.2f}")


if __name__ == "__main__":
    main()
