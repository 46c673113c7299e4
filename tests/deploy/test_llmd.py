"""Offline checks of the llm-d / Gateway API Inference Extension overlay (deploy/k8s/llm-d) and of every
manifest's core kinds, since no cluster runs them here.

Schemas: every core-kind document under deploy/k8s (ConfigMap, Service, Deployment, StatefulSet,
ServiceAccount, Role, RoleBinding) validates strictly (unknown fields refused) against the Kubernetes
OpenAPI schemas of the kubernetes-validate package (PyPI); the InferencePool and the EPP's
EndpointPickerConfig against the JSON Schemas in tests/deploy/schemas, written from the GIE API
reference; the kustomizations against schemas/kustomization.json.

Wiring: the overlay's kustomization takes the base and deletes exactly osprey router's objects (which
exist in the base); the InferencePool selects the replicas' pods (and nothing else) on their HTTP
port and names the EPP Service on the EPP's ext-proc port; the EPP runs with the pool's name and the
mounted config file and reads osprey's KV-usage metric name (its default is vLLM's older one); its Role
lets it watch the pool, the pods and InferenceObjectives, its ClusterRole review scrapers' tokens; its
config declares every plugin a profile uses, has one picker per profile and scores by prefix, queue and
KV-cache use, whose metrics (vllm:num_requests_waiting, vllm:kv_cache_usage_perc) osprey serve's /metrics
has."""
import json
import os
import subprocess

import jsonschema
import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(ROOT, "deploy", "k8s")
LLMD = os.path.join(K8S, "llm-d")
SCHEMAS = os.path.join(os.path.dirname(__file__), "schemas")
BIN = os.environ.get("OSPREY_BIN", os.path.join(ROOT, "build", "bin", "osprey"))
KV_METRIC = "vllm:kv_cache_usage_perc"
CORE = {"ConfigMap", "Service", "Deployment", "StatefulSet", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
        "ClusterRoleBinding"}


def docs_in(d):
    out = []
    for f in sorted(os.listdir(d)):
        if f.endswith((".yaml", ".yml")):
            with open(os.path.join(d, f)) as fh:
                out += [(f, x) for x in yaml.safe_load_all(fh) if x is not None]
    return out


def schema(name):
    with open(os.path.join(SCHEMAS, name)) as f:
        return json.load(f)


def one(docs, kind, name=None):
    found = [d for _, d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


@pytest.fixture(scope="module")
def base():
    return docs_in(K8S)


@pytest.fixture(scope="module")
def llmd():
    return docs_in(LLMD)


def test_core_kinds_validate_against_kubernetes_schemas(base, llmd):
    kv = pytest.importorskip("kubernetes_validate")
    version = kv.utils.latest_version()
    n = 0
    for f, d in base + llmd:
        if d["kind"] in CORE:
            kv.validate(d, version, strict=True)  # raises with the field's path on any error
            n += 1
    assert n >= 10


def test_custom_kinds_validate_against_the_written_schemas(base, llmd):
    jsonschema.validate(one(llmd, "InferencePool"), schema("inferencepool-v1.json"))
    for _, d in base + llmd:
        if d["kind"] == "Kustomization":
            jsonschema.validate(d, schema("kustomization.json"))
    epp = yaml.safe_load(one(llmd, "ConfigMap", "osprey-epp-config")["data"]["epp-config.yaml"])
    jsonschema.validate(epp, schema("endpointpickerconfig-v1alpha1.json"))
    kinds = {d["kind"] for _, d in llmd}
    assert kinds <= CORE | {"InferencePool", "Kustomization"}, kinds


def test_the_schemas_refuse_what_the_spec_refuses(llmd):
    """The written schemas are not vacuous: each of these mutations is one the spec forbids."""
    pool = one(llmd, "InferencePool")
    bad = []
    for mutate in (lambda p: p["spec"].pop("endpointPickerRef"),
                   lambda p: p["spec"]["targetPorts"].append({"number": 70000}),
                   lambda p: p["spec"]["endpointPickerRef"].update(failureMode="Sometimes"),
                   lambda p: p["spec"]["endpointPickerRef"].pop("port"),
                   lambda p: p["spec"].update(targetPortNumber=8000),  # the v1alpha2 field name
                   lambda p: p["spec"]["selector"].update(matchExpressions=[])):
        p = json.loads(json.dumps(pool))
        mutate(p)
        bad.append(p)
    for p in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(p, schema("inferencepool-v1.json"))
    cfg = yaml.safe_load(one(llmd, "ConfigMap", "osprey-epp-config")["data"]["epp-config.yaml"])
    for mutate in (lambda c: c.pop("schedulingProfiles"), lambda c: c["plugins"][0].pop("type"),
                   lambda c: c["schedulingProfiles"][0]["plugins"][0].update(weight=-1),
                   lambda c: c.update(plugin=[])):
        c = json.loads(json.dumps(cfg))
        mutate(c)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(c, schema("endpointpickerconfig-v1alpha1.json"))


def test_overlay_takes_the_base_without_the_router(base, llmd):
    kz = one(llmd, "Kustomization")
    assert ".." in kz["resources"]
    for r in kz["resources"]:
        assert os.path.exists(os.path.join(LLMD, r)), r
    listed = {f for f in os.listdir(LLMD) if f.endswith(".yaml") and f != "kustomization.yaml"}
    assert listed == {r for r in kz["resources"] if r != ".."}
    deleted = set()
    for p in kz["patches"]:
        d = yaml.safe_load(p["patch"])
        assert d["$patch"] == "delete"
        one(base, d["kind"], d["metadata"]["name"])  # it exists in the base
        deleted.add((d["kind"], d["metadata"]["name"]))
    router = {(d["kind"], d["metadata"]["name"]) for f, d in base if f == "router.yaml"}
    assert deleted == router


def test_pool_selects_the_replicas_and_names_the_epp(base, llmd):
    pool = one(llmd, "InferencePool")
    sts = one(base, "StatefulSet")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    sel = pool["spec"]["selector"]["matchLabels"]
    assert all(labels.get(k) == v for k, v in sel.items())
    for _, d in base + llmd:  # no other pod template carries those labels
        if d["kind"] in ("Deployment", "StatefulSet") and d is not sts:
            other = d["spec"]["template"]["metadata"]["labels"]
            assert not all(other.get(k) == v for k, v in sel.items()), d["metadata"]["name"]
    osprey = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "osprey"][0]
    http = {p["name"]: p["containerPort"] for p in osprey["ports"]}["http"]
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [http]
    ref = pool["spec"]["endpointPickerRef"]
    svc = one(llmd, "Service", ref["name"])
    port = [p for p in svc["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert len(port) == 1
    epp = one(llmd, "Deployment", "osprey-epp")
    assert all(svc["spec"]["selector"].get(k) == v for k, v in epp["spec"]["template"]["metadata"]["labels"].items())
    c = epp["spec"]["template"]["spec"]["containers"][0]
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named[port[0]["targetPort"]] == ref["port"]["number"]
    args = c["args"]
    flag = lambda f: args[args.index(f) + 1]
    assert flag("--pool-name") == pool["metadata"]["name"]
    assert flag("--grpc-port") == str(ref["port"]["number"])
    cfg_path = flag("--config-file")
    mount = [m for m in c["volumeMounts"] if cfg_path.startswith(m["mountPath"] + "/")][0]
    vol = [v for v in epp["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]][0]
    cm = one(llmd, "ConfigMap", vol["configMap"]["name"])
    assert os.path.basename(cfg_path) in cm["data"]
    # the EPP's account may watch the pool and the pods
    sa = epp["spec"]["template"]["spec"]["serviceAccountName"]
    one(llmd, "ServiceAccount", sa)
    rb = one(llmd, "RoleBinding")
    assert {"kind": "ServiceAccount", "name": sa} in rb["subjects"]
    role = one(llmd, "Role", rb["roleRef"]["name"])
    grants = {(g, r) for rule in role["rules"] if {"get", "watch", "list"} <= set(rule["verbs"])
              for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("inference.networking.k8s.io", "inferencepools") in grants and ("", "pods") in grants
    assert ("inference.networking.x-k8s.io", "inferenceobjectives") in grants  # v1.0.1 watches them too
    # the KV-cache scorer reads the metric osprey exports (v1.0.1's default name is vLLM's older one)
    assert flag("--kv-cache-usage-percentage-metric") == KV_METRIC
    crb = one(llmd, "ClusterRoleBinding")
    assert any(x["kind"] == "ServiceAccount" and x["name"] == sa for x in crb["subjects"])
    cr = one(llmd, "ClusterRole", crb["roleRef"]["name"])
    auth = {(g, r) for rule in cr["rules"] if "create" in rule["verbs"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert auth == {("authentication.k8s.io", "tokenreviews"), ("authorization.k8s.io", "subjectaccessreviews")}


def test_epp_scores_by_prefix_queue_and_kv(llmd):
    cfg = yaml.safe_load(one(llmd, "ConfigMap", "osprey-epp-config")["data"]["epp-config.yaml"])
    declared = {p.get("name", p["type"]): p["type"] for p in cfg["plugins"]}
    for prof in cfg["schedulingProfiles"]:
        refs = [x["pluginRef"] for x in prof["plugins"]]
        assert set(refs) <= set(declared), set(refs) - set(declared)
        types = [declared[r] for r in refs]
        assert sum(t.endswith("-picker") for t in types) == 1, types
        weighted = {declared[x["pluginRef"]]: x.get("weight", 1) for x in prof["plugins"] if declared[x["pluginRef"]].endswith("-scorer")}
        assert {"prefix-cache-scorer", "queue-scorer", "kv-cache-utilization-scorer"} <= set(weighted)
        assert all(w > 0 for w in weighted.values())


def test_osprey_exports_the_metrics_the_scorers_read():
    if not os.path.exists(BIN):
        pytest.skip(f"no osprey binary at {BIN}")
    tiny = os.path.join(ROOT, "tests", "models", "tiny-llama-q8_0.gguf")
    import socket, time, urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([BIN, "serve", "-m", tiny, "--port", str(port), "-t", "1", "--kv-cache-memory", "16M"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        text = None
        for _ in range(300):
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert text is not None
        for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", KV_METRIC):
            assert f"# TYPE {name} gauge" in text, name
    finally:
        p.terminate()
        p.wait(timeout=30)
