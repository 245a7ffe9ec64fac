#!/usr/bin/env python3
"""Outside-style adversarial probe of the serving surface (tests/reliability/README.md, "Serving
probe"): brings up real deployments with deploy/local/up.sh on 127.0.0.1 (router + P + D + mixed
with TLS and API keys, the same without TLS, router + mixed alone; the make_text_model.sh model:
random weights, Qwen2.5's tokenizer and chat template; workers --num_threads=1 --metrics_listen)
and throws hostile input at the OpenAI-compatible HTTP API and at every TCP port: malformed,
truncated, huge and nested JSON, every field of the wrong type or out of range, prompts and chat
messages of every odd shape, HTTP-level abuse (framing, headers, pipelining, slow-loris, clients
leaving mid-stream and before a whole answer) and garbage bytes on every gRPC / metrics / UCX port.
After each probe: every daemon alive, a greedy request gives the text it gave at the start, and
every worker's /metrics shows its pool back to the start (nothing running or waiting, no KV block
used or leased). Prints one row per probe and the flagged ones (crash, hang, 5xx, leak).

  python3 tests/reliability/serving_probe.py [tls] [plain] [mixed] [--only=SUBSTRING]

Binaries from bazel-bin (SERVING_PROBE_BIN=DIR for a copy); runs in SERVING_PROBE_RUN
(/tmp/serving_probe). Not a test: ~2 min per deployment of bounded load on 2 cores; kills only
what up.sh started (down.sh).
"""
import os
import subprocess
import sys

from serving_probe_lib import Cluster, Probe, port_garbage
from serving_probe_wire import wire_probes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.environ.get("SERVING_PROBE_RUN", "/tmp/serving_probe")
BIN = os.environ.get("SERVING_PROBE_BIN", os.path.join(REPO, "bazel-bin"))
DEPLOYMENTS = {  # name -> (up.sh flags, TLS)
    "tls": (["--prefill=1", "--decode=1", "--mixed=1"], True),
    "plain": (["--prefill=1", "--decode=1", "--mixed=1", "--insecure"], False),
    "mixed": (["--prefill=0", "--decode=0", "--mixed=1"], True),
}


def nested(n):
    return "[" * n + "]" * n


def body_probes(P):
    """Request bodies: JSON, fields, prompts, chat messages, the other endpoints, paths, auth."""
    run, comp, chat, rawbody, post, get, method = (P.run, P.comp, P.chat, P.rawbody, P.post, P.get,
                                                  P.method)
    C, M = P.C, P.C.model
    # ---- malformed JSON
    run("json/empty body", rawbody("/v1/completions", b""))
    run("json/truncated", rawbody("/v1/completions", b'{"model": "model", "prompt": "hi'))
    run("json/garbage", rawbody("/v1/completions", b"\x00\xff\xfe garbage"))
    run("json/top-level array", rawbody("/v1/completions", b"[1,2,3]"))
    run("json/top-level string", rawbody("/v1/completions", b'"hi"'))
    run("json/nested 200 in prompt", rawbody(
        "/v1/completions", ('{"model":"model","prompt":' + nested(200) + "}").encode()))
    run("json/nested 100000 object", rawbody(
        "/v1/chat/completions", ('{"a":' * 100000 + "1" + "}" * 100000).encode()))
    run("json/NaN literal", rawbody("/v1/completions", b'{"model":"model","prompt":"hi","temperature":NaN}'))
    run("json/Infinity literal", rawbody("/v1/completions",
                                         b'{"model":"model","prompt":"hi","temperature":Infinity}'))
    run("json/1e400 temperature", rawbody("/v1/completions",
                                          b'{"model":"model","prompt":"hi","temperature":1e400}'))
    run("json/1e400 max_tokens", rawbody("/v1/completions",
                                         b'{"model":"model","prompt":"hi","max_tokens":1e400}'))
    run("json/-0 max_tokens", rawbody("/v1/completions",
                                      b'{"model":"model","prompt":"hi","max_tokens":-0}'))
    run("json/lone surrogate", rawbody("/v1/completions", b'{"model":"model","prompt":"a\\ud800b"}'))
    run("json/lone low surrogate", rawbody("/v1/completions", b'{"model":"model","prompt":"\\udc00"}'))
    run("json/invalid utf8 raw", rawbody("/v1/completions", b'{"model":"model","prompt":"a\xff\xfeb"}'))
    run("json/overlong utf8", rawbody("/v1/completions", b'{"model":"model","prompt":"\xc0\xaf"}'))
    run("json/NUL escaped", comp(prompt="a\u0000b"))
    run("json/NUL raw in string", rawbody("/v1/completions", b'{"model":"model","prompt":"a\x00b"}'))
    run("json/NUL escaped chat", chat(messages=[{"role": "user", "content": "x\u0000y"}]))
    run("json/duplicate keys", rawbody(
        "/v1/completions", b'{"model":"model","prompt":"hi","max_tokens":2,"max_tokens":-5}'))
    run("json/unknown fields", comp(foo=1, bar={"x": [1, 2]}, frequency_penalty=0.5))
    run("json/trailing garbage", rawbody("/v1/completions",
                                         b'{"model":"model","prompt":"hi","max_tokens":2} xyz'))
    run("json/two objects", rawbody("/v1/completions", b'{"model":"model","prompt":"hi"}{}'))
    run("json/BOM", rawbody("/v1/completions", b'\xef\xbb\xbf{"model":"model","prompt":"hi","max_tokens":2}'))
    run("json/comment", rawbody("/v1/completions", b'{"model":"model", /*x*/ "prompt":"hi"}'))
    # ---- wrong types / ranges
    for k, v in [("max_tokens", "5"), ("max_tokens", -1), ("max_tokens", 0), ("max_tokens", 2**63),
                 ("max_tokens", 2**64 - 1), ("max_tokens", 2**64), ("max_tokens", 4.5),
                 ("max_tokens", True), ("max_tokens", None), ("max_tokens", [4]),
                 ("temperature", -1), ("temperature", 1e308), ("temperature", "0.5"),
                 ("top_p", 1.5), ("top_p", 0), ("top_p", -0.0), ("top_k", -2), ("top_k", 2**40),
                 ("n", 2), ("n", 0), ("n", -1), ("n", 5), ("n", 2**63),
                 ("logprobs", 1), ("logprobs", True), ("top_logprobs", 5),
                 ("seed", 2**64 - 1), ("seed", -2**63), ("seed", 2**64), ("seed", 1.5), ("seed", "1"),
                 ("stop", [""]), ("stop", ""), ("stop", ["x"] * 1000), ("stop", [1]), ("stop", {}),
                 ("stop", ["a" * 100000]), ("stream", "yes"), ("stream", 1),
                 ("stream_options", {"include_usage": "x"}), ("stream_options", [1]),
                 ("ignore_eos", "true"), ("user", 5), ("model", 5), ("model", "nope"),
                 ("model", "x" * 100000), ("best_of", 3), ("echo", True), ("suffix", "x"),
                 ("logit_bias", {"5": 100}), ("stop_token_ids", [-1]), ("stop_token_ids", [2**63]),
                 ("max_completion_tokens", -3), ("presence_penalty", "x")]:
        run(f"field/{k}={str(v)[:20]}", comp(**{k: v}))
    run("field/stop empty + stream", comp(stop=[""], stream=True, max_tokens=8))
    run("field/no model", rawbody("/v1/completions", b'{"prompt":"hi"}'))
    run("field/no prompt", rawbody("/v1/completions", b'{"model":"model"}'))
    # ---- prompts
    run("prompt/empty string", comp(prompt=""))
    run("prompt/empty list", comp(prompt=[]))
    run("prompt/[[]]", comp(prompt=[[]]))
    run("prompt/id = vocab", comp(prompt=[151936]))
    run("prompt/id = vocab-1", comp(prompt=[151935]))
    run("prompt/id tokenizer size", comp(prompt=[151665]))
    run("prompt/id negative", comp(prompt=[-1]))
    run("prompt/id 2^63", comp(prompt=[2**63]))
    run("prompt/id float", comp(prompt=[1.0]))
    run("prompt/mixed list", comp(prompt=[1, "a"]))
    run("prompt/mixed list 2", comp(prompt=["a", 1]))
    run("prompt/list of lists", comp(prompt=[[1, 2], [3]]))
    run("prompt/16 prompts", comp(prompt=["a"] * 16))
    run("prompt/17 prompts", comp(prompt=["a"] * 17))
    run("prompt/17 prompts stream", comp(prompt=["a"] * 17, stream=True))
    run("prompt/object", comp(prompt={"a": 1}))
    run("prompt/4090 ids + 4", comp(prompt=[5] * 4092, max_tokens=4))
    run("prompt/4093 ids + 4", comp(prompt=[5] * 4093, max_tokens=4))
    run("prompt/longer than context", comp(prompt=[5] * 5000))
    run("prompt/max_tokens past context", comp(prompt="hi", max_tokens=4095))
    run("prompt/special tokens text", comp(prompt="<|im_start|><|endoftext|><|im_end|>"))
    run("prompt/100k words", comp(prompt="word " * 100000, max_tokens=1))
    for desc, text in [("50KB one word", "a" * 50000), ("200KB one word", "a" * 200000),
                       ("200KB digits", "7" * 200000), ("200KB cjk", "漢" * 200000),
                       ("200KB spaces", " " * 200000), ("200KB emoji", "🙂" * 100000)]:
        body = {"model": M, "prompt": text, "max_tokens": 1}
        run(f"prompt/{desc}", lambda body=body: post("/v1/completions", body, timeout=120))
    # ---- chat
    for desc, msgs in [
            ("content int", [{"role": "user", "content": 5}]),
            ("content null", [{"role": "user", "content": None}]),
            ("content obj", [{"role": "user", "content": {"a": 1}}]),
            ("content parts", [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
            ("content image part", [{"role": "user", "content": [{"type": "image_url",
                                                                   "image_url": {"url": "x"}}]}]),
            ("no content", [{"role": "user"}]),
            ("no role", [{"content": "hi"}]),
            ("role int", [{"role": 1, "content": "hi"}]),
            ("role unknown", [{"role": "wizard", "content": "hi"}]),
            ("message string", ["hi"]),
            ("messages empty", []),
            ("messages dict", {"role": "user"}),
            ("only system", [{"role": "system", "content": "be nice"}]),
            ("assistant last", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]),
            ("tool call", [{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": None, "tool_calls": [
                               {"id": "c1", "type": "function",
                                "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                           {"role": "tool", "tool_call_id": "c1", "content": "42"}]),
            ("tool call args obj", [{"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]),
            ("tool call garbage", [{"role": "assistant", "tool_calls": 5}]),
            ("tool call list of int", [{"role": "assistant", "tool_calls": [1, 2]}]),
            ("tool call no function", [{"role": "assistant", "tool_calls": [{"type": "function"}]}]),
            ("tool msg no id", [{"role": "tool", "content": "x"}]),
            ("template chars", [{"role": "user", "content": "{{ 7*7 }} {% for x in y %}"}]),
            ("2048 msgs", [{"role": "user", "content": "a"}] * 2048),
    ]:
        run(f"chat/{desc}", chat(messages=msgs))
    run("chat/tools garbage", chat(tools=[{"type": "function", "function": 5}]))
    run("chat/tools no function", chat(tools=[{"type": "function"}]))
    run("chat/tools string", chat(tools="x"))
    run("chat/tools ok", chat(tools=[{"type": "function", "function": {
        "name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}}]))
    run("chat/tool_choice", chat(tool_choice="required"))
    run("chat/stream n=2", chat(stream=True, n=2))
    run("chat/response_format", chat(response_format={"type": "json_object"}))
    run("chat/no messages", lambda: post("/v1/chat/completions", {"model": M}))
    # ---- other endpoints
    run("tokenize/messages int", lambda: post("/tokenize", {"messages": 5}))
    run("tokenize/messages list of int", lambda: post("/tokenize", {"messages": [1, 2]}))
    run("tokenize/messages obj", lambda: post("/tokenize", {"messages": {"role": "user"}}))
    run("tokenize/prompt int", lambda: post("/tokenize", {"prompt": 5}))
    run("tokenize/200KB word", lambda: post("/tokenize", {"prompt": "b" * 200000}, timeout=120))
    run("tokenize/empty", lambda: post("/tokenize", {"prompt": ""}))
    run("tokenize/array body", lambda: post("/tokenize", [1]))
    run("detokenize/ok", lambda: post("/detokenize", {"tokens": [1, 2, 3]}))
    run("detokenize/special ids", lambda: post("/detokenize", {"tokens": [151643, 151644, 151664]}))
    run("detokenize/byte token", lambda: post("/detokenize", {"tokens": [255]}))
    run("detokenize/strings", lambda: post("/detokenize", {"tokens": ["a"]}))
    run("detokenize/100k", lambda: post("/detokenize", {"tokens": [9707] * 100000}))
    run("detokenize/vocab-1", lambda: post("/detokenize", {"tokens": [151935]}))
    run("detokenize/none", lambda: post("/detokenize", {}))


    run("path/unknown", lambda: get("/nope"))
    run("path/metrics on API port", lambda: get("/metrics"))
    run("path/traversal", lambda: get("/../../etc/passwd"))
    run("path/query", lambda: get("/v1/models?x=1&y"))
    run("path/non-utf8", lambda: get("/\xff\xfe".encode("latin1").decode("latin1")))
    run("path/very long", lambda: get("/" + "a" * 15000))
    run("path/absolute uri", lambda: get("http://evil/v1/models"))
    run("path/asterisk", lambda: method("OPTIONS", "*"))
    run("method/GET completions", lambda: method("GET", "/v1/completions"))
    run("method/DELETE models", lambda: method("DELETE", "/v1/models"))
    run("method/HEAD models", lambda: (C.raw(C.request_bytes("HEAD", "/v1/models", b""), timeout=5)[0], ""))
    run("method/garbage", lambda: method("FOO", "/v1/models"))
    run("method/lowercase", lambda: method("get", "/v1/models"))
    run("method/CONNECT", lambda: method("CONNECT", "localhost:1"))
    run("health/no key", lambda: (C.raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")[0], ""))
    run("auth/no key", lambda: (C.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")[0], ""))
    run("auth/bad key", lambda: (C.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                                       b"Authorization: Bearer nope\r\n\r\n")[0], ""))
    run("auth/two auth headers", lambda: get("/v1/models", "Authorization: Bearer nope\r\n"))
    run("auth/basic", lambda: (C.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                                     b"Authorization: Basic Zm9vOmJhcg==\r\n\r\n")[0], ""))




def up(name):
    flags, tls = DEPLOYMENTS[name]
    run_dir = os.path.join(RUN, name)
    model = os.path.join(RUN, "model")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([os.path.join(REPO, "deploy/local/make_text_model.sh"), model], check=True,
                       stdout=subprocess.DEVNULL)
    subprocess.run([os.path.join(REPO, "deploy/local/down.sh"), run_dir], cwd=REPO,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([os.path.join(REPO, "deploy/local/up.sh"), *flags, "--load_format=dummy",
                    f"--dummy_config={model}/config.json", "--http_port=0",
                    f"--http_model={model}", f"--run_dir={run_dir}", f"--bin_dir={BIN}", "--",
                    "--num_threads=1", "--metrics_listen=127.0.0.1:0"],
                   cwd=REPO, check=True, timeout=300, stdout=subprocess.DEVNULL)
    return Cluster(run_dir, tls)


def main():
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or list(DEPLOYMENTS)
    only = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--only=")), "")
    flagged = 0
    for name in names:
        print(f"== deployment {name}", flush=True)
        cluster = up(name)
        try:
            probe = Probe(cluster, only)
            body_probes(probe)
            wire_probes(probe)
            if not only:
                port_garbage(cluster)
                probe.run("ports/after garbage on every port", lambda: ("ok", ""))
            bad = probe.flagged()
            print(f"{name}: {len(probe.results)} probes, {len(bad)} flagged", flush=True)
            for r in bad:
                print("FLAG", name, r[0], r[1], r[2][:200], r[3], flush=True)
            flagged += len(bad)
        finally:
            subprocess.run([os.path.join(REPO, "deploy/local/down.sh"), cluster.run_dir], cwd=REPO,
                           stdout=subprocess.DEVNULL)
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
