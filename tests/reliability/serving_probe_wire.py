"""serving_probe.py's HTTP-level abuse: framing, headers, pipelining, slow clients, clients that
leave mid-stream or before a whole answer, concurrent load."""
import json
import re
import socket
import threading
import time

from serving_probe_lib import body_of, parse_status


def wire_probes(P):
    run, C, M, hp, normal = P.run, P.C, P.C.model, P.raw, P.normal
    GOLD = P.gold

    def send_and_read(data, responses, limit_s):
        """Sends `data` on one connection; reads until `responses` status lines, close or limit."""
        s = C.connect(30)
        s.sendall(data)
        buf = b""
        t0 = time.time()
        while (responses is None or buf.count(b"HTTP/1.1 ") < responses) and \
                time.time() - t0 < limit_s:
            try:
                c = s.recv(65536)
            except socket.timeout:
                break
            if not c:
                break
            buf += c
        s.close()
        return buf
    GOOD = json.dumps({"model": M, "prompt": "hi", "max_tokens": 2}).encode()
    run("http/no content-length", lambda: hp(C.request_bytes("POST", "/v1/completions", GOOD,
                                                             content_length=False), timeout=40))
    run("http/no content-length + shut", lambda: hp(C.request_bytes("POST", "/v1/completions", GOOD,
                                                                    content_length=False), shut=True))


    def chunked(body, pieces=3):
        out = b""
        step = max(1, len(body) // pieces)
        for i in range(0, len(body), step):
            part = body[i:i + step]
            out += b"%x\r\n" % len(part) + part + b"\r\n"
        return out + b"0\r\n\r\n"


    run("http/chunked", lambda: hp(C.request_bytes("POST", "/v1/completions", b"",
                                                   "Transfer-Encoding: chunked\r\n",
                                                   content_length=False) + chunked(GOOD)))
    run("http/chunked bad size", lambda: hp(C.request_bytes(
        "POST", "/v1/completions", b"", "Transfer-Encoding: chunked\r\n", content_length=False)
        + b"zz\r\nabc\r\n0\r\n\r\n"))
    run("http/chunked huge size", lambda: hp(C.request_bytes(
        "POST", "/v1/completions", b"", "Transfer-Encoding: chunked\r\n", content_length=False)
        + b"ffffffffffffffff\r\nabc"))
    run("http/chunked + content-length", lambda: hp(C.request_bytes(
        "POST", "/v1/completions", b"", "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        content_length=False) + chunked(GOOD)))
    run("http/CL short (body longer)", lambda: hp(C.request_bytes(
        "POST", "/v1/completions", b"", f"Content-Length: {len(GOOD) - 5}\r\n",
        content_length=False) + GOOD))
    run("http/CL long (body shorter) bounded", lambda: hp(C.request_bytes(
        "POST", "/v1/completions", b"", f"Content-Length: {len(GOOD) + 50}\r\n",
        content_length=False) + GOOD, timeout=40))
    run("http/two CLs", lambda: hp(C.request_bytes(
        "POST", "/v1/completions", b"", f"Content-Length: {len(GOOD)}\r\nContent-Length: 3\r\n",
        content_length=False) + GOOD))
    run("http/CL negative", lambda: hp(C.request_bytes(
        "POST", "/v1/completions", b"", "Content-Length: -1\r\n", content_length=False) + GOOD))
    run("http/CL 2^64", lambda: hp(C.request_bytes(
        "POST", "/v1/completions", b"", "Content-Length: 18446744073709551616\r\n",
        content_length=False) + GOOD))
    run("http/CL 9MB", lambda: hp(C.request_bytes(
        "POST", "/v1/completions", b"", "Content-Length: 9000000\r\n", content_length=False)))
    run("http/huge header 20KB", lambda: hp(C.request_bytes("GET", "/v1/models", b"",
                                                            "X-Big: " + "a" * 20000 + "\r\n")))
    run("http/1000 headers", lambda: hp(C.request_bytes("GET", "/v1/models", b"", "".join(
        f"X-H{i}: v\r\n" for i in range(1000)))))
    run("http/header no colon", lambda: hp(C.request_bytes("GET", "/v1/models", b"", "Broken\r\n")))
    run("http/header NUL", lambda: hp(C.request_bytes("GET", "/v1/models", b"", "X-A: a\x00b\r\n")))
    run("http/obs-fold", lambda: hp(C.request_bytes("GET", "/v1/models", b"", "X-A: a\r\n b\r\n")))
    run("http/LF only", lambda: hp(C.request_bytes("GET", "/v1/models", b"").replace(b"\r\n", b"\n")))
    run("http/HTTP/1.0", lambda: hp(C.request_bytes("GET", "/v1/models", b"").replace(
        b"HTTP/1.1", b"HTTP/1.0")))
    run("http/HTTP/0.9", lambda: hp(b"GET /v1/models\r\n\r\n"))
    run("http/HTTP/2.0 line", lambda: hp(C.request_bytes("GET", "/v1/models", b"").replace(
        b"HTTP/1.1", b"HTTP/2.0")))
    run("http/h2 preface", lambda: hp(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 30))
    run("http/garbage 4KB", lambda: hp(bytes(range(256)) * 16))
    run("http/only CRLFs", lambda: hp(b"\r\n" * 1000, timeout=40))


    def pipelined(n=8):
        req = C.request_bytes("POST", "/v1/completions", GOOD)
        get_models = C.request_bytes("GET", "/v1/models", b"")
        buf = send_and_read((req + get_models) * (n // 2), n, 30)
        codes = [int(x) for x in re.findall(rb"HTTP/1.1 (\d+)", buf)]
        return ("ok" if codes == [200] * n else "BAD"), f"{len(codes)} responses {codes}"


    run("http/pipelined 8", pipelined)


    def pipelined_stream():
        body = json.dumps({"model": M, "prompt": "hi", "max_tokens": 30, "stream": True}).encode()
        data = C.request_bytes("POST", "/v1/completions", body) + C.request_bytes(
            "POST", "/v1/completions", GOOD)
        buf = send_and_read(data, None, 20)
        codes = re.findall(rb"HTTP/1.1 (\d+)", buf)
        return codes, f"{len(buf)} bytes, done={b'[DONE]' in buf}"


    run("http/pipelined after stream", pipelined_stream)


    def slowloris(n=40, secs=8):
        socks = []
        for _ in range(n):
            s = C.connect(5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        t0 = time.time()
        while time.time() - t0 < secs:
            for s in socks:
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    pass
            time.sleep(1)
        # meanwhile the API answers others
        text, err = normal()
        for s in socks:
            s.close()
        return ("ok" if text == GOLD else "BLOCKED"), f"normal during slowloris: {err}"


    run("http/slowloris 40 conns 8 s", slowloris)


    def slow_body(secs=8):
        s = C.connect(60)
        s.sendall(C.request_bytes("POST", "/v1/completions", b"", f"Content-Length: {len(GOOD)}\r\n",
                                  content_length=False))
        for i in range(secs):
            s.sendall(GOOD[i:i + 1])
            time.sleep(1)
        s.sendall(GOOD[secs:])
        buf = s.recv(65536)
        s.close()
        return parse_status(buf), body_of(buf)[:100].decode(errors="replace")


    run("http/slow body 1 byte/s", slow_body)


    def idle_connections(n=300):
        socks = [socket.create_connection((C.host, C.port), timeout=5) for _ in range(n)]
        text, err = normal()
        for s in socks:
            s.close()
        return ("ok" if text == GOLD else "BLOCKED"), f"{n} idle TCP conns; normal: {err}"


    run("http/300 idle tcp conns", idle_connections)


    def stream_disconnect(n=1, after_chunks=2, chat=False):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body = {"model": M, "max_tokens": 2000, "stream": True, "ignore_eos": True}
        if chat:
            body["messages"] = [{"role": "user", "content": "talk"}]
        else:
            body["prompt"] = "talk to me"
        data = C.request_bytes("POST", path, json.dumps(body).encode())
        socks = []
        for _ in range(n):
            s = C.connect(30)
            s.sendall(data)
            socks.append(s)
        got = 0
        for s in socks:
            buf = b""
            while buf.count(b"data:") < after_chunks:
                c = s.recv(4096)
                if not c:
                    break
                buf += c
            got += buf.count(b"data:") >= after_chunks
        for s in socks:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
        return f"{got}/{n}", "streams started then dropped"


    run("stream/disconnect mid-stream", stream_disconnect)
    run("stream/disconnect mid-stream chat", lambda: stream_disconnect(chat=True))
    run("stream/24 concurrent then disconnect", lambda: stream_disconnect(n=24))


    def stream_disconnect_before_headers(n=16):
        body = json.dumps({"model": M, "prompt": "x " * 3000, "max_tokens": 500, "stream": True})
        for _ in range(n):
            s = C.connect(10)
            s.sendall(C.request_bytes("POST", "/v1/completions", body.encode()))
            s.close()
        return "sent", f"{n} streams closed right after sending"


    run("stream/close right after send x16", stream_disconnect_before_headers)


    def nonstream_disconnect(n=16):
        body = json.dumps({"model": M, "prompt": "x " * 1000, "max_tokens": 1000, "ignore_eos": True})
        for _ in range(n):
            s = C.connect(10)
            s.sendall(C.request_bytes("POST", "/v1/completions", body.encode()))
            time.sleep(0.05)
            s.close()
        return "sent", f"{n} non-stream requests closed after 50 ms"


    run("nonstream/close after 50 ms x16", nonstream_disconnect)


    def half_close_stream():
        body = json.dumps({"model": M, "prompt": "hello", "max_tokens": 40, "stream": True})
        s = C.connect(30)
        s.sendall(C.request_bytes("POST", "/v1/completions", body.encode()))
        if not C.ctx:
            s.shutdown(socket.SHUT_WR)
        buf = b""
        while True:
            c = s.recv(65536)
            if not c:
                break
            buf += c
        s.close()
        return parse_status(buf), f"DONE={b'[DONE]' in buf} ({len(buf)} B)"


    run("stream/client half-close", half_close_stream)


    def stream_ok():
        body = json.dumps({"model": M, "prompt": "hello", "max_tokens": 20, "stream": True,
                           "stream_options": {"include_usage": True}})
        st, buf, _, to = C.raw(C.request_bytes("POST", "/v1/completions", body.encode()), timeout=30)
        return st, f"DONE={b'[DONE]' in buf} usage={b'usage' in buf}"


    run("stream/normal", stream_ok)


    def many_concurrent(n=32):
        out = []

        def one():
            out.append(normal()[0] == GOLD)

        ts = [threading.Thread(target=one) for _ in range(n)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        return f"{sum(out)}/{n}", "concurrent identical greedy"


    run("load/32 concurrent", many_concurrent)

