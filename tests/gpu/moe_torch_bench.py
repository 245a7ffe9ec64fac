#!/usr/bin/env python3
"""The routed MoE layer in PyTorch on one GPU: issue 32's side-by-side for moe_cuda_bench.

    python3 tests/gpu/moe_torch_bench.py [--tokens=1,16,128,1024,8192] [--iters=10]

Same shapes, dtype and routing as kernels/moe/moe_cuda_bench.cc (Qwen3-30B-A3B: 128 experts,
top-8, hidden 2048, expert width 768; Mixtral-8x7B: 8 experts, top-2, hidden 4096, width 14336;
bf16 weights and activations; normal router logits, softmax top-k renormalised). The layer is
timed from the router logits to the combined output (the router GEMM excluded, as the C++
bench's `layer` column):

* loop_ms: transformers' per-expert loop (Mixtral / Qwen3-MoE sparse block: one_hot mask, the
  hit experts read back, per expert gather + gate_up + SiLU*up + down + weighted index_add);
* gmm_ms: torch._grouped_mm (when this torch has it): argsort by expert, one grouped GEMM per
  projection over the per-expert offsets, weighted index_add; gmm_err = max |gmm - loop| /
  max |loop|.

TFLOP/s = 2 * T * k * 3 * I * H / time; GB/s = bytes of the active experts' weights / time.
Mean of --iters runs after 3 warm-ups, CUDA events. Prints one table per shape.
"""

import argparse
import sys

import torch
import torch.nn.functional as F

SHAPES = [("Qwen3-30B-A3B", 128, 8, 2048, 768), ("Mixtral-8x7B", 8, 2, 4096, 14336)]


def route(logits, k):
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), ids


def loop_layer(x, logits, gate_up, down, k):
    """transformers' MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock expert loop."""
    num_experts, inter = gate_up.shape[0], down.shape[2]
    weights, ids = route(logits, k)
    weights = weights.to(x.dtype)
    out = torch.zeros_like(x)
    mask = F.one_hot(ids, num_classes=num_experts).permute(2, 1, 0)  # [E, k, T]
    hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit.flatten().tolist():
        j, t = torch.where(mask[e])
        h = x[t] @ gate_up[e].T
        a = F.silu(h[:, :inter]) * h[:, inter:]
        y = (a @ down[e].T) * weights[t, j, None]
        out.index_add_(0, t, y)
    return out


def grouped_layer(x, logits, gate_up_t, down_t, k):
    """torch._grouped_mm over the tokens sorted by expert (gate_up_t [E, H, 2I], down_t [E, I, H])."""
    num_experts, inter = gate_up_t.shape[0], down_t.shape[1]
    weights, ids = route(logits, k)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    offsets = torch.cumsum(torch.bincount(flat, minlength=num_experts), 0, dtype=torch.int32)
    h = torch._grouped_mm(x[token], gate_up_t, offs=offsets)
    a = F.silu(h[:, :inter]) * h[:, inter:]
    y = torch._grouped_mm(a, down_t, offs=offsets)
    y = y * weights.reshape(-1)[order, None].to(x.dtype)
    return torch.zeros_like(x).index_add_(0, token, y)


def time_ms(fn, iters):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def run_shape(name, num_experts, k, hidden, inter, tokens, iters, gen):
    dev, bf = "cuda", torch.bfloat16
    gate_up = (torch.randn(num_experts, 2 * inter, hidden, generator=gen, device=dev) * 0.03).to(bf)
    down = (torch.randn(num_experts, hidden, inter, generator=gen, device=dev) * 0.03).to(bf)
    gate_up_t, down_t = gate_up.transpose(-2, -1), down.transpose(-2, -1)
    have_gmm = hasattr(torch, "_grouped_mm")
    print(f"\n{name}: {num_experts} experts, top-{k}, hidden {hidden}, expert width {inter} (bf16),"
          f" torch {torch.__version__}, _grouped_mm {'yes' if have_gmm else 'no'}")
    print("%6s %6s %9s %8s %8s %9s %8s %8s %9s" % ("tokens", "active", "loop_ms", "loop_TF",
                                                    "loop_GBs", "gmm_ms", "gmm_TF", "gmm_GBs",
                                                    "gmm_err"))
    for t in tokens:
        x = torch.randn(t, hidden, generator=gen, device=dev).to(bf)
        logits = torch.randn(t, num_experts, generator=gen, device=dev)
        active = int(torch.unique(route(logits, k)[1]).numel())
        flops = 2.0 * t * k * 3 * inter * hidden
        weight_bytes = active * 3.0 * inter * hidden * 2
        loop_ms = time_ms(lambda: loop_layer(x, logits, gate_up, down, k), iters)
        row = "%6d %6d %9.4f %8.1f %8.0f" % (t, active, loop_ms, flops / loop_ms / 1e9,
                                             weight_bytes / loop_ms / 1e6)
        if have_gmm:
            try:
                ref = loop_layer(x, logits, gate_up, down, k).float()
                got = grouped_layer(x, logits, gate_up_t, down_t, k).float()
                err = ((got - ref).abs().max() / ref.abs().max()).item()
                gmm_ms = time_ms(lambda: grouped_layer(x, logits, gate_up_t, down_t, k), iters)
                row += " %9.4f %8.1f %8.0f %9.1e" % (gmm_ms, flops / gmm_ms / 1e9,
                                                     weight_bytes / gmm_ms / 1e6, err)
            except (RuntimeError, TypeError) as e:  # an unsupported layout or GPU: say so
                row += "  _grouped_mm failed: %s" % str(e).splitlines()[0][:100]
        print(row, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1,16,128,1024,8192")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU", file=sys.stderr)
        return 1
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    tokens = [int(v) for v in args.tokens.split(",")]
    print(torch.cuda.get_device_name(0))
    with torch.no_grad():
        for shape in SHAPES:
            run_shape(*shape, tokens, args.iters, gen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
