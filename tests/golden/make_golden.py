#!/usr/bin/env python3
"""Makes the golden fixtures: tiny random-weight Llama/Qwen2 models and transformers' outputs.

Each variant becomes OUT/<name>/ with the Hugging Face files (config.json, model.safetensors,
generation_config.json) and expected.json (prompts, last-prompt logits, 16 greedy tokens).
Needs PyTorch and transformers; runs everything on the CPU so that f32 is exact IEEE f32 (no TF32).

  python3 tests/golden/make_golden.py --out DIR [--tar FILE.tar.gz]

Deterministic: fixed seeds, one CPU thread, deterministic algorithms, eager attention. Exits
non-zero when a sanity check fails (reload mismatch, independent fp64 reference disagreeing,
degenerate greedy output). See README.md beside this file.
"""

import argparse
import copy
import json
import math
import os
import random
import shutil
import sys
import tarfile

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

SEED = 20240611
MAX_NEW_TOKENS = 16
PROMPT_LENGTHS = [1, 3, 7, 16, 17, 33, 50, 64]
PREFIX_LEN = 32
PREFIX_SUFFIX_LENGTHS = [8, 13]  # the pair: 32 shared tokens, then 8 resp. 13 different ones
INIT_STD = 0.15  # linear weights; written to config.json as initializer_range
EMBED_STD = 0.25  # larger makes tied models repeat the last token (logits ~ E . h, h ~ E[x])
BIAS_STD = 0.2
NORM_STD = 0.2  # RMSNorm weights are 1 + N(0, NORM_STD) so that a missing norm weight shows

COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    initializer_range=INIT_STD,
    bos_token_id=1,
    eos_token_id=2,
)

# name -> (config class, config kwargs, dtype, weight seed, notes). The weight seeds were picked
# (from 1..24) for the largest smallest top1-top2 gap over all f32 greedy steps (>= 1.1e-3 of the
# prompt's max|logit|), so an engine within the f32 tolerance (1e-4) cannot flip a greedy token.
VARIANTS = [
    ("llama_f32_gqa", LlamaConfig,
     dict(num_key_value_heads=2, tie_word_embeddings=False,
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     torch.float32, 5, "LlamaForCausalLM, GQA 4q/2kv heads, head_dim 16, default RoPE theta 1e4, "
     "untied lm_head."),
    ("llama_f32_mqa_headdim_bias", LlamaConfig,
     dict(num_key_value_heads=1, head_dim=32, attention_bias=True, mlp_bias=True,
          tie_word_embeddings=False,
          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
     torch.float32, 2, "MQA (1 kv head), explicit head_dim 32 (q width 128 != hidden 64), "
     "attention_bias (q/k/v/o biases) and mlp_bias (gate/up/down biases), linear RoPE factor 2."),
    ("llama_f32_llama3_tied", LlamaConfig,
     dict(num_key_value_heads=2, tie_word_embeddings=True, eos_token_id=[2, 3],
          rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                           "rope_theta": 10000.0}),
     torch.float32, 13, "llama3 RoPE (factor 8, low 1, high 4, original max pos 64; head_dim 16 "
     "gives 1 unscaled, 2 smoothed and 5 fully scaled frequencies), tied embeddings (no "
     "lm_head.weight in the safetensors), eos_token_id is a list."),
    ("qwen2_f32", Qwen2Config,
     dict(num_key_value_heads=2, tie_word_embeddings=True, use_sliding_window=False,
          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
     torch.float32, 8, "Qwen2ForCausalLM: q/k/v biases, no o_proj bias, GQA 4/2, RoPE theta 1e6, "
     "tied embeddings."),
    ("llama_bf16", LlamaConfig,
     dict(num_key_value_heads=2, tie_word_embeddings=False,
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     torch.bfloat16, 5, "As llama_f32_gqa (same seed: its weights rounded to bf16), stored and "
     "computed in bf16 by transformers."),
    ("qwen2_f16", Qwen2Config,
     dict(num_key_value_heads=2, tie_word_embeddings=True, use_sliding_window=False,
          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
     torch.float16, 8, "As qwen2_f32 (same seed: its weights rounded to f16), stored and computed "
     "in f16 by transformers on the CPU."),
    ("llama_f32_gqa8x4", LlamaConfig,
     dict(num_attention_heads=8, num_key_value_heads=4, head_dim=16, tie_word_embeddings=False,
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     torch.float32, 8, "GQA with 8 query and 4 KV heads, head_dim 16 (q width 128 != hidden 64), "
     "default RoPE theta 1e4, untied lm_head: enough heads to split over TP 2/4/8 (KV heads "
     "replicated at 8) and decode context parallelism with TP_A 1/2/4."),
    ("llama_f32_old_format", LlamaConfig,
     dict(num_key_value_heads=2, tie_word_embeddings=False,
          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
     torch.float32, 5, "Weights of llama_f32_gqa, but config.json rewritten to the pre-v5 format: "
     "top-level rope_theta and rope_scaling {type: linear, factor: 2}, torch_dtype instead of "
     "dtype, no rope_parameters, no head_dim, no mlp_bias. Expected outputs come from "
     "transformers loading that rewritten directory."),
]


def make_prompts():
    """10 prompts (ids in [3, vocab)): 8 of PROMPT_LENGTHS, then the shared-prefix pair."""
    rng = random.Random(SEED)
    vocab = COMMON["vocab_size"]
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]
    prefix = [rng.randrange(3, vocab) for _ in range(PREFIX_LEN)]
    a = [rng.randrange(3, vocab) for _ in range(PREFIX_SUFFIX_LENGTHS[0])]
    b = [rng.randrange(3, vocab) for _ in range(PREFIX_SUFFIX_LENGTHS[1])]
    if a[0] == b[0]:
        b[0] = 3 + (b[0] - 3 + 1) % (vocab - 3)
    prompts.append(prefix + a)
    prompts.append(prefix + b)
    return prompts


def randomize(model, seed):
    """Fills every parameter from its own seeded generator (independent of transformers' init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + NORM_STD * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(EMBED_STD * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(INIT_STD * torch.randn(p.shape, generator=gen))


def to_old_format(path):
    """Rewrites path/config.json to the pre-v5 layout (rope_theta + rope_scaling, torch_dtype, no
    head_dim / mlp_bias)."""
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["rope_scaling"] = {"type": rope["rope_type"], "factor": rope["factor"]}
    cfg["torch_dtype"] = cfg.pop("dtype")
    # Llama-2-era files had neither key; their defaults (hidden/heads, false) give the same model.
    assert cfg["head_dim"] == cfg["hidden_size"] // cfg["num_attention_heads"]
    assert cfg["mlp_bias"] is False
    del cfg["head_dim"], cfg["mlp_bias"]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


@torch.no_grad()
def last_logits(model, ids):
    out = model(torch.tensor([ids], dtype=torch.long)).logits
    return out[0, -1].float()


@torch.no_grad()
def greedy(model, ids):
    """Full recompute each step: argmax of the last position, no eos stop. Returns tokens and the
    top1-top2 logit gap at each step (small gaps are where an engine may legitimately differ)."""
    seq = list(ids)
    toks, gaps = [], []
    for _ in range(MAX_NEW_TOKENS):
        logits = last_logits(model, seq)
        top = torch.topk(logits, 2)
        toks.append(int(top.indices[0]))
        gaps.append(float(top.values[0] - top.values[1]))
        seq.append(toks[-1])
    return toks, gaps


@torch.no_grad()
def greedy_with_cache(model, ids):
    out = model(torch.tensor([ids]), use_cache=True)
    past, toks = out.past_key_values, []
    for _ in range(MAX_NEW_TOKENS):
        toks.append(int(out.logits[0, -1].float().argmax()))
        out = model(torch.tensor([[toks[-1]]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return toks


# ---- Independent fp64 reference, read only from the saved files (config.json + safetensors). ----

def ref_inv_freq(cfg, head_dim):
    """RoPE inverse frequencies in fp64 from either config format (v5 rope_parameters, or
    rope_theta + rope_scaling with "type" or "rope_type")."""
    if "rope_parameters" in cfg:
        rope = dict(cfg["rope_parameters"])
    else:
        rope = dict(cfg.get("rope_scaling") or {})
        rope["rope_theta"] = cfg.get("rope_theta", 10000.0)
    kind = rope.get("rope_type", rope.get("type", "default"))
    inv = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) /
                                        head_dim))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / rope["factor"]
    if kind == "llama3":
        factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        out = []
        for f in inv.tolist():
            wavelen = 2 * math.pi / f
            if wavelen < old / hi:
                out.append(f)
            elif wavelen > old / lo:
                out.append(f / factor)
            else:
                s = (old / wavelen - lo) / (hi - lo)
                out.append((1 - s) * f / factor + s * f)
        return torch.tensor(out, dtype=torch.float64)
    raise ValueError(f"reference: rope type {kind} not handled")


def ref_logits(path, ids):
    """Plain fp64 Llama/Qwen2 forward; returns logits of the last position."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    w = {k: v.double() for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
    h, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    eps = cfg["rms_norm_eps"]
    n = len(ids)
    inv = ref_inv_freq(cfg, hd)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]  # [n, hd/2]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]

    def rope(x):  # x: [n, heads, hd]; rotate-half (non-interleaved) pairs (i, i + hd/2)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def rms(x, wt):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * wt

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    mask = torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), diagonal=1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(x, w[p + "input_layernorm.weight"])
        q = rope(lin(a, p + "self_attn.q_proj").view(n, nh, hd))
        k = rope(lin(a, p + "self_attn.k_proj").view(n, nkv, hd))
        v = lin(a, p + "self_attn.v_proj").view(n, nkv, hd)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + mask
        o = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v).reshape(n, nh * hd)
        x = x + lin(o, p + "self_attn.o_proj")
        a = rms(x, w[p + "post_attention_layernorm.weight"])
        g = lin(a, p + "mlp.gate_proj")
        x = x + lin(torch.nn.functional.silu(g) * lin(a, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = rms(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return (x[-1] @ head.T).float()


def f32_list(t):
    out = []
    for x in t.float().tolist():
        for digits in range(6, 10):
            s = float(f"{x:.{digits}g}")
            if torch.tensor(s, dtype=torch.float32).item() == x:
                break
        out.append(s)
    return out


def cosine(a, b):
    a, b = a.double(), b.double()
    return float((a @ b) / (a.norm() * b.norm()))


def build_variant(out_dir, name, cls, kwargs, dtype, seed, notes, prompts):
    path = os.path.join(out_dir, name)
    shutil.rmtree(path, ignore_errors=True)
    cfg = cls(**{**COMMON, **kwargs})
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    randomize(model, seed)
    model_f32 = model.eval()
    # A copy in the target dtype (to() on the f32 model would also cast the RoPE buffers).
    model = copy.deepcopy(model_f32).to(dtype) if dtype != torch.float32 else model_f32
    model.config.dtype = dtype
    model.save_pretrained(path, safe_serialization=True)
    if name.endswith("old_format"):
        to_old_format(path)
    written = json.load(open(os.path.join(path, "config.json")))

    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                  attn_implementation="eager").eval()
    problems = []
    if loaded.dtype != dtype:
        problems.append(f"reloaded dtype {loaded.dtype} != {dtype}")
    # Transformers must have read the RoPE settings we meant (matters for the old format).
    hd = written.get("head_dim") or written["hidden_size"] // written["num_attention_heads"]
    want_inv = ref_inv_freq({"rope_parameters": kwargs["rope_parameters"]}, hd)
    got_inv = loaded.model.rotary_emb.inv_freq.double()
    if not torch.allclose(got_inv, want_inv, rtol=1e-6, atol=0):
        problems.append(f"inv_freq mismatch: {got_inv.tolist()} vs {want_inv.tolist()}")
    if float(loaded.model.rotary_emb.attention_scaling) != 1.0:
        problems.append(f"attention_scaling {loaded.model.rotary_emb.attention_scaling} != 1")

    rec = {"variant": name, "dtype": str(dtype).replace("torch.", ""),
           "transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "prompts": prompts, "prefix_pair": {"indices": [8, 9], "shared_prefix_len": PREFIX_LEN},
           "max_new_tokens": MAX_NEW_TOKENS, "last_prompt_logits": [], "greedy_tokens": [],
           "greedy_top2_gaps": []}
    stats = {"max_abs_logit": 0.0, "reload_max_diff": 0.0, "mem_max_rel": 0.0,
             "ref64_max_rel": 0.0, "ref64_min_cos": 1.0, "ref64_top1_agree": 0,
             "cache_greedy_mismatch": 0}
    f32c = {"logits": [], "min_cos": 1.0, "top1_agree": 0}
    again = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                 attn_implementation="eager").eval()
    if dtype != torch.float32:
        up = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    for ids in prompts:
        lg = last_logits(loaded, ids)
        toks, gaps = greedy(loaded, ids)
        scale = float(lg.abs().max())
        stats["max_abs_logit"] = max(stats["max_abs_logit"], scale)
        # A second, independent load must give the very same numbers.
        stats["reload_max_diff"] = max(stats["reload_max_diff"],
                                       float((last_logits(again, ids) - lg).abs().max()))
        # The f32 model before saving: equal up to kernel choice (buffer alignment changes the
        # CPU GEMV path by ~1e-7 relative); reduced precision is compared through f32c below.
        mem = last_logits(model_f32, ids)
        stats["mem_max_rel"] = max(stats["mem_max_rel"], float((lg - mem).abs().max()) / scale)
        if greedy_with_cache(loaded, ids) != toks:
            stats["cache_greedy_mismatch"] += 1
        ref = ref_logits(path, ids)
        stats["ref64_max_rel"] = max(stats["ref64_max_rel"], float((lg - ref).abs().max()) / scale)
        stats["ref64_min_cos"] = min(stats["ref64_min_cos"], cosine(lg, ref))
        stats["ref64_top1_agree"] += int(lg.argmax() == ref.argmax())
        rec["last_prompt_logits"].append(f32_list(lg))
        rec["greedy_tokens"].append(toks)
        rec["greedy_top2_gaps"].append([round(g, 6) for g in gaps])
        if dtype != torch.float32:
            lu = last_logits(up, ids)
            f32c["logits"].append(f32_list(lu))
            f32c["min_cos"] = min(f32c["min_cos"], cosine(lg, lu))
            f32c["top1_agree"] += int(lg.argmax() == lu.argmax())

    if stats["reload_max_diff"] != 0.0:
        problems.append(f"a second load changed logits by {stats['reload_max_diff']}")
    if dtype == torch.float32 and stats["mem_max_rel"] > 1e-5:
        problems.append(f"saved model differs from the in-memory one: {stats['mem_max_rel']}")
    if dtype == torch.float32 and stats["ref64_max_rel"] > 1e-5:
        problems.append(f"fp64 reference disagrees: max rel {stats['ref64_max_rel']}")
    if dtype != torch.float32 and stats["ref64_min_cos"] < 0.999:
        problems.append(f"fp64 reference cosine {stats['ref64_min_cos']}")

    # Independent degeneracy check: greedy outputs should differ across prompts and within one.
    seqs = rec["greedy_tokens"]
    distinct_seqs = len({tuple(s) for s in seqs})
    distinct_first = len({s[0] for s in seqs})
    mean_distinct = sum(len(set(s)) for s in seqs) / len(seqs)
    if distinct_seqs < len(seqs) - 1 or mean_distinct < 6:
        problems.append(f"degenerate greedy: {distinct_seqs} distinct seqs, "
                        f"mean {mean_distinct:.1f} distinct tokens")
    rec["notes"] = notes + (
        " Reference: transformers eager attention on the CPU, batch 1, no padding; greedy_tokens "
        "by full recompute each step (argmax of model(ids).logits[0,-1], no eos stop, no "
        "generation_config); greedy_top2_gaps is the top1-top2 logit gap at each step. Random "
        f"weights (seed {seed}): linear N(0,{INIT_STD}), embeddings N(0,{EMBED_STD}), biases "
        f"N(0,{BIAS_STD}), RMSNorm weights 1+N(0,{NORM_STD}). Prompts 8 and 9 share their first "
        f"{PREFIX_LEN} tokens.")
    if dtype != torch.float32:
        rec["last_prompt_logits_f32_compute"] = f32c["logits"]
        rec["notes"] += (" last_prompt_logits_f32_compute: the same stored weights upcast to f32 "
                         "and run in f32 (what an engine accumulating in f32 approximates).")
    with open(os.path.join(path, "expected.json"), "w") as f:
        json.dump(rec, f, separators=(",", ":"))
        f.write("\n")

    tensors = load_file(os.path.join(path, "model.safetensors"))
    summary = {
        "variant": name,
        "config_keys": sorted(written),
        "rope": written.get("rope_parameters") or {"rope_theta": written.get("rope_theta"),
                                                   "rope_scaling": written.get("rope_scaling")},
        "dtype_key": {k: written[k] for k in ("dtype", "torch_dtype") if k in written},
        "logits_dtype": str(loaded(torch.tensor([[5]])).logits.dtype),
        "tensors": len(tensors), "lm_head_saved": "lm_head.weight" in tensors,
        "tensor_dtypes": sorted({str(t.dtype) for t in tensors.values()}),
        "max_abs_logit": round(stats["max_abs_logit"], 4),
        "second_load_max_diff": stats["reload_max_diff"],
        "vs_in_memory_f32_max_rel": f"{stats['mem_max_rel']:.2e}",
        "ref64_max_rel": f"{stats['ref64_max_rel']:.2e}",
        "ref64_min_cos": round(stats["ref64_min_cos"], 7),
        "ref64_top1_agree": f"{stats['ref64_top1_agree']}/{len(prompts)}",
        "cache_vs_recompute_greedy_mismatch": stats["cache_greedy_mismatch"],
        "greedy_distinct_seqs": f"{distinct_seqs}/{len(seqs)}",
        "greedy_distinct_first_tokens": distinct_first,
        "greedy_mean_distinct_tokens_per_seq": round(mean_distinct, 2),
        "min_top2_gap": round(min(min(g) for g in rec["greedy_top2_gaps"]), 6),
        "first_greedy": [s[:6] for s in seqs[:3]],
        "problems": problems,
    }
    if dtype != torch.float32:
        summary["vs_f32_compute_min_cos"] = round(f32c["min_cos"], 7)
        summary["vs_f32_compute_top1_agree"] = f"{f32c['top1_agree']}/{len(prompts)}"
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the fixture folders")
    ap.add_argument("--tar", help="also write a .tar.gz of the fixture folders here")
    ap.add_argument("--only", nargs="*", help="variant names to build (default: all)")
    ap.add_argument("--seed_offset", type=int, default=0,
                    help="added to every weight seed: fresh models beyond the committed fixtures "
                         "(their greedy gaps are then not vetted; the 'problems' list says so)")
    args = ap.parse_args()

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.makedirs(args.out, exist_ok=True)
    prompts = make_prompts()
    summaries, failed = [], False
    for name, cls, kwargs, dtype, seed, notes in VARIANTS:
        if args.only and name not in args.only:
            continue
        try:
            s = build_variant(args.out, name, cls, kwargs, dtype, seed + args.seed_offset, notes,
                              prompts)
        except Exception as e:  # keep going so one broken variant does not hide the others
            import traceback
            traceback.print_exc()
            s = {"variant": name, "problems": [f"exception: {e!r}"]}
        failed |= bool(s["problems"])
        summaries.append(s)
        print(json.dumps(s), flush=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"transformers_version": transformers.__version__,
                   "torch_version": torch.__version__, "variants": summaries}, f, indent=1)
        f.write("\n")
    if args.tar:
        with tarfile.open(args.tar, "w:gz") as tar:
            for name in sorted(os.listdir(args.out)):
                tar.add(os.path.join(args.out, name), arcname=name)
    print("make_golden:", "FAILED" if failed else "OK", f"({len(summaries)} variants)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
