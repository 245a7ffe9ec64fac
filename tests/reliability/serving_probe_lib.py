"""Helpers of serving_probe.py: a deployment's addresses, raw HTTP(S), pool and liveness checks."""
import json
import os
import re
import socket
import ssl
import time
import urllib.request


class Cluster:
    def __init__(self, run_dir, tls):
        self.run_dir = run_dir
        self.tls = tls
        host, port = open(f"{run_dir}/http.port").read().strip().rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.key = open(f"{run_dir}/certs/api_key").read().strip() if tls else ""
        self.ctx = None
        if tls:
            self.ctx = ssl.create_default_context(cafile=f"{run_dir}/certs/ca.pem")
        self.pids = {}
        for line in open(f"{run_dir}/pids"):
            pid, name = line.split()
            self.pids[name] = int(pid)
        self.metrics = {}
        for name in self.pids:
            if name == "router":
                continue
            log = open(f"{run_dir}/{name}.log", errors="replace").read()
            m = re.search(r"metrics on http://([0-9.]+:\d+)/metrics", log)
            if m:
                self.metrics[name] = m.group(1)
        self.grpc_ports = {}
        for name in self.pids:
            f = f"{run_dir}/{name}.port"
            if os.path.exists(f):
                self.grpc_ports[name] = open(f).read().strip()
        if os.path.exists(f"{run_dir}/internal.port"):
            self.grpc_ports["router-internal"] = open(f"{run_dir}/internal.port").read().strip()
        self.model = "model"

    def connect(self, timeout=10):
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        if self.ctx:
            s = self.ctx.wrap_socket(s, server_hostname="localhost")
        return s

    def auth(self):
        return f"Authorization: Bearer {self.key}\r\n" if self.key else ""

    def request_bytes(self, method, path, body=b"", headers="", content_length=True):
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{self.auth()}"
        head += "Content-Type: application/json\r\n" + headers
        if content_length:
            head += f"Content-Length: {len(body)}\r\n"
        return head.encode() + b"\r\n" + body

    def raw(self, data, timeout=20, read=True, shut=False):
        """Sends bytes, reads until close or timeout. Returns (status, body, elapsed, timed_out)."""
        t0 = time.time()
        s = self.connect(timeout)
        try:
            s.sendall(data)
            if shut and not self.ctx:
                s.shutdown(socket.SHUT_WR)
            if not read:
                return None, b"", time.time() - t0, False
            buf = b""
            timed_out = False
            while True:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    timed_out = True
                    break
                except (ConnectionResetError, ssl.SSLError, OSError):
                    break
                if not chunk:
                    break
                buf += chunk
                if response_complete(buf):
                    break
            return parse_status(buf), buf, time.time() - t0, timed_out
        finally:
            s.close()

    def post(self, path, body, headers="", timeout=60):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        return self.raw(self.request_bytes("POST", path, body, headers), timeout=timeout)


def response_complete(buf):
    """True once one whole response (Content-Length or chunked) is in buf."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return False
    head = buf[:end].decode(errors="replace").lower()
    body = buf[end + 4:]
    if head.startswith("http/1.1 100"):
        return response_complete(body)
    m = re.search(r"content-length:\s*(\d+)", head)
    if m:
        return len(body) >= int(m.group(1))
    if "transfer-encoding: chunked" in head:
        return body.endswith(b"0\r\n\r\n")
    return False


def parse_status(buf):
    m = re.match(rb"HTTP/1\.[01] (\d+)", buf)
    if m and m.group(1) == b"100":
        rest = buf[buf.find(b"\r\n\r\n") + 4:]
        return parse_status(rest)
    return int(m.group(1)) if m else None


def body_of(buf):
    end = buf.find(b"\r\n\r\n")
    return buf[end + 4:] if end >= 0 else buf


def metric(text, name):
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def pool_state(cluster):
    out = {}
    for name, addr in cluster.metrics.items():
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
        out[name] = tuple(metric(text, k) for k in (
            "tandem:num_requests_running", "tandem:num_requests_waiting",
            "tandem:kv_cache_usage_perc", "tandem:kv_blocks_leased"))
    return out


def alive(cluster):
    dead = []
    for name, pid in cluster.pids.items():
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    dead.append(name)
        except OSError:
            dead.append(name)
    return dead


def listening(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            l = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if l.startswith("socket:["):
            inodes.add(l[8:-1])
    out = []
    for line in open(f"/proc/{pid}/net/tcp").readlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:
            ip, port = f[1].split(":")
            out.append(int(port, 16))
    return out


def port_garbage(C):
    """Garbage on every TCP port of every daemon (gRPC, metrics, UCX, HTTP); one line per port."""
    import random
    ports = dict(C.grpc_ports)
    ports["router"] = open(f"{C.run_dir}/router.port").read().strip()
    for name, a in C.metrics.items():
        ports[f"{name}-metrics"] = a
    for name, pid in C.pids.items():
        for p in listening(pid):
            ports.setdefault(f"{name}:{p}", f"127.0.0.1:{p}")
    rng = random.Random(7)
    garbage = bytes(rng.getrandbits(8) for _ in range(4096))
    payloads = {
        "nothing": b"",
        "garbage": garbage,
        "h2 preface + bad frame": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x04\x99\xff\x00\x00\x00\x01abcd",
        "h2 preface + huge frame": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff\xff\xff" + b"\x00" * 6 + b"x" * 1000,
        "tls hello garbage": b"\x16\x03\x01\x02\x00" + garbage[:512],
        "http1": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    }
    seen = set()
    for name, addr in sorted(ports.items()):
        if addr in seen:
            continue
        seen.add(addr)
        host, port = addr.rsplit(":", 1)
        res = []
        for pname, data in payloads.items():
            try:
                s = socket.create_connection((host, int(port)), timeout=3)
                s.sendall(data)
                try:
                    r = s.recv(200)
                    res.append(f"{pname}: {'closed' if not r else 'answered ' + repr(r[:12])}")
                except socket.timeout:
                    res.append(f"{pname}: silent 3 s")
                s.close()
            except OSError as e:
                res.append(f"{pname}: {e.__class__.__name__}")
        print(f"port {name:24s} {addr:22s} " + " | ".join(res), flush=True)


class Probe:
    """Runs probes against one deployment; after each: every daemon alive, a greedy request gives
    the text it gave at the start, every worker's pool back to its start (running, waiting, KV
    usage, leased blocks). One line per probe; `flagged()` lists crashes, hangs, 5xx and leaks."""

    def __init__(self, cluster, only=""):
        self.C = cluster
        self.only = only
        self.results = []
        self.gold_req = {"model": cluster.model, "prompt": "The quick brown fox", "max_tokens": 12,
                         "temperature": 0}
        self.gold, err = self.normal()
        assert self.gold is not None, err
        # Whole: nothing running or waiting, no KV block used or leased (P's lease of the request
        # above is released a moment after its answer).
        self.base_pools = {name: (0.0, 0.0, 0.0, 0.0) for name in cluster.metrics}
        assert self.check_after() == "", "the pools are not whole at the start"

    def normal(self):
        st, buf, _, _ = self.C.post("/v1/completions", self.gold_req)
        if st != 200:
            return None, buf[-300:]
        return json.loads(body_of(buf))["choices"][0]["text"], None

    def check_after(self):
        dead = alive(self.C)
        if dead:
            return f"DEAD {dead}"
        text, err = self.normal()
        if text != self.gold:
            return f"normal request broken: {text!r} {err!r}"
        deadline = time.time() + 5
        while True:
            pools = pool_state(self.C)
            if pools == self.base_pools:
                return ""
            if time.time() > deadline:
                return f"POOLS {pools} != {self.base_pools}"
            time.sleep(0.2)

    def run(self, name, fn):
        if self.only and self.only not in name:
            return
        t0 = time.time()
        try:
            status, info = fn()
        except Exception as e:  # noqa: BLE001 (a probe's own failure is a row too)
            status, info = "EXC", repr(e)[:200]
        dt = time.time() - t0
        after = self.check_after()
        info = info if isinstance(info, str) else repr(info)
        print(f"{name:45s} {str(status):6s} {dt:6.2f}s {info[:160]!s} {after}", flush=True)
        self.results.append((name, status, info, after))

    def flagged(self):
        return [r for r in self.results
                if r[3] or (isinstance(r[1], int) and r[1] >= 500) or "HANG" in str(r[1])
                or r[1] == "EXC"]

    # Requests: (status or "HANG<status>", the body's start).
    def post(self, path, body, headers="", timeout=30):
        st, buf, _, to = self.C.post(path, body, headers, timeout)
        return (st if not to else f"HANG{st}"), body_of(buf)[:240].decode(errors="replace")

    def raw(self, data, timeout=15, shut=False):
        st, buf, _, to = self.C.raw(data, timeout=timeout, shut=shut)
        return (st if not to else f"HANG{st}"), body_of(buf)[:200].decode(errors="replace")

    def get(self, path, headers=""):
        return self.raw(self.C.request_bytes("GET", path, b"", headers, content_length=False))

    def method(self, m, path):
        return self.raw(self.C.request_bytes(m, path, b"", ""))

    def comp(self, **kw):
        body = {"model": self.C.model, "prompt": "hello", "max_tokens": 4}
        body.update(kw)
        return lambda: self.post("/v1/completions", body)

    def chat(self, **kw):
        body = {"model": self.C.model, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4}
        body.update(kw)
        return lambda: self.post("/v1/chat/completions", body)

    def rawbody(self, path, data, timeout=30):
        return lambda: self.post(path, data, timeout=timeout)
