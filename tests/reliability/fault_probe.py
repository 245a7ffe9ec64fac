#!/usr/bin/env python3
"""Outside-style fault probe of real deployments (tests/reliability/README.md, "Fault probe").

Each case brings up a cluster with deploy/local/up.sh (TLS and API keys on, the small random
model, workers on 127.0.0.1), hits one process with SIGKILL / SIGSTOP (held past the deadlines,
then SIGCONT) or drops its packets, and prints one ROW per observation: what the client got and
when, whether the survivors' KV pools and leases came back (and how many leases expired), whether
the cluster is healthy again and serves. Every client call is bounded (HANG after 90 s).

  python3 tests/reliability/fault_probe.py CASE...       (as root; CASES below)

Binaries from bazel-bin (FAULT_PROBE_BIN=DIR to use a copy: builds elsewhere replace them);
runs in FAULT_PROBE_RUN (/tmp/fault_probe). Cases in NETNS run in a network namespace of their
own (unshare -n; its lo shaped by tc: 80 Mbit/s so KV reads last long enough to be hit, and an
htb class whose 0-byte bfifo drops the packets of chosen ports). `http` needs out/demo-text
(deploy/quickstart.sh writes it). Not a test: minutes of wall time, kills only what it started.
"""
import os
import signal
import subprocess
import sys
import time
import zlib

from fault_probe_lib import (RUN, REPO, Cluster, Gen, Sse, after, busy_worker, drop, drop_case,
                             fault_at, fmt, listening_ports, pd_cluster, row, serves,
                             setup_netns_qdisc, wait_running)


def case_pd():
    c = pd_cluster("pd")
    K, S = signal.SIGKILL, signal.SIGSTOP
    try:
        serves(c)
        fault_at(c, "P kill before publish (prefill)", "prefill-0", K, 1500, 40, "running:prefill-0",
                 restart=True)
        fault_at(c, "P kill at first token (D pulls)", "prefill-0", K, 1500, 40, "tokens:1",
                 restart=True)
        fault_at(c, "P kill after publish (mid-decode)", "prefill-0", K, 200, 2000, "tokens:20",
                 restart=True)
        fault_at(c, "D kill during pull", "decode-0", K, 1500, 40, "tokens:1", restart=True)
        fault_at(c, "D kill mid-decode", "decode-0", K, 200, 3000, "tokens:20", restart=True)
        fault_at(c, "P stop during pull 10s", "prefill-0", S, 1500, 40, "tokens:1", hold=10)
        fault_at(c, "P stop after publish 10s", "prefill-0", S, 200, 3800, "tokens:20", hold=10)
        fault_at(c, "D stop during pull 10s", "decode-0", S, 1500, 40, "tokens:1", hold=10)
        fault_at(c, "D stop mid-decode 10s", "decode-0", S, 200, 3800, "tokens:20", hold=10)
        fault_at(c, "P stop during prefill 10s", "prefill-0", S, 1500, 40, "running:prefill-0",
                 hold=10)
    finally:
        c.down()


def case_router():
    c = pd_cluster("rt")
    try:
        serves(c)
        gs = [Gen(c, 10 + i, 100, 3000) for i in range(3)]
        for g in gs:
            g.wait_tokens(5)
        t = time.time()
        c.signal("router", signal.SIGKILL)
        res = [g.finish() for g in gs]
        row("router kill, 3 streams", clients=[(r[0], r[2]) for r in res],
            answered=fmt(max(g.t0 + r[1] for g, r in zip(gs, res)) - t), err='"%s"' % res[0][3][:80])
        whole, st = c.wait_whole(40)
        row("router kill /workers", whole=fmt(whole), expired=c.expired())
        after(c, "router kill", restart="router")
        gs = [Gen(c, 20 + i, 100, 3000, timeout_ms=4000) for i in range(3)]
        for g in gs:
            g.wait_tokens(5)
        t = time.time()
        c.signal("router", signal.SIGSTOP)
        res = [g.finish() for g in gs]
        g2 = Gen(c, 30, 10, 2, timeout_ms=2000)
        r2 = g2.finish()
        time.sleep(max(0, 10 - (time.time() - t)))
        whole_stopped, st = c.wait_whole(1)
        c.signal("router", signal.SIGCONT)
        tc = time.time()
        whole, st = c.wait_whole(40)
        row("router stop 10s, 3 streams (4 s deadline)", clients=[(r[0], r[2]) for r in res],
            answered=fmt(max(g.t0 + r[1] for g, r in zip(gs, res)) - t), new_client=r2[0],
            workers_whole_while_stopped=fmt(whole_stopped),
            whole_after_cont=fmt(None if whole is None else time.time() - tc),
            err='"%s"' % res[0][3][:80])
        after(c, "router stop")
    finally:
        c.down()


def case_mixed():
    c = Cluster(RUN + "/mx", ["--prefill=0", "--decode=0", "--mixed=1"],
                worker_flags=["--max_num_batched_tokens=256"])
    try:
        serves(c)
        fault_at(c, "mixed kill during prefill", "mixed-0", signal.SIGKILL, 1500, 40,
                 "running:mixed-0", restart=True)
        fault_at(c, "mixed kill mid-decode", "mixed-0", signal.SIGKILL, 200, 3000, "tokens:20",
                 restart=True)
        fault_at(c, "mixed stop mid-decode 10s", "mixed-0", signal.SIGSTOP, 200, 3800,
                 "tokens:20", hold=10)
    finally:
        c.down()


def case_tp():
    c = pd_cluster("tp", ["--prefill_tp=2", "--decode_tp=2"], ["--dist_timeout_s=3"])
    try:
        serves(c)
        for victim, sig, when, hold in [
                ("prefill-0", signal.SIGKILL, "running:prefill-0", 0),
                ("decode-0", signal.SIGKILL, "tokens:1", 0),
                ("prefill-0", signal.SIGSTOP, "running:prefill-0", 10),
                ("decode-0", signal.SIGSTOP, "tokens:1", 10)]:
            kids = c.children(victim)
            name = "%s rank1 %s %s" % (victim, "kill" if sig == signal.SIGKILL else "stop",
                                       when.split(":")[0])
            fault_at(c, name, victim, sig, 1500, 40, when, hold=hold, victim_pid=kids[0])
    finally:
        c.down()


def case_rank0():
    """Rank 0 of a TP group killed / stopped: does its rank 1 go away (no orphan)?"""
    c = pd_cluster("rank0", ["--prefill_tp=2", "--decode_tp=2"], ["--dist_timeout_s=3"])
    try:
        serves(c)
        for victim, sig, when, hold in [("decode-0", signal.SIGKILL, "tokens:20", 0),
                                        ("prefill-0", signal.SIGKILL, "running:prefill-0", 0),
                                        ("decode-0", signal.SIGSTOP, "tokens:20", 10),
                                        ("prefill-0", signal.SIGSTOP, "running:prefill-0", 10)]:
            kids = c.children(victim)
            name = "%s rank0 %s" % (victim, "kill" if sig == signal.SIGKILL else "stop 10s")
            max_tokens = 3000 if victim == "decode-0" else 40
            prompt = 200 if victim == "decode-0" else 1500
            t = time.time()
            if sig == signal.SIGKILL:
                g = Gen(c, 5, prompt, max_tokens)
                kind, arg = when.split(":")
                if kind == "running":
                    wait_running(c, arg)
                else:
                    g.wait_tokens(int(arg))
                t = time.time()
                c.signal(victim, sig)
                out, took, n, err = g.finish()
                gone = None
                while time.time() - t < 30:
                    if not any(os.path.exists("/proc/%d" % k) and
                               open("/proc/%d/stat" % k).read().split()[2] != "Z" for k in kids):
                        gone = time.time() - t
                        break
                    time.sleep(0.05)
                row(name, client=out, answered=fmt(g.t0 + took - t), rank1_gone=fmt(gone),
                    err='"%s"' % err[:90])
                after(c, name, restart=victim)
            else:
                fault_at(c, name, victim, sig, prompt, max_tokens, when, hold=hold)
                row(name + " /rank1", before=kids, now=c.children(victim),
                    rank0_pid_same=c.alive(victim))
    finally:
        c.down()


def case_mixed_tp():
    c = Cluster(RUN + "/mxtp", ["--prefill=0", "--decode=0", "--mixed=1", "--mixed_tp=2"],
                worker_flags=["--max_num_batched_tokens=256", "--dist_timeout_s=3"])
    try:
        serves(c)
        for name, sig, rank, when, hold in [
                ("mixed tp=2 rank1 kill in chunked prefill", signal.SIGKILL, 1, "running", 0),
                ("mixed tp=2 rank0 stop 10s mid-decode", signal.SIGSTOP, 0, "tokens:20", 10),
                ("mixed tp=2 rank1 stop 10s mid-decode", signal.SIGSTOP, 1, "tokens:20", 10)]:
            pid = c.pids["mixed-0"] if rank == 0 else c.children("mixed-0")[0]
            w = "running:mixed-0" if when == "running" else when
            fault_at(c, name, "mixed-0", sig, 1500 if when == "running" else 200,
                     40 if when == "running" else 3000, w, hold=hold, victim_pid=pid)
            row(name + " /group", rank0_alive=c.alive("mixed-0"), ranks=c.children("mixed-0"))
    finally:
        c.down()


def case_dfirst():
    c = pd_cluster("dfirst")
    try:
        serves(c)
        fault_at(c, "D stop 40s while P prefills", "decode-0", signal.SIGSTOP, 1500, 40,
                 "running:prefill-0", hold=40)
        fault_at(c, "D kill while P prefills", "decode-0", signal.SIGKILL, 1500, 40,
                 "running:prefill-0", restart=True)
    finally:
        c.down()


def case_two():
    """2 P + 2 D: does the router retry on the other worker?"""
    c = Cluster(RUN + "/two", ["--prefill=2", "--decode=2"],
                worker_flags=["--max_num_batched_tokens=256", "--kv_load_timeout_ms=3000",
                              "--ucx_tls=tcp"])
    try:
        serves(c)
        for name, role, sig, hold, when in [
                ("2P2D: busy P kill during prefill", "prefill", signal.SIGKILL, 0, "running"),
                ("2P2D: busy P stop 10s during prefill", "prefill", signal.SIGSTOP, 10, "running"),
                ("2P2D: busy D kill at first token", "decode", signal.SIGKILL, 0, "tokens"),
                ("2P2D: busy D stop 10s during P's prefill", "decode", signal.SIGSTOP, 10,
                 "dstop")]:
            g = Gen(c, zlib.crc32(name.encode()) & 0xffff, 1500, 40)
            if when == "running":
                victim = busy_worker(c, role)
            elif when == "tokens":
                g.wait_tokens(1)
                victim = busy_worker(c, role)
            else:
                busy_worker(c, "prefill")
                victim = "decode-%d" % (zlib.crc32(name.encode()) & 1)
            t = time.time()
            if victim is None:
                row(name, victim=None)
                g.finish()
                continue
            c.signal(victim, sig)
            while sig == signal.SIGSTOP and time.time() - t < hold and g.ended is None:
                time.sleep(0.01)
            if sig == signal.SIGSTOP:
                time.sleep(max(0, hold - (time.time() - t)))
                c.signal(victim, signal.SIGCONT)
            out, took, n, err = g.finish()
            row(name, victim=victim, client=out, answered=fmt(g.t0 + took - t), tokens=n,
                err='"%s"' % err[:110])
            after(c, name, restart=victim if sig == signal.SIGKILL else None)
    finally:
        c.down()


def case_http():
    c = Cluster(RUN + "/http", ["--prefill=1", "--decode=1", "--http_port=0",
                                 "--http_model=" + REPO + "/out/demo-text"],
                worker_flags=["--kv_load_timeout_ms=3000"],
                model=REPO + "/out/demo-text/config.json")
    try:
        for name, victim, sig, hold, restart in [
                ("HTTP SSE: D kill mid-stream", "decode-0", signal.SIGKILL, 0, True),
                ("HTTP SSE: D stop 10s mid-stream", "decode-0", signal.SIGSTOP, 10, False),
                ("HTTP SSE: P stop 10s mid-stream", "prefill-0", signal.SIGSTOP, 10, False),
                ("HTTP SSE: router kill mid-stream", "router", signal.SIGKILL, 0, True)]:
            sse = Sse(c, 3800)
            sse.wait_chunks(20)
            at = sse.chunks()
            t = time.time()
            c.signal(victim, sig)
            while sig == signal.SIGSTOP and time.time() - t < hold and sse.ended is None:
                time.sleep(0.01)
            ended_during = sse.ended is not None
            if sig == signal.SIGSTOP:
                time.sleep(max(0, hold - (time.time() - t)))
                c.signal(victim, signal.SIGCONT)
            ended, tail = sse.finish()
            row(name, at=at, chunks=sse.chunks(), ended=fmt(None if ended is None else ended - t),
                ended_while_stopped=ended_during, tail=tail)
            after(c, name, restart=victim if restart else None)
            if victim == "router":
                time.sleep(0.5)
        # Whole (not streamed) completion while D is killed.
    finally:
        c.down()


def case_client():
    """A stuck client (tandem_cli SIGSTOPped mid-stream) and a silent one (its packets to the
    router's public port dropped, in a netns): how long do the router and workers hold it?"""
    c = pd_cluster("client")
    try:
        serves(c)
        for how in ("stop", "drop"):
            if how == "drop":
                setup_netns_qdisc()
            g = Gen(c, 77, 200, 3800, timeout_ms=600000)
            g.wait_tokens(20)
            t = time.time()
            if how == "stop":
                g.p.send_signal(signal.SIGSTOP)
            else:
                drop([int(c.router.split(":")[1])], True)
            whole = None
            samples = []
            while time.time() - t < 60:
                st = c.pool_state("decode-0")
                samples.append((round(time.time() - t, 1), st["running"], st["free"]))
                if st["running"] == 0 and st["free"] == st["total"]:
                    whole = time.time() - t
                    break
                time.sleep(2)
            if how == "stop":
                g.p.send_signal(signal.SIGCONT)
            else:
                drop([], False)
            out, took, n, err = g.finish()
            row("client %s 60s mid-stream" % how, d_whole_during=fmt(whole),
                samples=samples[:3] + samples[-2:], client=out, tokens="%d/3800" % n,
                err='"%s"' % err[:80])
            after(c, "client " + how)
    finally:
        drop([], False)
        c.down()


def case_pull():
    """D reading the KV: the fault comes once P has granted the lease (D reads until it releases
    it); the netns loopback at 80 Mbit/s makes a 2000-token read last ~0.8 s. 1 P + 1 D, then a
    P --tp=2 group read by a D of one rank (re-sharded by heads)."""
    setup_netns_qdisc()
    K, S = signal.SIGKILL, signal.SIGSTOP
    for tag, up, flags in [("", [], []),
                           ("P tp=2 -> D: ", ["--prefill_tp=2", "--decode_tp=1"],
                            ["--dist_timeout_s=3"])]:
        c = pd_cluster("pull", up, flags)
        try:
            serves(c)
            for name, victim, rank, sig, hold in [
                    ("P kill during pull", "prefill-0", 0, K, 0),
                    ("P stop 10s during pull", "prefill-0", 0, S, 10),
                    ("P rank 1 kill during pull", "prefill-0", 1, K, 0),
                    ("P rank 1 stop 10s during pull", "prefill-0", 1, S, 10),
                    ("D kill during pull", "decode-0", 0, K, 0),
                    ("D stop 40s during pull", "decode-0", 0, S, 40)]:
                if (rank == 1) != bool(tag):
                    continue
                pid = c.children(victim)[0] if rank == 1 else c.pids[victim]
                fault_at(c, tag + name, victim, sig, 2000, 40, "leased:prefill-0", hold=hold,
                         restart=sig == K and rank == 0, victim_pid=pid)
                d = c.pool_state("decode-0")
                row(tag + name + " /D so far", load_failures=d["failures"],
                    recomputes=d["recomputes"])
        finally:
            c.down()


def case_net():
    """Inside a netns: tc drops (u32 match on ports, action drop) on lo, bounded."""
    setup_netns_qdisc()
    c = pd_cluster("net")
    try:
        serves(c)
        p_grpc = int(c.address("prefill-0").split(":")[1])
        d_grpc = int(c.address("decode-0").split(":")[1])
        p_kv = [x for x in listening_ports(c.pids["prefill-0"]) if x != p_grpc]
        d_all = listening_ports(c.pids["decode-0"])
        row("ports", p_grpc=p_grpc, p_kv=p_kv, d=d_all)
        drop_case(c, "drop P's KV ports 10s during pull", "prefill-0", p_kv, 1500, 40, 1, 10)
        drop_case(c, "drop D's gRPC port 10s mid-decode", "decode-0", [d_grpc], 200, 3800, 20, 10)
        drop_case(c, "drop P's gRPC port 10s during prefill", "prefill-0", [p_grpc], 1500, 40, 0, 10)
        drop_case(c, "drop all of D 10s during pull", "decode-0", d_all, 1500, 40, 1, 10)
        drop_case(c, "drop router 10s mid-decode", "router", [int(c.router.split(":")[1])],
                  200, 3800, 20, 10)
    finally:
        drop([], False)
        c.down()


def case_many():
    """2P2D, 8 streams at once: one D killed / P stopped while they run; then the internal
    port dropped 10 s (no heartbeats get through) and given back."""
    setup_netns_qdisc()
    c = Cluster(RUN + "/many", ["--prefill=2", "--decode=2"],
                worker_flags=["--max_num_batched_tokens=256", "--kv_load_timeout_ms=3000",
                              "--ucx_tls=tcp"])
    try:
        serves(c)
        for name, victim, sig, hold in [("8 streams: decode-1 kill", "decode-1", signal.SIGKILL, 0),
                                        ("8 streams: prefill-0 stop 10s", "prefill-0",
                                         signal.SIGSTOP, 10),
                                        ("8 streams: decode-0 stop 10s", "decode-0",
                                         signal.SIGSTOP, 10)]:
            gs = [Gen(c, 100 + i, 300 + 150 * i, 400) for i in range(8)]
            time.sleep(0.4)
            t = time.time()
            c.signal(victim, sig)
            if sig == signal.SIGSTOP:
                time.sleep(hold)
                c.signal(victim, signal.SIGCONT)
            res = [g.finish() for g in gs]
            outs = {}
            for r in res:
                key = r[0] if r[0] == "OK" else r[3].split(":")[1].strip() if ":" in r[3] else r[3]
                outs[key] = outs.get(key, 0) + 1
            row(name, outcomes=outs, last_answer=fmt(max(g.ended or 0 for g in gs) - t))
            after(c, name, restart=victim if sig == signal.SIGKILL else None)
        internal = int(open(c.run_dir + "/internal.port").read().split(":")[1])
        drop([internal], True)
        time.sleep(10)
        ws = c.workers_listed()
        drop([], False)
        row("internal port dropped 10s", healthy_during=[w["worker_id"] for w in ws if w["healthy"]]
            if ws else None)
        after(c, "internal port dropped 10s")
    finally:
        drop([], False)
        c.down()



def case_dp():
    """A mixed --tp=2 --dp_attention group (tiny-moe): chunked prompts on both DP ranks, a rank
    killed / stopped mid-step."""
    c = Cluster(RUN + "/dp", ["--prefill=0", "--decode=0", "--mixed=1", "--mixed_tp=2",
                              "--mixed_dp_attention"],
                worker_flags=["--max_num_batched_tokens=64", "--dist_timeout_s=3"],
                model="tiny-moe", vocab=256)
    try:
        gs = [Gen(c, 40 + i, 150 + 40 * i, 20, timeout_ms=30000) for i in range(4)]
        res = [g.finish() for g in gs]
        row("dp: 4 chunked prompts at once", clients=[(r[0], r[2]) for r in res],
            err='"%s"' % res[0][3][:80])
        after(c, "dp chunked")
        for name, sig, rank, hold in [("dp rank1 kill mid-decode", signal.SIGKILL, 1, 0),
                                      ("dp rank0 stop 10s mid-decode", signal.SIGSTOP, 0, 10)]:
            pid = c.pids["mixed-0"] if rank == 0 else c.children("mixed-0")[0]
            fault_at(c, name, "mixed-0", sig, 100, 1500, "tokens:10", hold=hold, victim_pid=pid)
    finally:
        c.down()


CASES = dict(dp=case_dp, pd=case_pd, router=case_router, mixed=case_mixed, tp=case_tp, rank0=case_rank0,
             mixed_tp=case_mixed_tp, dfirst=case_dfirst, two=case_two, http=case_http,
             client=case_client, pull=case_pull, net=case_net, many=case_many)
NETNS = {"pull", "net", "many", "client"}


def main(argv):
    if argv and argv[0] == "--in_netns":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        argv = argv[1:]
    elif any(a in NETNS for a in argv):
        # A namespace of our own: tc and drops touch nobody else's loopback.
        return subprocess.run(["unshare", "-n", sys.executable, os.path.realpath(__file__),
                               "--in_netns"] + argv).returncode
    for name in argv:
        if name not in CASES:
            print("unknown case %s; cases: %s" % (name, " ".join(CASES)))
            return 2
        print("== case", name, time.strftime("%H:%M:%S"), flush=True)
        CASES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
