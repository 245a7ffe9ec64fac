#!/usr/bin/env python3
"""Cross-checks rendered Tandem manifests against the real binaries (used by validate.sh).

  check_manifests.py manifests RENDERED.yaml BIN_DIR [SECRETS.yaml]
                                   # one overlay's `kubectl kustomize` output (+ make_secrets.sh's)
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
Security (every overlay is secure): no --insecure; --tls_cert/--tls_key/--tls_ca (and the
router's --api_key_file) point into a read-only mount of a non-optional Secret volume (mode not
world-readable); the router has --internal_listen, and only a ClusterIP Service exposes that port
(never together with a public port), while the workers' --router names that Service's port. With
SECRETS.yaml (deploy/k8s/make_secrets.sh's output): every mounted Secret exists with the keys the
flags read, the certificate's role (URI SAN spiffe://tandem/role/R) is the container's role, its
key matches, it chains to ca.crt (one CA for all), and it carries --tls_server_name as a DNS SAN;
a worker's certificate names its --worker_id (spiffe://tandem/role/R/worker/ID), and per-pod
files ($(POD_NAME)) exist in the Secret for every replica of the StatefulSet.
dockerfile: every COPY source exists (build context: REPO_ROOT; the build stage's staged
binaries: BIN_DIR), every binary's shared libraries resolve (ldd), and every container command
in the manifests is a path the Dockerfile installs.
"""
import base64
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile

import yaml

BINARIES = {"tandem_worker": "runtime/tandem_worker", "tandem_router": "router/tandem_router"}
# What a downward-API field would hold in a pod.
FIELD_DUMMIES = {"status.podIP": "10.1.2.3", "metadata.name": "pod-0",
                 "metadata.namespace": "tandem", "spec.nodeName": "node-0"}
# Time a daemon needs past its drain (worker: gRPC shutdown 2 s) plus slack.
GRACE_MARGIN_S = 5
# Flags naming a file of TLS material (must come from a Secret): which binaries need them.
TLS_FILE_FLAGS = {"tls_cert": "both", "tls_key": "both", "tls_ca": "both",
                  "api_key_file": "tandem_router"}
# CA certificates seen in the Secrets (all must be the same cluster CA).
seen_cas = set()

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


def container_env(c, configmaps, pod_name="pod-0"):
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
            path = vf["fieldRef"]["fieldPath"]
            env[e["name"]] = pod_name if path == "metadata.name" else FIELD_DUMMIES.get(path, "x")
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


def check_container(kind, wl, pod, c, configmaps, bin_dir, secrets=None):
    what = f"{kind}/{wl['metadata']['name']}/{c['name']}"
    cmd = c.get("command", [])
    binary = BINARIES.get(cmd[0].rsplit("/", 1)[-1]) if cmd else None
    if binary is None:
        report(False, f"{what} command", f"{cmd} is not one of {sorted(BINARIES)}")
        return
    # A StatefulSet's first pod: its name is what per-pod flags ($(POD_NAME)) resolve to.
    pod_name = f"{wl['metadata']['name']}-0" if kind == "StatefulSet" else "pod-0"
    env = container_env(c, configmaps, pod_name)
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
    check_tls(what, binary, flags, c, pod, secrets)
    check_pod_certificates(what, kind, wl, c, pod, configmaps, secrets)
    return declared, flags, binary


def check_pod_certificates(what, kind, wl, c, pod, configmaps, secrets):
    """Per-pod TLS files ($(POD_NAME) in --tls_cert/--tls_key): every replica has its own."""
    raw = {m.group(1): m.group(2) for a in c.get("args", [])
           for m in [re.match(r"--(tls_cert|tls_key)=(.*)$", a)] if m}
    if secrets is None or not any("$(POD_NAME)" in v for v in raw.values()):
        return
    replicas = wl["spec"].get("replicas", 1) if kind == "StatefulSet" else 1
    missing = []
    for i in range(replicas):
        env = container_env(c, configmaps, f"{wl['metadata']['name']}-{i}")
        for flag, path in raw.items():
            secret, key, why = secret_file(expand(path, env), c, pod)
            if why or key not in secrets.get(secret, {}):
                missing.append(f"pod {i}: --{flag} {expand(path, env)} ({why or 'no such key'})")
    report(not missing, f"{what} every one of its {replicas} pods has its own certificate",
           "; ".join(missing) + " (make_secrets.sh --replicas)")


def secret_file(path, c, pod):
    """(secretName, key, problem) for a file path inside the container."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        root = m["mountPath"].rstrip("/") + "/"
        if not path.startswith(root) or "subPath" in m:
            continue
        v = volumes.get(m["name"], {})
        if "secret" not in v:
            return None, None, f"{path} is on volume {m['name']}, not a Secret"
        if m.get("readOnly") is not True:
            return None, None, f"{path}: mount {m['mountPath']} is not readOnly"
        rel = path[len(root):]
        items = v["secret"].get("items")
        if items:
            key = next((i["key"] for i in items if i["path"] == rel), None)
            if key is None:
                return None, None, f"{path}: no item of Secret {v['secret']['secretName']} maps to {rel}"
        else:
            key = rel
        return v["secret"]["secretName"], key, ""
    return None, None, f"{path} is on no volumeMount"


def openssl(*args, stdin=None):
    return subprocess.run(["openssl", *args], capture_output=True, text=True, input=stdin)


def check_certificate(what, role, files, server_name, worker_id=""):
    """files: {flag: path} of decoded Secret data. Role, key, chain, SAN checks with openssl."""
    cert, key, ca = files["tls_cert"], files["tls_key"], files["tls_ca"]
    text = openssl("x509", "-in", cert, "-noout", "-text").stdout
    roles = re.findall(r"URI:spiffe://tandem/role/([a-z]+)", text)
    report(roles == [role], f"{what} certificate role {roles}", f"want [{role!r}]")
    if worker_id:  # a worker's own certificate must name its --worker_id
        named = re.findall(r"URI:spiffe://tandem/role/[a-z]+/worker/([A-Za-z0-9._-]+)", text)
        report(named == [worker_id], f"{what} certificate names worker {named}",
               f"want [{worker_id!r}] (--worker_id)")
    pub_cert = openssl("x509", "-in", cert, "-noout", "-pubkey").stdout
    pub_key = openssl("pkey", "-in", key, "-pubout").stdout
    report(bool(pub_cert) and pub_cert == pub_key, f"{what} --tls_key matches --tls_cert",
           "different public keys")
    v = openssl("verify", "-CAfile", ca, cert)
    report(v.returncode == 0, f"{what} certificate chains to --tls_ca", v.stdout + v.stderr)
    seen_cas.add(open(ca).read())
    report(len(seen_cas) == 1, f"{what} --tls_ca is the one cluster CA", f"{len(seen_cas)} CAs")
    if server_name:
        sans = re.findall(r"DNS:([^,\s]+)", text)
        report(server_name in sans, f"{what} certificate has --tls_server_name {server_name} as SAN",
               f"DNS SANs {sans}")
    if "api_key_file" in files:
        keys = [l for l in open(files["api_key_file"]).read().splitlines()
                if l.strip() and not l.startswith("#")]
        report(len(keys) > 0, f"{what} --api_key_file has {len(keys)} key(s)", "no keys")


def check_tls(what, binary, flags, c, pod, secrets):
    """Every container is secure: TLS flags read files from a read-only mounted Secret."""
    name = binary.rsplit("/", 1)[-1]
    report(flags.get("insecure", "false") == "false", f"{what} no --insecure",
           f"--insecure={flags.get('insecure')} in a secure overlay")
    needed = [f for f, who in TLS_FILE_FLAGS.items() if who in ("both", name)]
    problems, files = [], {}
    for f in needed:
        if not flags.get(f):
            problems.append(f"--{f} missing")
            continue
        secret, key, why = secret_file(flags[f], c, pod)
        if why:
            problems.append(f"--{f}: {why}")
        else:
            files[f] = (secret, key)
    report(not problems, f"{what} TLS flags {needed} read a mounted Secret "
           f"({sorted(set(s for s, _ in files.values()))})", "; ".join(problems))
    if name == "tandem_router":
        report(bool(flags.get("internal_listen")), f"{what} --internal_listen (mTLS plane)",
               "with TLS the router needs its internal port")
    if secrets is None or problems:
        return
    role = "router" if name == "tandem_router" else flags.get("role", "mixed")
    with tempfile.TemporaryDirectory() as tmp:
        decoded, missing = {}, []
        for f, (secret, key) in files.items():
            data = secrets.get(secret, {}).get(key)
            if data is None:
                missing.append(f"Secret {secret} key {key}" if secret in secrets
                               else f"Secret {secret}")
                continue
            decoded[f] = os.path.join(tmp, f)
            with open(decoded[f], "wb") as out:
                out.write(base64.b64decode(data))
        report(not missing, f"{what} make_secrets.sh provides {sorted(set(files.values()))}",
               f"missing {missing}")
        if not missing:
            check_certificate(what, role, decoded, flags.get("tls_server_name", ""),
                              flags.get("worker_id", "") if role != "router" else "")


def check_manifests(path, bin_dir, secrets_path=None):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs
                  if d["kind"] == "ConfigMap"}
    secrets = None
    if secrets_path:
        secret_docs = [d for d in yaml.safe_load_all(open(secrets_path)) if d]
        namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
        secrets = {d["metadata"]["name"]: d.get("data", {}) for d in secret_docs
                   if d["kind"] == "Secret"}
        wrong = [d["metadata"]["name"] for d in secret_docs
                 if d["metadata"].get("namespace") not in namespaces]
        report(not wrong, f"make_secrets.sh Secrets {sorted(secrets)} in namespace {namespaces}",
               f"{wrong} in another namespace")
    workloads = []  # (labels, {portName: port}, metrics ports, {port: flag}, kind/name)
    worker_routers = []  # (what, --router value)
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = d["spec"]["template"]["spec"]
        declared, metrics, bound = {}, set(), {}
        for c in pod["containers"]:
            r = check_container(d["kind"], d, pod, c, configmaps, bin_dir, secrets)
            if r:
                declared.update(r[0])
                metrics.update(listen_ports({"metrics_listen": r[1].get("metrics_listen", "")}))
                bound.update({p: f for p, (f, _) in listen_ports(r[1]).items()})
                if r[2].endswith("worker"):
                    worker_routers.append((f"{d['kind']}/{d['metadata']['name']}/{c['name']}",
                                           r[1].get("router", "")))
        for v in pod.get("volumes", []):
            if "secret" in v:
                mode = v["secret"].get("defaultMode", 0o644)
                report(v["secret"].get("optional") is not True and mode & 0o007 == 0,
                       f"{d['kind']}/{d['metadata']['name']} secret volume {v['name']} required, "
                       f"mode {mode:o}",
                       "TLS material: not optional (the pod must not start without it), "
                       "not world-readable")
        if d["kind"] == "StatefulSet":
            svc = d["spec"].get("serviceName")
            ok = any(s["kind"] == "Service" and s["metadata"]["name"] == svc and
                     s["spec"].get("clusterIP") == "None" for s in docs)
            report(ok, f"StatefulSet/{d['metadata']['name']} headless Service {svc}",
                   "serviceName must name a headless Service")
        workloads.append((d["spec"]["template"]["metadata"].get("labels", {}), declared, metrics,
                          bound))

    def selected(sel):
        return [w for w in workloads if sel and all(w[0].get(k) == v for k, v in sel.items())]

    internal_services = {}  # (service name, port) of the router's internal port
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "Service":
            pods = selected(d["spec"].get("selector", {}))
            problems = [] if pods else ["selects no workload"]
            planes = set()  # flags binding the ports this Service exposes
            for p in d["spec"].get("ports", []):
                for _, declared, metrics, bound in pods:
                    n = port_number(p.get("targetPort", p["port"]), declared)
                    if n is None:
                        problems.append(f"targetPort {p.get('targetPort')!r} not a containerPort")
                    elif n in metrics:
                        problems.append(f"exposes the metrics port {n}")
                    else:
                        planes.add(bound.get(n))
                        if bound.get(n) == "internal_listen":
                            internal_services[(d["metadata"]["name"], p["port"])] = True
            report(not problems, f"{name} ports {[p['port'] for p in d['spec']['ports']]}",
                   "; ".join(problems))
            if "internal_listen" in planes:
                kind = d["spec"].get("type", "ClusterIP")
                report(kind == "ClusterIP" and planes == {"internal_listen"},
                       f"{name} exposes the router's internal port only, as {kind}",
                       f"internal (mTLS) port with {sorted(p for p in planes if p)} / type {kind}")
        elif d["kind"] == "PodDisruptionBudget":
            report(bool(selected(d["spec"]["selector"].get("matchLabels", {}))),
                   f"{name} selector", "selects no workload")
    # Workers register on the internal port, through its Service (NAME[.ns...]:PORT).
    for what, router in worker_routers:
        host, _, port = router.rpartition(":")
        ok = port.isdigit() and (host.split(".")[0], int(port)) in internal_services
        report(ok, f"{what} --router={router} is the router's internal port",
               f"internal Services: {sorted(internal_services)}")


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
    if len(sys.argv) in (4, 5) and sys.argv[1] == "manifests":
        check_manifests(*sys.argv[2:])
    elif len(sys.argv) >= 5 and sys.argv[1] == "dockerfile":
        check_dockerfile(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    else:
        sys.exit(__doc__)
    sys.exit(1 if failures else 0)
