"""Helpers of tests/reliability/fault_probe.py (README.md there, "Fault probe"): a cluster
started by deploy/local/up.sh, tandem_cli clients whose every wait is bounded, and the checks
each case ends with (pools whole, leases expired, healthy again, serves).
Not a test: run by hand (root for the netns cases), bounded load, loopback only."""
import json
import os
import random
import signal
import subprocess
import threading
import time
import zlib

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))
BIN = os.environ.get("FAULT_PROBE_BIN", os.path.join(REPO, "bazel-bin"))
CLI = BIN + "/router/tandem_cli"
MODEL = REPO + "/tests/reliability/testdata/small/config.json"
RUN = os.environ.get("FAULT_PROBE_RUN", "/tmp/fault_probe")
HARD_CAP = 90.0  # a client call still open after this is a HANG


def sh(cmd, timeout=30):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


class Cluster:
    def __init__(self, run_dir, up_args, worker_flags=(), router_flags=(), model=MODEL,
                 vocab=1024):
        self.run_dir = run_dir
        self.vocab = vocab
        subprocess.run(["rm", "-rf", run_dir])
        args = [REPO + "/deploy/local/up.sh", "--load_format=dummy", "--dummy_config=" + model,
                "--run_dir=" + run_dir, "--bin_dir=" + BIN, "--timeout_s=90"] + list(up_args)
        args += ["--"] + list(worker_flags)
        r = subprocess.run(args, capture_output=True, text=True, timeout=200, cwd=REPO)
        if r.returncode != 0:
            raise RuntimeError("up.sh failed: " + r.stdout + r.stderr)
        self.certs = run_dir + "/certs"
        self.router = open(run_dir + "/router.port").read().strip()
        self.http = ("https://" + open(run_dir + "/http.port").read().strip()
                     if os.path.exists(run_dir + "/http.port") else None)
        self.pids = {}
        for line in open(run_dir + "/pids"):
            pid, name = line.split()
            self.pids[name] = int(pid)
        self.cmdlines = {n: self._cmdline(p) for n, p in self.pids.items()}
        if router_flags:
            self.restart("router", extra=list(router_flags))
        self.key = open(self.certs + "/api_key").read().strip()
        self.baseline_expired = {}

    def _cmdline(self, pid):
        with open("/proc/%d/cmdline" % pid) as f:
            return f.read().split("\0")[:-1]

    def address(self, name):
        return open("%s/%s.port" % (self.run_dir, name)).read().strip()

    def workers(self):
        return [n for n in self.pids if n != "router"]

    def alive(self, name):
        try:
            os.kill(self.pids[name], 0)
            st = open("/proc/%d/stat" % self.pids[name]).read().split()[2]
            return st != "Z"
        except (OSError, FileNotFoundError):
            return False

    def children(self, name):
        r = sh(["pgrep", "-P", str(self.pids[name])])
        return [int(x) for x in r.stdout.split()]

    def signal(self, name, sig):
        os.kill(self.pids[name], sig)

    def restart(self, name, extra=()):
        """Kill (if alive) and start `name` again with the same command line (same port for the
        router: its --listen names it)."""
        pid = self.pids[name]
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        for _ in range(100):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not os.path.exists("/proc/%d" % pid) or \
                    open("/proc/%d/stat" % pid).read().split()[2] == "Z":
                break
            time.sleep(0.05)
        argv = self.cmdlines[name]
        if name == "router":
            argv = [a for a in argv if not a.startswith("--listen=") and
                    not a.startswith("--internal_listen=")]
            argv += ["--listen=" + self.router,
                     "--internal_listen=" + open(self.run_dir + "/internal.port").read().strip()]
            argv += list(extra)
            self.cmdlines[name] = argv
        log = open("%s/%s.log" % (self.run_dir, name), "a")
        p = subprocess.Popen(argv, stdout=log, stderr=log, cwd=REPO, start_new_session=True)
        self.pids[name] = p.pid
        self.popen = getattr(self, "popen", {})
        self.popen[name] = p
        with open(self.run_dir + "/pids", "a") as f:
            f.write("%d %s\n" % (p.pid, name))

    def stats(self, name, timeout=5):
        c = self.certs
        try:
            r = sh([CLI, "stats", "--worker=" + self.address(name), "--tls_ca=" + c + "/ca.pem",
                    "--tls_cert=" + c + "/admin.pem", "--tls_key=" + c + "/admin.key", "--json"],
                   timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)

    def workers_listed(self):
        c = self.certs
        try:
            r = sh([CLI, "workers", "--router=" + self.router, "--tls_ca=" + c + "/ca.pem",
                    "--api_key=" + open(c + "/admin_api_key").read().strip(), "--json"], timeout=5)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)["workers"]

    def wait_healthy(self, timeout=40, stale=None):
        """Every worker listed healthy; `stale` ({id: epoch}): not in those (killed) incarnations,
        which stay listed healthy until a call finds them dead or their heartbeats time out."""
        stale = stale or {}
        t0 = time.time()
        while time.time() - t0 < timeout:
            ws = self.workers_listed()
            if ws is not None and len([w for w in ws if w["healthy"] and
                                       stale.get(w["worker_id"]) != w["epoch"]]) \
                    >= len(self.workers()):
                return time.time() - t0
            time.sleep(0.2)
        return None

    def pool_state(self, name):
        s = self.stats(name)
        if s is None:
            return None
        ld = s["load"]
        return dict(free=ld.get("kv_blocks_free", 0), total=ld.get("kv_blocks_total", 0),
                    leased=ld.get("kv_blocks_leased", 0), running=ld.get("num_running", 0),
                    waiting=ld.get("num_waiting", 0),
                    expired=int(s.get("leases_expired", "0")),
                    failures=int(s.get("kv_load_failures", "0")),
                    recomputes=int(s.get("kv_recomputes", "0")),
                    status=s.get("status"))

    def wait_whole(self, timeout=40, only=None):
        """Seconds until every live worker's pool is whole, or (None, states)."""
        t0 = time.time()
        states = {}
        while time.time() - t0 < timeout:
            ok = True
            for w in (only if only is not None else self.workers()):
                if not self.alive(w):
                    continue
                st = self.pool_state(w)
                states[w] = st
                if st is None or st["free"] != st["total"] or st["leased"] or st["running"] or \
                        st["waiting"]:
                    ok = False
            if ok:
                return time.time() - t0, states
            time.sleep(0.1)
        return None, states

    def expired(self):
        out = {}
        for w in self.workers():
            if self.alive(w):
                st = self.pool_state(w)
                out[w] = st["expired"] if st else -1
        return out

    def down(self):
        for name, pid in self.pids.items():
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
            for c in (self.children(name) if self.alive(name) else []):
                try:
                    os.kill(c, signal.SIGCONT)
                except OSError:
                    pass
        sh([REPO + "/deploy/local/down.sh", self.run_dir, "--grace_s=5"], timeout=60)


class Gen:
    """One tandem_cli generate, its tokens read as they stream."""

    def __init__(self, cluster, seed, prompt_len, max_tokens, timeout_ms=60000):
        rng = random.Random(seed)
        ids = ",".join(str(rng.randrange(3, cluster.vocab)) for _ in range(prompt_len))
        env = dict(os.environ, TANDEM_API_KEY=cluster.key)
        argv = [CLI, "generate", "--router=" + cluster.router,
                "--tls_ca=" + cluster.certs + "/ca.pem", "--prompt_ids=" + ids,
                "--max_tokens=%d" % max_tokens, "--ignore_eos", "--timeout_ms=%d" % timeout_ms]
        self.t0 = time.time()
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.tokens = []
        self.buf = ""
        self.err = ""
        self.ended = None
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self):
        self.p.wait()
        self.ended = time.time()

    def _read(self):
        while True:
            ch = self.p.stdout.read(1)
            if not ch:
                break
            ch = ch.decode()
            with self.lock:
                if ch in " \n":
                    if self.buf:
                        self.tokens.append(int(self.buf))
                    self.buf = ""
                else:
                    self.buf += ch

    def _read_err(self):
        self.err = self.p.stderr.read().decode()

    def ntokens(self):
        with self.lock:
            return len(self.tokens)

    def wait_tokens(self, n, timeout=30):
        t = time.time()
        while time.time() - t < timeout:
            if self.ntokens() >= n or self.p.poll() is not None:
                return self.ntokens() >= n
            time.sleep(0.002)
        return False

    def finish(self, cap=HARD_CAP):
        """(outcome, seconds since start, tokens, error line). HANG when open past `cap`."""
        try:
            rc = self.p.wait(timeout=max(0.0, cap - (time.time() - self.t0)))
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return "HANG", time.time() - self.t0, self.ntokens(), ""
        time.sleep(0.05)
        took = (self.ended or time.time()) - self.t0
        err = [l for l in self.err.splitlines() if l.strip()]
        line = err[-1] if err else ""
        return ("OK" if rc == 0 else "ERR"), took, self.ntokens(), line


class Sse:
    """curl of a streamed chat completion; lines with their arrival times."""

    def __init__(self, c, max_tokens, stream=True):
        body = json.dumps({"model": "demo-text", "stream": stream, "max_tokens": max_tokens,
                           "ignore_eos": True, "messages": [{"role": "user", "content": "Hi"}]})
        self.t0 = time.time()
        self.p = subprocess.Popen(
            ["curl", "-sS", "-N", "--max-time", str(int(HARD_CAP)), "--cacert",
             c.certs + "/ca.pem", c.http + "/v1/chat/completions", "-H",
             "Authorization: Bearer " + c.key, "-H", "Content-Type: application/json",
             "-d", body, "-w", "\nHTTP %{http_code}\n"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines = []
        self.ended = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append((time.time(), line.decode(errors="replace").strip()))
        self.p.wait()
        self.ended = time.time()

    def chunks(self):
        return len([l for _, l in self.lines if l.startswith("data: {")])

    def wait_chunks(self, n, timeout=30):
        t = time.time()
        while time.time() - t < timeout and self.chunks() < n and self.ended is None:
            time.sleep(0.005)

    def finish(self):
        while self.ended is None and time.time() - self.t0 < HARD_CAP + 5:
            time.sleep(0.01)
        tail = [l for _, l in self.lines if l][-3:]
        return self.ended, tail


def row(case, **kv):
    print("ROW %-40s %s" % (case, " ".join("%s=%s" % (k, v) for k, v in kv.items())), flush=True)


def fmt(x):
    return "never" if x is None else "%.2fs" % x


def wait_load(c, w, field, timeout=10):
    """Polls `w`'s pool state until `field` ("running", "leased") is positive."""
    t = time.time()
    while time.time() - t < timeout:
        st = c.pool_state(w)
        if st and st[field] > 0:
            return True
        time.sleep(0.005)
    return False


def wait_running(c, w, timeout=10):
    return wait_load(c, w, "running", timeout)


def busy_worker(c, role, timeout=10):
    t = time.time()
    while time.time() - t < timeout:
        for w in c.workers():
            if w.startswith(role):
                st = c.pool_state(w)
                if st and st["running"] > 0:
                    return w
        time.sleep(0.005)
    return None


def serves(c, seed=1):
    g = Gen(c, seed, 30, 8, timeout_ms=20000)
    out, took, n, err = g.finish(30)
    return "%s(%d)" % (out, n) if out == "OK" else "%s(%d: %s)" % (out, n, err[:150])


def after(c, case, restart=None):
    """Restart what died, then: pools whole, leases expired, healthy, serves."""
    stale = {}
    if restart:
        if restart != "router":
            stale = {w["worker_id"]: w["epoch"] for w in c.workers_listed() or []
                     if w["worker_id"] == restart}
        c.restart(restart)
    healthy = c.wait_healthy(60, stale)
    whole, states = c.wait_whole(40)
    exp = c.expired()
    row(case + " /after", healthy=fmt(healthy), whole=fmt(whole), expired=exp,
        serves=serves(c), states="" if whole is not None else states)


def fault_at(c, case, victim, sig, prompt, max_tokens, when, hold=0.0, restart=False,
             victim_pid=None, timeout_ms=60000):
    """Starts a stream, hits `victim` with `sig` at `when` ("running:W", "tokens:N"), holds a
    SIGSTOP for `hold` seconds, then reports the client's outcome and recovery."""
    g = Gen(c, zlib.crc32(case.encode()) & 0xffff, prompt, max_tokens, timeout_ms=timeout_ms)
    kind, arg = when.split(":")
    if kind == "running":
        hit = wait_running(c, arg)
    elif kind == "leased":  # P granted the lease: D is reading the KV (until it releases it)
        hit = wait_load(c, arg, "leased")
    else:
        hit = g.wait_tokens(int(arg))
    pid = victim_pid if victim_pid else c.pids[victim]
    t_fault = time.time()
    tokens_at_fault = g.ntokens()
    os.kill(pid, sig)
    res = None
    if sig == signal.SIGSTOP:
        # The client must be answered while the peer is still stopped.
        while time.time() - t_fault < hold and g.p.poll() is None:
            time.sleep(0.01)
        answered_stopped = g.p.poll() is not None
        if answered_stopped:
            res = g.finish()
        # Pools of the others while it is stopped.
        others = [w for w in c.workers() if w != victim]
        whole_others, st = c.wait_whole(max(0.5, hold - (time.time() - t_fault)), only=others)
        rest = hold - (time.time() - t_fault)
        if rest > 0:
            time.sleep(rest)
        try:
            os.kill(pid, signal.SIGCONT)
            fenced = False
        except ProcessLookupError:
            fenced = True  # its group killed it while it was stopped
        t_cont = time.time()
        if res is None:
            res = g.finish()
        out, took, n, err = res
        row(case, hit=hit, at=tokens_at_fault, client=out, answered=fmt(g.t0 + took - t_fault),
            tokens="%d/%d" % (n, max_tokens), others_whole_while_stopped=fmt(whole_others),
            stopped_pid_gone_at_cont=fenced,
            err='"%s"' % err[:100])
        whole, states = c.wait_whole(40)
        row(case + " /cont", whole_after_cont=fmt(None if whole is None else time.time() - t_cont),
            states="" if whole is not None else states)
        after(c, case)
    else:
        out, took, n, err = g.finish()
        row(case, hit=hit, at=tokens_at_fault, client=out, answered=fmt(g.t0 + took - t_fault),
            tokens="%d/%d" % (n, max_tokens), err='"%s"' % err[:100])
        whole, states = c.wait_whole(40)
        row(case + " /survivors", whole=fmt(whole), expired=c.expired(),
            states="" if whole is not None else states)
        after(c, case, restart=victim if restart else None)


def pd_cluster(name, extra_up=(), flags=()):
    return Cluster(RUN + "/" + name, ["--prefill=1", "--decode=1"] + list(extra_up),
                   worker_flags=["--max_num_batched_tokens=256", "--kv_load_timeout_ms=3000",
                                 "--ucx_tls=tcp"] + list(flags))


def listening_ports(pid):
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in open("/proc/%d/net/%s" % (pid, table)).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.add(int(f[1].split(":")[1], 16))
    return sorted(ports)


def drop(ports, on):
    """Drops every loopback packet to or from `ports` (this netns only): an htb class whose
    bfifo holds 0 bytes; everything else through an 80 Mbit/s class (KV reads last ~0.5 s)."""
    if on:
        for port in ports:
            for field in ("dport", "sport"):
                r = sh(["tc", "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip",
                        "prio", "1", "u32", "match", "ip", field, str(port), "0xffff",
                        "flowid", "1:2"])
                assert r.returncode == 0, r.stderr
    else:
        sh(["tc", "filter", "del", "dev", "lo", "parent", "1:", "prio", "1"])


def setup_netns_qdisc():
    sh(["tc", "qdisc", "del", "dev", "lo", "root"])
    for cmd in (["qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1"],
                ["class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate",
                 "80mbit"],
                ["class", "add", "dev", "lo", "parent", "1:", "classid", "1:2", "htb", "rate",
                 "8bit"],
                ["qdisc", "add", "dev", "lo", "parent", "1:2", "handle", "20:", "bfifo", "limit",
                 "0"]):
        r = sh(["tc"] + cmd)
        assert r.returncode == 0, r.stderr


def drop_case(c, case, victim, ports, prompt, max_tokens, when, hold):
    # The router may still hold the last case's victim out (its penalty after a failure).
    deadline = time.time() + 15
    while not serves(c).startswith("OK") and time.time() < deadline:
        time.sleep(0.5)
    g = Gen(c, zlib.crc32(case.encode()) & 0xffff, prompt, max_tokens)
    g.wait_tokens(int(when))
    t = time.time()
    at = g.ntokens()
    drop(ports, True)
    while time.time() - t < hold and g.p.poll() is None:
        time.sleep(0.01)
    answered_during = g.p.poll() is not None
    others = [w for w in c.workers() if w != victim]
    whole_others, _ = c.wait_whole(max(0.5, hold - (time.time() - t)), only=others)
    time.sleep(max(0, hold - (time.time() - t)))
    drop(ports, False)
    tu = time.time()
    out, took, n, err = g.finish()
    row(case, at=at, client=out, answered=fmt(g.t0 + took - t), during_drop=answered_during,
        tokens="%d/%d" % (n, max_tokens), others_whole_during=fmt(whole_others),
        err='"%s"' % err[:100])
    whole, states = c.wait_whole(40)
    row(case + " /undrop", whole_after=fmt(None if whole is None else time.time() - tu),
        states="" if whole is not None else states)
    after(c, case)
