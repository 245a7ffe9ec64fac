"""Issue 30 items 1-2 against a real tandem_router over HTTPS (http_abuse_e2e_test.sh starts it).

1. JSON nested 50,000 deep in messages[].content and 100,000 deep in tools: a 400 naming the
   limit; the router stays up and serves the next request.
2. 1,000 uploads announcing 8 MiB bodies without an API key, then 1,000 with a valid key (bodies
   sent): the router's RSS stays within a stated bound above its baseline while they run, and
   comes back near the baseline after they close.

usage: http_abuse_test.py HOST:PORT ROUTER_PID CA_PEM API_KEY [UPLOADS]
"""
import concurrent.futures
import json
import select
import socket
import ssl
import sys
import threading
import time

HOSTPORT, PID, CA, KEY = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
UPLOADS = int(sys.argv[5]) if len(sys.argv) > 5 else 1000
HOST, PORT = HOSTPORT.rsplit(":", 1)
PORT = int(PORT)
CTX = ssl.create_default_context(cafile=CA)
MIB = 1 << 20
BODY_BYTES = 8 * MIB
BUDGET = 64 * MIB  # the router's --http_max_buffered_body_bytes (its default)
# What the router may add above its baseline while uploads run: no body is buffered for keyless
# clients, only connection and TLS handshake state (64 MiB: a loaded 2-core machine holds a few
# hundred of the 1,000 connections at once); the body budget plus the same for keyed ones. The
# defect: 40 keyless connections added 317 MB (8 MiB each), 1,000 would add 8 GB.
KEYLESS_BOUND = 64 * MIB
KEYED_BOUND = BUDGET + 64 * MIB
AFTER_BOUND = 24 * MIB  # above the baseline once every connection closed


def rss():
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("router gone")


def connect():
    raw = socket.create_connection((HOST, PORT), timeout=30)
    return CTX.wrap_socket(raw, server_hostname=HOST)


def read_response(s, data=b""):
    """(status, body) of one response (`data`: its first bytes, already read); the connection may
    close after it."""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head:
        return 0, b""
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, body


def post(path, body, key=KEY):
    s = connect()
    try:
        head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n")
        if key:
            head += f"Authorization: Bearer {key}\r\n"
        s.sendall(head.encode() + b"\r\n" + body)
        return read_response(s)
    finally:
        s.close()


def get(path):
    s = connect()
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Connection: close\r\n\r\n".encode())
        return read_response(s)
    finally:
        s.close()


def deep_json_checks():
    for where, depth in (("content", 50_000), ("tools", 100_000)):
        deep = "[" * depth + "]" * depth
        if where == "content":
            body = ('{"model": "textmodel", "max_tokens": 4, "messages": [{"role": "user", '
                    '"content": ' + deep + '}]}')
        else:
            body = ('{"model": "textmodel", "max_tokens": 4, "messages": [{"role": "user", '
                    '"content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", '
                    '"parameters": ' + deep + '}}]}')
        status, reply = post("/v1/chat/completions", body.encode())
        assert status == 400, (where, status, reply[:200])
        message = json.loads(reply)["error"]["message"]
        assert "deeper than the limit of 128" in message, message
        status, reply = get("/v1/models")  # still up
        assert status == 200, (status, reply[:200])
    print("deep JSON: 2 passed (content 50,000 deep, tools 100,000 deep -> 400 naming the limit; "
          "the router serves on)")


def early_answer(s, wait):
    """Response bytes the server sent before the body was done (b"" when none). TLS 1.3 makes a
    socket readable with session tickets too: only application data counts."""
    readable, _, _ = select.select([s], [], [], wait)
    if not readable and not s.pending():
        return b""
    s.setblocking(False)
    try:
        return s.recv(65536)
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
        return b""
    finally:
        s.setblocking(True)
        s.settimeout(30)


def upload(key):
    """Announces an 8 MiB body and sends it while the server listens; returns the status."""
    s = connect()
    try:
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {BODY_BYTES}\r\n")
        if key:
            head += f"Authorization: Bearer {key}\r\n"
        s.sendall(head.encode() + b"\r\n")
        chunk = b"x" * (256 * 1024)
        sent = 0
        early = b""
        while sent < BODY_BYTES:
            early = early_answer(s, 0.05 if sent == 0 else 0)
            if early:
                break  # answered before the body: a refusal
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                break
            sent += len(chunk)
        status, _ = read_response(s, early)
        return status
    except (ConnectionResetError, BrokenPipeError, ssl.SSLError, socket.timeout):
        return 0
    finally:
        s.close()


def run_uploads(key, bound, label):
    baseline = rss()
    peak = [baseline]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=50) as pool:
        statuses = list(pool.map(lambda _: upload(key), range(UPLOADS)))
    stop.set()
    sampler.join()
    took = time.time() - start
    # Closed connections end on the server within its 2 s refusal drain at most; the heap is
    # trimmed when the last one ends.
    deadline = time.time() + 5.0
    while True:
        time.sleep(0.25)
        after = rss()
        if after - baseline <= AFTER_BOUND or time.time() > deadline:
            break
    counts = {s: statuses.count(s) for s in sorted(set(statuses))}
    print(f"{label}: {UPLOADS} uploads of 8 MiB in {took:.1f} s, statuses {counts}; router RSS "
          f"baseline {baseline / MIB:.0f} MiB, peak +{(peak[0] - baseline) / MIB:.0f} MiB "
          f"(bound +{bound / MIB:.0f}), after +{(after - baseline) / MIB:.0f} MiB "
          f"(bound +{AFTER_BOUND / MIB:.0f})")
    assert peak[0] - baseline <= bound, "router memory over the bound while uploads ran"
    assert after - baseline <= AFTER_BOUND, "router memory stayed up after the uploads closed"
    return counts


deep_json_checks()
keyless = run_uploads(None, KEYLESS_BOUND, "keyless")
assert set(keyless) == {401}, f"every keyless upload must get 401 from its headers: {keyless}"
keyed = run_uploads(KEY, KEYED_BOUND, "valid key")
# Admitted bodies are read and refused as bad JSON (400); the rest past the budget get 503.
assert set(keyed) <= {400, 503} and keyed.get(400, 0) > 0, keyed
status, reply = get("/v1/models")
assert status == 200, (status, reply[:200])
print("uploads: 2 passed (RSS within the bounds with and without a key)")
