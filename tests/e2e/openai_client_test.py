#!/usr/bin/env python3
"""The official `openai` Python client against a real local cluster (router + prefill + decode
processes, deploy/local/up.sh --http_port) serving a dummy-weight model with the real Qwen2.5
tokenizer: completions and chat, whole and streamed (the streamed text equals a whole greedy
completion's), usage counts, stop strings, n, /v1/models, errors surfacing as the client's
exception types (BadRequestError naming the field, NotFoundError), and a stream cancelled
mid-way releasing every KV block on both workers (their /metrics back to baseline).

    openai_client_test.py HTTP_BASE_URL METRICS_URL...

HTTP_BASE_URL is https:// when the cluster runs TLS (up.sh's default): the client trusts the CA in
$TANDEM_TLS_CA through its own httpx client (verify=). The workers' METRICS_URLs are plain HTTP.
"""
import os
import re
import ssl
import sys
import time
import urllib.request

import openai

BASE, METRICS = sys.argv[1], sys.argv[2:]
MODEL = "textmodel"
# The cluster runs with API keys (deploy/local/up.sh's default); the key comes in TANDEM_API_KEY.
API_KEY = os.environ.get("TANDEM_API_KEY", "unused")
CA = os.environ.get("TANDEM_TLS_CA")
http_client = None
if CA:
    http_client = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=CA))
client = openai.OpenAI(base_url=BASE + "/v1", api_key=API_KEY, max_retries=0, timeout=120,
                       http_client=http_client)
passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}: {detail}")


def gauge(url, name):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(float(m) for m in re.findall(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))


models = client.models.list()
check("models", [m.id for m in models.data] == [MODEL], models)

whole = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12,
                                  temperature=0)
check("completion text", isinstance(whole.choices[0].text, str) and whole.choices[0].text, whole)
check("completion usage", whole.usage.completion_tokens == 12 and whole.usage.prompt_tokens > 0,
      whole.usage)
check("completion finish", whole.choices[0].finish_reason == "length", whole.choices[0])

parts = [c.choices[0].text for c in client.completions.create(
    model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0, stream=True)
    if c.choices]
check("stream == whole (greedy)", "".join(parts) == whole.choices[0].text,
      ("".join(parts), whole.choices[0].text))

chat = client.chat.completions.create(
    model=MODEL, temperature=0, max_tokens=10,
    messages=[{"role": "system", "content": "You are terse."},
              {"role": "user", "content": "Say hi in 中文 😀"}])
check("chat role", chat.choices[0].message.role == "assistant", chat)
streamed = client.chat.completions.create(
    model=MODEL, temperature=0, max_tokens=10, stream=True,
    stream_options={"include_usage": True},
    messages=[{"role": "system", "content": "You are terse."},
              {"role": "user", "content": "Say hi in 中文 😀"}])
content, usage = "", None
for c in streamed:
    if c.usage is not None:
        usage = c.usage
    if c.choices and c.choices[0].delta.content:
        content += c.choices[0].delta.content
check("chat stream == whole", content == chat.choices[0].message.content,
      (content, chat.choices[0].message.content))
check("chat stream usage", usage is not None and usage.completion_tokens == 10, usage)

n2 = client.completions.create(model=MODEL, prompt="One two", max_tokens=4, n=2, temperature=0)
check("n=2", [c.index for c in n2.choices] == [0, 1], n2)

full = whole.choices[0].text
if len(full) > 6:
    stop = full[3:6]
    cut = client.completions.create(model=MODEL, prompt="The capital of France is",
                                    max_tokens=12, temperature=0, stop=[stop])
    check("stop string", cut.choices[0].text == full[:full.find(stop)]
          and cut.choices[0].finish_reason == "stop", (cut.choices[0], stop))

try:
    client.completions.create(model=MODEL, prompt="x", max_tokens=4, temperature="hot")
    check("bad temperature", False, "no error")
except openai.BadRequestError as e:
    check("bad temperature", "temperature" in str(e), e)
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=4)
    check("unknown model", False, "no error")
except openai.NotFoundError as e:
    check("unknown model", "no-such-model" in str(e), e)

# Cancel mid-stream: the request ends on P and D and their blocks come back.
free_before = [gauge(u, "tandem:kv_blocks_leased") for u in METRICS]
usage_before = [gauge(u, "tandem:kv_cache_usage_perc") for u in METRICS]
stream = client.completions.create(model=MODEL, prompt="Once upon a time " * 20, max_tokens=2000,
                                   temperature=0.8, stream=True)
for i, _ in enumerate(stream):
    if i == 3:
        break
stream.close()
deadline = time.time() + 20
while time.time() < deadline:
    running = [gauge(u, "tandem:num_requests_running") for u in METRICS]
    leased = [gauge(u, "tandem:kv_blocks_leased") for u in METRICS]
    usage_now = [gauge(u, "tandem:kv_cache_usage_perc") for u in METRICS]
    back = sum(running) == 0 and leased == free_before and all(
        now <= before + 1e-9 for now, before in zip(usage_now, usage_before))
    if back:
        break
    time.sleep(0.2)
check("cancel frees KV (back to the baseline or below)", back,
      (running, leased, usage_now, usage_before))

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
