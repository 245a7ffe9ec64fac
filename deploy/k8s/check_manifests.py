#!/usr/bin/env python3
"""Cross-checks rendered Tandem manifests against the real binaries (used by validate.sh).

  check_manifests.py manifests RENDERED.yaml BIN_DIR   # one overlay's `kubectl kustomize` output
  check_manifests.py dockerfile Dockerfile REPO_ROOT BIN_DIR MANIFEST.yaml...

Prints one "PASS <what>" or "FAIL <what>: <why>" line per check; exits 1 if any failed.

manifests: per container, the command maps to BIN_DIR/runtime/tandem_worker or
BIN_DIR/router/tandem_router; $(VAR) references are resolved the way the kubelet does (env
values, ConfigMap keys and envFrom from the rendered ConfigMaps, downward-API fields get dummy
values) and the binary runs with the args plus --version: absl parses and checks every flag
(an unknown flag or a bad value exits 1) before --version exits 0, without starting the daemon.
Also: containerPorts = the ports the --*listen flags bind (on a wildcard host), probes and
Services name existing ports, Services never expose a --metrics_listen port,
terminationGracePeriodSeconds covers preStop + drain, nvidia.com/gpu = --tp on cuda, --model
lies on a mounted volume.
dockerfile: every COPY source exists (build context: REPO_ROOT; the build stage's staged
binaries: BIN_DIR), every binary's shared libraries resolve (ldd), and every container command
in the manifests is a path the Dockerfile installs.
"""
import math
import re
import shlex
import subprocess
import sys

import yaml

BINARIES = {"tandem_worker": "runtime/tandem_worker", "tandem_router": "router/tandem_router"}
# What a downward-API field would hold in a pod.
FIELD_DUMMIES = {"status.podIP": "10.1.2.3", "metadata.name": "pod-0",
                 "metadata.namespace": "tandem", "spec.nodeName": "node-0"}
# Time a daemon needs past its drain (worker: gRPC shutdown 2 s) plus slack.
GRACE_MARGIN_S = 5

failures = 0


def report(ok, what, why=""):
    global failures
    if ok:
        print(f"PASS {what}")
    else:
        failures += 1
        print(f"FAIL {what}: {why}")


def expand(text, env):
    """Kubernetes $(VAR) expansion: $$ escapes, unknown references stay as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def container_env(c, configmaps):
    env = {}
    for src in c.get("envFrom", []):
        ref = src.get("configMapRef")
        if ref:
            env.update((src.get("prefix", "") + k, v)
                       for k, v in configmaps.get(ref["name"], {}).items())
    for e in c.get("env", []):
        vf = e.get("valueFrom")
        if vf is None:
            env[e["name"]] = expand(e.get("value", ""), env)
        elif "fieldRef" in vf:
            env[e["name"]] = FIELD_DUMMIES.get(vf["fieldRef"]["fieldPath"], "x")
        elif "configMapKeyRef" in vf:
            ref = vf["configMapKeyRef"]
            env[e["name"]] = configmaps.get(ref["name"], {}).get(ref["key"], f"$({e['name']})")
    return env


def flags_of(args):
    out = {}
    for a in args:
        m = re.match(r"--?([A-Za-z0-9_]+)(?:=(.*))?$", a)
        if m:
            out[m.group(1)] = m.group(2) if m.group(2) is not None else "true"
    return out


def listen_ports(flags):
    """{port: (flag, host)} for every --*listen flag with HOST:PORT."""
    ports = {}
    for name, value in flags.items():
        if name.endswith("listen") and value:
            host, _, port = value.rpartition(":")
            if port.isdigit() and int(port) > 0:
                ports[int(port)] = (name, host.strip("[]"))
    return ports


def port_number(port, declared):
    if isinstance(port, int):
        return port if port in declared.values() else None
    return declared.get(port)


def check_container(kind, wl, pod, c, configmaps, bin_dir):
    what = f"{kind}/{wl['metadata']['name']}/{c['name']}"
    cmd = c.get("command", [])
    binary = BINARIES.get(cmd[0].rsplit("/", 1)[-1]) if cmd else None
    if binary is None:
        report(False, f"{what} command", f"{cmd} is not one of {sorted(BINARIES)}")
        return
    env = container_env(c, configmaps)
    args = [expand(a, env) for a in cmd[1:] + c.get("args", [])]
    unresolved = [a for a in args if re.search(r"\$\([A-Za-z_]", a)]
    positional = [a for a in args if not a.startswith("-")]
    if unresolved or positional:
        report(False, f"{what} flags", f"unresolved {unresolved} / positional {positional}")
    else:
        run = subprocess.run([f"{bin_dir}/{binary}"] + args + ["--version"], capture_output=True,
                             text=True, timeout=60)
        errors = [l for l in (run.stdout + run.stderr).splitlines() if "ERROR" in l]
        report(run.returncode == 0, f"{what} flags parse ({binary} {shlex.join(args)})",
               f"exit {run.returncode}: {' '.join(errors) or run.stderr.strip()[-300:]}")
    flags = flags_of(args)

    # Ports: declared containerPorts <-> what the flags bind, on a reachable host.
    declared = {p.get("name", str(p["containerPort"])): p["containerPort"]
                for p in c.get("ports", [])}
    bound = listen_ports(flags)
    problems = [f"containerPort {p} not bound by any --*listen flag"
                for p in declared.values() if p not in bound]
    problems += [f"--{f}={flags[f]} has no containerPort" for p, (f, _) in bound.items()
                 if p not in declared.values()]
    problems += [f"--{f}={flags[f]} binds {h}, unreachable from other pods"
                 for p, (f, h) in bound.items() if h not in ("0.0.0.0", "::", "")]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        handler = c.get(probe, {})
        port = (handler.get("httpGet") or handler.get("tcpSocket") or {}).get("port")
        if probe in c and port_number(port, declared) is None:
            problems.append(f"{probe} port {port!r} is not a containerPort")
    report(not problems, f"{what} ports {sorted(declared.values())}", "; ".join(problems))

    # Drain: the pod must live through preStop + the daemon's own drain.
    drain_ms = int(flags.get("drain_timeout_ms" if binary.endswith("worker")
                             else "shutdown_grace_ms",
                             30000 if binary.endswith("worker") else 5000))
    pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_s = int(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
    grace = pod.get("terminationGracePeriodSeconds", 30)
    need = pre_s + math.ceil(drain_ms / 1000) + GRACE_MARGIN_S
    report(grace >= need, f"{what} terminationGracePeriodSeconds {grace} >= {need}",
           f"preStop {pre_s}s + drain {drain_ms}ms + {GRACE_MARGIN_S}s margin")

    # GPUs and weights.
    if binary.endswith("worker"):
        res = c.get("resources", {})
        gpus = int(res.get("limits", {}).get("nvidia.com/gpu", 0))
        want = int(flags.get("tp", "1")) if flags.get("backend") == "cuda" else 0
        report(gpus == want, f"{what} nvidia.com/gpu {gpus} (backend {flags.get('backend')}, "
               f"tp {flags.get('tp', '1')})", f"want {want}")
    model = flags.get("model", "")
    mounts = [m["mountPath"].rstrip("/") + "/" for m in c.get("volumeMounts", [])]
    if model:
        report(any((model + "/").startswith(m) for m in mounts), f"{what} --model={model} mounted",
               f"no volumeMount holds it ({mounts})")
    return declared, flags


def check_manifests(path, bin_dir):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs
                  if d["kind"] == "ConfigMap"}
    workloads = []  # (labels, {portName: port}, metrics ports)
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = d["spec"]["template"]["spec"]
        declared, metrics = {}, set()
        for c in pod["containers"]:
            r = check_container(d["kind"], d, pod, c, configmaps, bin_dir)
            if r:
                declared.update(r[0])
                metrics.update(listen_ports({"metrics_listen": r[1].get("metrics_listen", "")}))
        for v in pod.get("volumes", []):
            if "secret" in v:
                report(v["secret"].get("optional") is True,
                       f"{d['kind']}/{d['metadata']['name']} secret volume {v['name']} optional",
                       "the TLS Secret is a placeholder: mount it optional")
        if d["kind"] == "StatefulSet":
            svc = d["spec"].get("serviceName")
            ok = any(s["kind"] == "Service" and s["metadata"]["name"] == svc and
                     s["spec"].get("clusterIP") == "None" for s in docs)
            report(ok, f"StatefulSet/{d['metadata']['name']} headless Service {svc}",
                   "serviceName must name a headless Service")
        workloads.append((d["spec"]["template"]["metadata"].get("labels", {}), declared, metrics))

    def selected(sel):
        return [w for w in workloads if sel and all(w[0].get(k) == v for k, v in sel.items())]

    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "Service":
            pods = selected(d["spec"].get("selector", {}))
            problems = [] if pods else ["selects no workload"]
            for p in d["spec"].get("ports", []):
                for _, declared, metrics in pods:
                    n = port_number(p.get("targetPort", p["port"]), declared)
                    if n is None:
                        problems.append(f"targetPort {p.get('targetPort')!r} not a containerPort")
                    elif n in metrics:
                        problems.append(f"exposes the metrics port {n}")
            report(not problems, f"{name} ports {[p['port'] for p in d['spec']['ports']]}",
                   "; ".join(problems))
        elif d["kind"] == "PodDisruptionBudget":
            report(bool(selected(d["spec"]["selector"].get("matchLabels", {}))),
                   f"{name} selector", "selects no workload")


def check_dockerfile(dockerfile, root, bin_dir, manifests):
    installed = set()
    lines = open(dockerfile).read().replace("\\\n", " ").splitlines()
    for line in lines:
        words = shlex.split(line, comments=True)
        if not words or words[0].upper() != "COPY":
            continue
        opts = [w for w in words[1:] if w.startswith("--")]
        srcs, dest = [w for w in words[1:] if not w.startswith("--")][:-1], words[-1]
        stage = next((o.split("=", 1)[1] for o in opts if o.startswith("--from=")), None)
        for src in srcs:
            if stage is None:
                ok, where = subprocess.run(["test", "-e", f"{root}/{src}"]).returncode == 0, root
            else:
                # The build stage stages bundle.sh's layout: /bundle/bin/<pkg>/<name>, lib/.
                m = re.match(r"/bundle/bin/(.+)$", src)
                where = f"{bin_dir}/{m.group(1)}" if m else None
                ok = where is None or subprocess.run(["test", "-x", where]).returncode == 0
            report(ok, f"Dockerfile COPY {'--from=' + stage + ' ' if stage else ''}{src}",
                   f"missing ({where})")
            if dest.endswith("/"):
                installed.add(dest + src.rstrip("/").rsplit("/", 1)[-1])
            else:
                installed.add(dest)
    for rel in BINARIES.values():
        ldd = subprocess.run(["ldd", f"{bin_dir}/{rel}"], capture_output=True, text=True)
        missing = [l.split()[0] for l in ldd.stdout.splitlines() if "not found" in l]
        report(ldd.returncode == 0 and not missing, f"ldd {rel} (bundle.sh stages these)",
               f"unresolved {missing}")
    commands = set()
    for path in manifests:
        for d in yaml.safe_load_all(open(path)):
            if d and d["kind"] in ("Deployment", "StatefulSet"):
                commands.update(c["command"][0] for c in d["spec"]["template"]["spec"]["containers"])
    for cmd in sorted(commands):
        report(cmd in installed, f"image provides {cmd}", f"Dockerfile installs {sorted(installed)}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "manifests":
        check_manifests(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 5 and sys.argv[1] == "dockerfile":
        check_dockerfile(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    else:
        sys.exit(__doc__)
    sys.exit(1 if failures else 0)
