#!/usr/bin/env python3
"""Writes the TensorRT Model Optimizer (modelopt) FP8 variants of the FP8 golden fixtures from
fixtures make_golden_fp8.py wrote: the same e4m3 codes and scales, so the same dequantized
weights and the same transformers references (expected.json is copied), in the layouts modelopt
exports and vLLM reads (vllm/model_executor/layers/quantization/modelopt.py):

  modelopt_kv_hf    from `modelopt`: per-tensor weights, static input scales, and an FP8 KV cache
                    (kv_cache_quant_algo "FP8"), the quantization in hf_quant_config.json only
                    (config.json without quantization_config, as modelopt <= 0.2x exports it),
                    a scalar F32 k_scale / v_scale per layer under self_attn.k_proj / v_proj
  modelopt_channel  from `ct_channel_dynamic`: quant_algo "FP8_PER_CHANNEL_PER_TOKEN" flat in
                    config.json with its kv_cache_scheme form and `ignore`, weight_scale [n]
                    (1-D), self_attn.k_scale / v_scale
  modelopt_pb_wo    from `fp8_block`: quant_algo "fp8_pb_wo" (lower case, as modelopt may write
                    it), weight_scale [row blocks, 1, column blocks, 1]

The KV scales are per-layer constants a calibration would give (here 0.05 and 0.03 + 0.01 per
layer); the runtime checks them and does not use them (WeightQuantization::kv_cache_fp8).

  python3 tests/golden/make_golden_fp8_modelopt.py [--fixtures tests/golden/fixtures_fp8]

Pure Python (no PyTorch): safetensors files are read and written byte for byte.
"""

import argparse
import json
import os
import shutil
import struct

PRODUCER = {"name": "modelopt", "version": "0.19.0"}
FP8_KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                 "symmetric": True}


def read_safetensors(path):
    """[(name, dtype, shape, bytes)] in file order, and the metadata."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return [(k, v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in items], meta


def write_safetensors(path, tensors, meta):
    header, data = {}, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def kv_scales(tensors, names):
    """Scalar F32 k / v scales for every layer of `tensors`, named by names(layer_prefix)."""
    layers = sorted({n.split(".self_attn.")[0] for n, *_ in tensors if ".self_attn." in n})
    out = []
    for i, layer in enumerate(layers):
        k_name, v_name = names(layer + ".self_attn.")
        out.append((k_name, "F32", [], struct.pack("<f", 0.05 + 0.01 * i)))
        out.append((v_name, "F32", [], struct.pack("<f", 0.03 + 0.01 * i)))
    return out


def derive(fixtures, src, dst, quant_config, hf_quant_config, edit, extra):
    src_dir, dst_dir = os.path.join(fixtures, src), os.path.join(fixtures, dst)
    shutil.rmtree(dst_dir, ignore_errors=True)
    os.makedirs(dst_dir)
    with open(os.path.join(src_dir, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    if quant_config is not None:
        config["quantization_config"] = quant_config
    with open(os.path.join(dst_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    if hf_quant_config is not None:
        with open(os.path.join(dst_dir, "hf_quant_config.json"), "w") as f:
            json.dump(hf_quant_config, f, indent=2)
            f.write("\n")
    if os.path.exists(os.path.join(src_dir, "generation_config.json")):
        shutil.copy(os.path.join(src_dir, "generation_config.json"), dst_dir)
    tensors, meta = read_safetensors(os.path.join(src_dir, "model.safetensors"))
    tensors = [edit(*t) for t in tensors]
    write_safetensors(os.path.join(dst_dir, "model.safetensors"), tensors + extra(tensors), meta)
    with open(os.path.join(src_dir, "expected.json")) as f:
        expected = json.load(f)
    expected["format"] = dst
    expected["reference"] += f" (the weights of {src}, written in modelopt's layout)"
    with open(os.path.join(dst_dir, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")
    print(dst, "from", src, len(tensors), "tensors +", len(extra(tensors)), "KV scales")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__),
                                                           "fixtures_fp8"))
    args = parser.parse_args()
    same = lambda *t: t  # noqa: E731

    derive(args.fixtures, "modelopt", "modelopt_kv_hf", None,
           {"producer": PRODUCER,
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                             "exclude_modules": ["lm_head"]}},
           same, lambda t: kv_scales(t, lambda p: (p + "k_proj.k_scale", p + "v_proj.v_scale")))

    def channel(name, dtype, shape, raw):  # ct's [n, 1] -> modelopt's [n]
        return name, dtype, shape[:1] if name.endswith(".weight_scale") else shape, raw
    derive(args.fixtures, "ct_channel_dynamic", "modelopt_channel",
           {"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN",
            "kv_cache_scheme": FP8_KV_SCHEME, "ignore": ["lm_head"], "producer": PRODUCER},
           None, channel, lambda t: kv_scales(t, lambda p: (p + "k_scale", p + "v_scale")))

    def blocks(name, dtype, shape, raw):  # weight_scale_inv [rb, cb] -> weight_scale [rb,1,cb,1]
        if name.endswith(".weight_scale_inv"):
            return name[:-len("_inv")], dtype, [shape[0], 1, shape[1], 1], raw
        return name, dtype, shape, raw
    derive(args.fixtures, "fp8_block", "modelopt_pb_wo",
           {"quant_method": "modelopt", "quant_algo": "fp8_pb_wo",
            "exclude_modules": ["lm_head"]},
           None, blocks, lambda t: [])


if __name__ == "__main__":
    main()
