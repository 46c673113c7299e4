"""Offline checks of the prefill/decode overlay (deploy/k8s/pd), since no cluster runs it here.

The overlay is rendered here as kustomize would: the base's documents (deploy/k8s/*.yaml) and
prefill.yaml, with the kustomization's JSON patches applied (the only operation it uses: `add` to the
end of a list). Then: the kustomization validates against schemas/kustomization.json and lists the base
and every file of the overlay; the new core objects validate against the Kubernetes schemas; the prefill
pool's pod is the base replicas' pod but for its role, ports and labels (init container, image, probes,
resources, security settings and volumes identical, so the two cannot drift apart); it is a KV producer
whose kv_port is its declared container port and its headless Service's port, with a wildcard kv_ip and
POD_IP from the Downward API (the address it names to consumers); the decode pool (the base's StatefulSet)
is a KV consumer; both pools share the block size, the hash algorithm and the ConfigMap's hash seed
(blocks travel by prefix-cache hash); no Service selects both pools; the router lists exactly the prefill
replicas, by their headless-Service names on the HTTP port, for --prefill-backends; every flag is one
`osprey serve` / `osprey router` --help lists."""
import copy
import json
import os

import jsonschema
import pytest
import yaml

from test_manifests import flag_values, help_flags

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(ROOT, "deploy", "k8s")
PD = os.path.join(K8S, "pd")
SCHEMAS = os.path.join(os.path.dirname(__file__), "schemas")


def docs_in(d, skip=("kustomization.yaml",)):
    out = []
    for f in sorted(os.listdir(d)):
        if f.endswith((".yaml", ".yml")) and f not in skip:
            with open(os.path.join(d, f)) as fh:
                out += [x for x in yaml.safe_load_all(fh) if x is not None]
    return out


def kustomization():
    with open(os.path.join(PD, "kustomization.yaml")) as f:
        return yaml.safe_load(f)


def one(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def json_patch(doc, ops):
    for op in ops:
        assert op["op"] == "add" and op["path"].endswith("/-"), f"the renderer here knows only add to a list: {op}"
        node = doc
        for part in op["path"].strip("/").split("/")[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node.append(op["value"])


@pytest.fixture(scope="module")
def rendered():
    docs = copy.deepcopy(docs_in(K8S)) + docs_in(PD)
    for p in kustomization()["patches"]:
        t = p["target"]
        json_patch(one(docs, t["kind"], t["name"]), yaml.safe_load(p["patch"]))
    return docs


def pod(w):
    return w["spec"]["template"]["spec"]


def container(w):
    (c,) = pod(w)["containers"]
    return c


def args_of(w):
    a = [str(x) for x in container(w)["args"]]
    return a[0], flag_values(a[1:])


def test_kustomization_lists_the_base_and_the_overlay():
    k = kustomization()
    with open(os.path.join(SCHEMAS, "kustomization.json")) as f:
        jsonschema.validate(k, json.load(f))
    listed = {f for f in os.listdir(PD) if f.endswith(".yaml") and f != "kustomization.yaml"}
    assert k["resources"] == [".."] + sorted(listed)


def test_new_core_objects_validate_against_kubernetes_schemas(rendered):
    kv = pytest.importorskip("kubernetes_validate")
    version = kv.utils.latest_version()
    for d in docs_in(PD) + [one(rendered, "StatefulSet", "osprey"), one(rendered, "Deployment", "osprey-router")]:
        kv.validate(d, version, strict=True)


def test_prefill_pod_is_the_base_pod_but_for_role_ports_and_labels(rendered):
    base, pre = one(rendered, "StatefulSet", "osprey"), one(rendered, "StatefulSet", "osprey-prefill")
    for key in ("initContainers", "volumes", "securityContext", "terminationGracePeriodSeconds"):
        assert pod(pre)[key] == pod(base)[key], key
    for key in ("image", "imagePullPolicy", "startupProbe", "readinessProbe", "livenessProbe", "resources",
                "securityContext", "volumeMounts", "env"):
        assert container(pre)[key] == container(base)[key], key
    _, fb = args_of(base)
    _, fp = args_of(pre)
    for flag in ("-m", "--served-model-name", "--port", "--threads", "--kv-cache-memory", "--block-size",
                 "--prefix-caching-hash-algo", "--drain-timeout"):
        assert fp.get(flag) == fb.get(flag), flag


def test_producer_and_consumer_roles(rendered):
    pre, dec = one(rendered, "StatefulSet", "osprey-prefill"), one(rendered, "StatefulSet", "osprey")
    sub, fp = args_of(pre)
    assert sub == "serve"
    prod = json.loads(fp["--kv-transfer-config"])
    assert prod["kv_connector"] == "OspreyConnector" and prod["kv_role"] == "kv_producer"
    assert prod["kv_ip"] in ("0.0.0.0", "::")  # a wildcard: the producer names $POD_IP to consumers
    ports = {p["name"]: p["containerPort"] for p in container(pre)["ports"]}
    assert prod["kv_port"] == ports["kv-transfer"]
    svc = one(rendered, "Service", "osprey-prefill")
    assert svc["spec"]["clusterIP"] == "None" and pre["spec"]["serviceName"] == "osprey-prefill"
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"http": ports["http"], "kv-transfer": prod["kv_port"]}
    env = {e["name"]: e for e in container(pre)["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "OSPREY_HASH_SEED" in env
    _, fd = args_of(dec)
    cons = json.loads(fd["--kv-transfer-config"])
    assert cons == {"kv_connector": "OspreyConnector", "kv_role": "kv_consumer"}


def selects(svc, w):
    labels = w["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())


def test_no_service_selects_both_pools(rendered):
    pre, dec = one(rendered, "StatefulSet", "osprey-prefill"), one(rendered, "StatefulSet", "osprey")
    for svc in (d for d in rendered if d["kind"] == "Service"):
        assert not (selects(svc, pre) and selects(svc, dec)), svc["metadata"]["name"]
    assert selects(one(rendered, "Service", "osprey-prefill"), pre)
    assert selects(one(rendered, "Service", "osprey"), dec)
    sel = pre["spec"]["selector"]["matchLabels"]
    assert all(pre["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())
    assert not all(dec["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())


def test_router_sends_prompts_to_every_prefill_replica(rendered):
    pre, router = one(rendered, "StatefulSet", "osprey-prefill"), one(rendered, "Deployment", "osprey-router")
    sub, fr = args_of(router)
    assert sub == "router"
    http = {p["name"]: p["containerPort"] for p in container(pre)["ports"]}["http"]
    want = [f"http://osprey-prefill-{i}.osprey-prefill:{http}" for i in range(pre["spec"]["replicas"])]
    assert fr["--prefill-backends"].split(",") == want
    # the decode backends are the base's replicas, untouched
    dec = one(rendered, "StatefulSet", "osprey")
    assert len(fr["--backends"].split(",")) == dec["spec"]["replicas"]


def test_every_flag_is_accepted(rendered):
    for w in (one(rendered, "StatefulSet", "osprey-prefill"), one(rendered, "StatefulSet", "osprey"),
              one(rendered, "Deployment", "osprey-router")):
        sub, flags = args_of(w)
        known = help_flags(sub)
        for flag in flags:
            assert flag in known, f"{w['metadata']['name']}: `osprey {sub} {flag}` is not in `osprey {sub} --help`"
