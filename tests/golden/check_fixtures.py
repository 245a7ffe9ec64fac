#!/usr/bin/env python3
"""Checks that the committed golden fixtures are whole and self-consistent (stdlib only, no torch).

  python3 tests/golden/check_fixtures.py [FIXTURES_DIR]

Catches a truncated or hand-edited fixture before the C++ golden test reports a confusing
mismatch: every file present, the safetensors header matching config.json (names, shapes, dtype),
expected.json shaped as README.md says, prompt ids inside the vocabulary, the prefix pair sharing
its prefix, and the first greedy token being the argmax of the recorded logits. Exit 0 when all
hold; otherwise prints each problem and exits 1.
"""

import json
import os
import struct
import sys

ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
PROMPT_LENGTHS = [1, 3, 7, 16, 17, 33, 50, 64, 40, 45]
MAX_NEW_TOKENS = 16


def safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data_len = os.fstat(f.fileno()).st_size - 8 - n
    header.pop("__metadata__", None)
    return header, data_len


def moe_layer(cfg, i):
    """transformers' rule: Mixtral every layer; Qwen MoE unless listed in mlp_only_layers, every
    decoder_sparse_step-th layer."""
    if cfg["model_type"] == "mixtral":
        return True
    if cfg["model_type"] not in ("qwen2_moe", "qwen3_moe"):
        return False
    return i not in (cfg.get("mlp_only_layers") or []) and \
        (i + 1) % cfg.get("decoder_sparse_step", 1) == 0


def moe_tensors(cfg, p):
    """The hub's per-expert names of one sparse layer (prefix p = model.layers.{i}.)."""
    h = cfg["hidden_size"]
    mixtral = cfg["model_type"] == "mixtral"
    experts = cfg.get("num_local_experts", cfg.get("num_experts"))
    inter = cfg["intermediate_size"] if mixtral else cfg["moe_intermediate_size"]
    m = p + ("block_sparse_moe." if mixtral else "mlp.")
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    t = {m + "gate.weight": [experts, h]}
    for e in range(experts):
        t[f"{m}experts.{e}.{names[0]}.weight"] = [inter, h]
        t[f"{m}experts.{e}.{names[1]}.weight"] = [inter, h]
        t[f"{m}experts.{e}.{names[2]}.weight"] = [h, inter]
    shared = cfg.get("shared_expert_intermediate_size", 0) if cfg["model_type"] == "qwen2_moe" else 0
    if shared:
        for name, shape in (("gate_proj", [shared, h]), ("up_proj", [shared, h]),
                            ("down_proj", [h, shared])):
            t[f"{p}mlp.shared_expert.{name}.weight"] = shape
        t[p + "mlp.shared_expert_gate.weight"] = [1, h]
    return t


def expected_tensors(cfg):
    """name -> shape, from config.json in either format (head_dim / mlp_bias may be absent)."""
    h, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    inter, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    kind = cfg["model_type"]
    qwen2 = kind == "qwen2"
    qkv_bias = qwen2 or cfg.get("attention_bias", False)
    o_bias = (not qwen2) and cfg.get("attention_bias", False)
    if kind in ("mistral", "mixtral"):
        qkv_bias = o_bias = False
    if kind == "qwen2_moe":
        qkv_bias, o_bias = cfg.get("qkv_bias", True), False
    mlp_bias = cfg.get("mlp_bias", False)
    t = {"model.embed_tokens.weight": [vocab, h], "model.norm.weight": [h]}
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = [vocab, h]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = [h]
        t[p + "post_attention_layernorm.weight"] = [h]
        for name, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
            t[p + f"self_attn.{name}.weight"] = [rows, h]
            if qkv_bias:
                t[p + f"self_attn.{name}.bias"] = [rows]
        t[p + "self_attn.o_proj.weight"] = [h, nh * hd]
        if o_bias:
            t[p + "self_attn.o_proj.bias"] = [h]
        if kind in ("qwen3", "qwen3_moe"):
            t[p + "self_attn.q_norm.weight"] = [hd]
            t[p + "self_attn.k_norm.weight"] = [hd]
        if moe_layer(cfg, i):
            t.update(moe_tensors(cfg, p))
            continue
        for name, shape in (("gate_proj", [inter, h]), ("up_proj", [inter, h]),
                            ("down_proj", [h, inter])):
            t[p + f"mlp.{name}.weight"] = shape
            if mlp_bias:
                t[p + f"mlp.{name}.bias"] = shape[:1]
    return t


def check_variant(d, name):
    errs = []
    for f in ("config.json", "generation_config.json", "model.safetensors", "expected.json"):
        if not os.path.isfile(os.path.join(d, f)):
            return [f"{name}: missing {f}"]
    cfg = json.load(open(os.path.join(d, "config.json")))
    exp = json.load(open(os.path.join(d, "expected.json")))
    dtype = cfg.get("dtype", cfg.get("torch_dtype"))
    if dtype != exp["dtype"]:
        errs.append(f"{name}: config dtype {dtype} != expected.json dtype {exp['dtype']}")

    header, data_len = safetensors_header(os.path.join(d, "model.safetensors"))
    want = expected_tensors(cfg)
    if set(header) != set(want):
        errs.append(f"{name}: tensors differ from config: extra {sorted(set(header) - set(want))}"
                    f", missing {sorted(set(want) - set(header))}")
    end = 0
    for k, info in header.items():
        if k in want and info["shape"] != want[k]:
            errs.append(f"{name}: {k} shape {info['shape']} != {want[k]}")
        if info["dtype"] != ST_DTYPES.get(exp["dtype"]):
            errs.append(f"{name}: {k} dtype {info['dtype']} for model dtype {exp['dtype']}")
        end = max(end, info["data_offsets"][1])
    if end != data_len:
        errs.append(f"{name}: safetensors data is {data_len} bytes, header covers {end}")

    vocab, prompts = cfg["vocab_size"], exp["prompts"]
    if [len(p) for p in prompts] != PROMPT_LENGTHS:
        errs.append(f"{name}: prompt lengths {[len(p) for p in prompts]} != {PROMPT_LENGTHS}")
    if any(not 0 <= t < vocab for p in prompts for t in p):
        errs.append(f"{name}: prompt id outside [0, {vocab})")
    pair, n = exp["prefix_pair"]["indices"], exp["prefix_pair"]["shared_prefix_len"]
    a, b = prompts[pair[0]], prompts[pair[1]]
    if a[:n] != b[:n] or a[n] == b[n]:
        errs.append(f"{name}: prefix pair does not share exactly its first {n} tokens")
    if exp["max_new_tokens"] != MAX_NEW_TOKENS:
        errs.append(f"{name}: max_new_tokens {exp['max_new_tokens']}")
    lists = [exp["last_prompt_logits"]] + (
        [exp["last_prompt_logits_f32_compute"]] if exp["dtype"] != "float32" else [])
    for logits in lists:
        if len(logits) != len(prompts) or any(len(row) != vocab for row in logits):
            errs.append(f"{name}: logits are not [{len(prompts)}, {vocab}]")
    for i, (row, toks, gaps) in enumerate(zip(exp["last_prompt_logits"], exp["greedy_tokens"],
                                              exp["greedy_top2_gaps"])):
        if len(toks) != MAX_NEW_TOKENS or len(gaps) != MAX_NEW_TOKENS:
            errs.append(f"{name}: prompt {i}: {len(toks)} greedy tokens, {len(gaps)} gaps")
        if any(not 0 <= t < vocab for t in toks):
            errs.append(f"{name}: prompt {i}: greedy token outside the vocabulary")
        # On an exact tie (possible in bf16) any of the tied tokens is a valid argmax.
        if row and toks and row[toks[0]] != max(row):
            errs.append(f"{name}: prompt {i}: greedy_tokens[0]={toks[0]} is not the argmax")
    return errs


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                             "fixtures")
    names = sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))
    errs = [] if names else [f"no fixtures under {root}"]
    for name in names:
        errs += check_variant(os.path.join(root, name), name)
    for e in errs:
        print("check_fixtures:", e)
    print(f"check_fixtures: {len(names)} fixtures, {len(errs)} problems")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
