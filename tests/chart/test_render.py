"""The chart without a cluster: lint, schema, and the rendered objects checked against their sources.

Sources of truth, each compared here with what the chart renders:
* RBAC: gate/controller/rbac.py (operator_rbac, webhook_rbac, pre_delete_rbac);
* webhook configurations: gate.admission.configuration.webhook_configurations(mode="service", ...);
* settings: the env names and values the processes read (OperatorSettings, WebhookSettings);
* metrics: the names and labels gate/controller/metrics.py and gate/admission/server.py export;
* CRDs: the top-level crds/ (byte for byte); plain manifests: `nodegate manifests --check`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess

import jsonschema
import pytest
import yaml

import gate
from gate.admission.configuration import webhook_configurations
from gate.admission.rules import syntax
from gate.admission.rules.images import ImagePolicy, image_violations, prefix_problem
from gate.admission.settings import WebhookSettings
from gate.admission.settings import from_args as webhook_settings_from
from gate.api.common import Obj
from gate.api.signatures import load_policy
from gate.cli.manifests import helm_path, stale
from gate.controller import rbac
from gate.controller.endpoints import parse_endpoints
from gate.controller.settings import OperatorSettings
from tests.chart.conftest import CHART_DIR, REPO, env_of, find, lint, rendered, rendered_text

CERT_MANAGER: Obj = {"certManager": {"enabled": True}}
NAMED_ISSUER: Obj = {"certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}
EVERYTHING: Obj = {
    "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                "grafanaDashboard": {"enabled": True}},
    "networkPolicy": {"enabled": True, "webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                      "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
}
CUSTOM: Obj = {
    "fullnameOverride": "ng", "image": {"repository": "registry.corp/ng", "digest": "sha256:" + "a" * 64},
    "operator": {"replicas": 3, "leaderElection": {"leaseSeconds": 30, "renewSeconds": 10, "renewDeadlineSeconds": 20}},
    "webhook": {"replicas": 1, "timeoutSeconds": 10, "nodeMutationFailurePolicy": "Fail"},
    "imagePullSecrets": [{"name": "pull"}], "commonLabels": {"team": "platform"},
}
ENDPOINTS: Obj = {"operator": {"health": {"prometheus": {"endpoints": {
    "main": {"url": "https://prometheus-operated.monitoring:9090", "tls": {"caSecret": {"name": "prom-ca",
                                                                                      "key": "ca.crt"}},
             "bearerTokenSecret": {"name": "prom-reader", "key": "token"}},
    "plain": {"url": "http://prometheus.monitoring:9090"}}}}}}
VALUE_SETS = {"defaults": {}, "cert-manager": CERT_MANAGER, "named-issuer": NAMED_ISSUER,
              "everything": EVERYTHING, "custom": CUSTOM, "custom+cert-manager": {**CUSTOM, **CERT_MANAGER},
              "prometheus-endpoints": {**EVERYTHING, **ENDPOINTS}}
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


# -- lint and values ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_chart_lints_strictly_with_each_set_of_values(name: str) -> None:
    proc = lint(VALUE_SETS[name])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def value_keys(text: str) -> list[tuple[tuple[str, ...], str | None]]:
    """Every key of a values file at every depth, in order, with its comment: the block of comment lines
    right above the key at its indentation, joined into one line, when the block opens with "# -- "
    (None otherwise). Keys inside list items count too; the list items themselves are values."""
    lines = text.splitlines()
    out: list[tuple[tuple[str, ...], str | None]] = []

    def comment(line: int, column: int) -> str | None:
        block: list[str] = []
        while line > 0 and lines[line - 1].startswith(" " * column + "#"):
            line -= 1
            block.insert(0, lines[line].strip()[1:].strip())
        if not block or not block[0].startswith("-- "):
            return None
        return " ".join([block[0][3:], *block[1:]])

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                out.append(((*path, key.value), comment(key.start_mark.line, key.start_mark.column)))
                walk(value, (*path, key.value))
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item, path)

    walk(yaml.compose(text), ())
    return out


def test_value_keys_finds_every_key_at_every_depth_with_the_comment_above_it() -> None:
    text = ("# file header\n\n# -- Top,\n# two lines.\ntop:\n  # -- Nested.\n  inner: {a: 1}\n"
            "  # not opened with --\n  bare: [1, 2]\n  items:\n    - name: x\n")
    assert value_keys(text) == [(("top",), "Top, two lines."), (("top", "inner"), "Nested."),
                                (("top", "inner", "a"), None), (("top", "bare"), None),
                                (("top", "items"), None), (("top", "items", "name"), None)]


def test_values_yaml_is_valid_against_its_schema_and_every_key_is_documented() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    text = (CHART_DIR / "values.yaml").read_text()
    jsonschema.validate(yaml.safe_load(text), schema)
    keys = value_keys(text)
    # every key, nested ones too, has a "# -- ..." comment right above it
    assert [".".join(path) for path, doc in keys if doc is None] == []
    # the schema describes each key it declares with the same text; a key it does not declare sits in a
    # free-form map (resource quantities, labels), which the schema types by additionalProperties
    for path, doc in keys:
        node = schema
        for i, part in enumerate(path):
            props = node.get("properties") or {}
            if part not in props:
                assert isinstance(node.get("additionalProperties"), dict), ".".join(path[:i + 1])
                break
            node = props[part]
        else:
            assert node.get("description") == doc, f"{'.'.join(path)}: the schema's description differs"

    def undescribed(node: Obj, path: str) -> list[str]:
        props = node.get("properties") or {}
        return [p for k, v in props.items() for p in ([f"{path}{k}"] if "description" not in v else [])
                + undescribed(v, f"{path}{k}.")]

    assert undescribed(schema, "") == [], "every property of the schema has a description"


@pytest.mark.parametrize(("values", "message"), [
    ({"bogus": 1}, "additional properties 'bogus' not allowed"),
    ({"webhook": {"timeoutSeconds": 31}}, "timeoutSeconds"),
    ({"webhook": {"nodeMutationFailurePolicy": "Maybe"}}, "nodeMutationFailurePolicy"),
    ({"certManager": {"issuerRef": {"kind": "Vault"}}}, "kind"),
    ({"image": {"digest": "latest"}}, "digest"),
    ({"operator": {"replicas": 0}}, "replicas"),
    ({"operator": {"imageSignatures": {"mode": "audit"}}}, "/operator/imageSignatures/mode"),
    ({"operator": {"imageSignatures": {"unmatched": "refuse"}, "images": {"resolveDigests": False}}},
     "operator.imageSignatures needs operator.images.resolveDigests: true"),
    ({"operator": {"imageSignatures": {"rules": [{"name": "r", "repositories": ["a/b"], "keys": []}]}}},
     "/operator/imageSignatures/rules/0/keys"),
    ({"webhook": {"imagePolicy": {"allowedRepositories": ["acme"]}}}, "/webhook/imagePolicy/allowedRepositories/0"),
    ({"webhook": {"imagePolicy": {"requireDigest": "yes"}}}, "/webhook/imagePolicy/requireDigest"),
    ({"webhook": {"imagePolicy": {"packages": {"tuned": ["acme/tuned"]}}}}, "/webhook/imagePolicy/packages/tuned/0"),
    ({"webhook": {"imagePolicy": {"packages": {"tuned": []}}}}, "/webhook/imagePolicy/packages/tuned"),
    ({"webhook": {"imagePolicy": {"packages": {"tuned": "ghcr.io/a/tuned"}}}}, "/webhook/imagePolicy/packages/tuned"),
    ({"webhook": {"imagePolicy": {"packages": {"Tuned": ["ghcr.io/acme/tuned"]}}}}, "'Tuned' does not match pattern"),
    ({"webhook": {"imagePolicy": {"unboundPackages": "deny"}}}, "/webhook/imagePolicy/unboundPackages"),
    ({"operator": {"leaderElection": {"leaseSeconds": 10, "renewSeconds": 5, "renewDeadlineSeconds": 12}}},
     "renewSeconds < renewDeadlineSeconds < leaseSeconds"),
])
def test_bad_values_are_refused_with_a_message_naming_them(values: Obj, message: str) -> None:
    with pytest.raises(Exception, match=re.escape(message)):
        rendered(values)


def test_the_default_namespace_is_refused() -> None:
    with pytest.raises(Exception, match='does not install into the "default" namespace'):
        rendered({}, namespace="default")


def _helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_path(), "template", *args], capture_output=True, text=True, timeout=120)


def test_helm_template_renders_without_a_kube_version() -> None:
    """`helm template charts/nodegate -n nodegate-system | kubectl apply -f -`, as GitOps pipelines
    and users without cluster access run it: no --kube-version, so Helm's own default capabilities
    (v1.20.0 for the pinned helm, built from source) instead of a cluster's. Chart.yaml's
    `kubeVersion: >=1.30.0-0` refused exactly this before rendering anything."""
    proc = _helm_template(str(CHART_DIR), "--namespace", "nodegate-system")
    assert proc.returncode == 0, proc.stderr
    plain = sorted((o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(proc.stdout) if o)
    for_cluster = sorted((o["kind"], o["metadata"]["name"]) for o in rendered({}))
    assert plain == for_cluster, "Helm's default capabilities render every object a 1.35 cluster gets"


def test_plain_helm_template_stops_only_at_the_default_namespace_and_says_what_to_pass() -> None:
    # No flags at all: Helm's namespace is "default", which the chart refuses on purpose (privileged
    # package pods run in the release namespace). The Kubernetes version no longer stops it.
    proc = _helm_template(str(CHART_DIR))
    assert proc.returncode != 0
    assert 'does not install into the "default" namespace' in proc.stderr
    assert "helm template" in proc.stderr and "-n nodegate-system" in proc.stderr
    assert "kubeVersion" not in proc.stderr and "Kubernetes" not in proc.stderr


@pytest.mark.parametrize("version", ["1.29.9", "1.25.0"])
def test_a_kubernetes_older_than_the_supported_range_is_refused(version: str) -> None:
    proc = _helm_template("nodegate", str(CHART_DIR), "--namespace", "nodegate-system", "--kube-version", version)
    assert proc.returncode != 0
    assert f"NodeGate needs Kubernetes >=1.30.0-0; this cluster (or --kube-version) is v{version}" in proc.stderr


def test_the_supported_range_is_stated_once_and_helm_checks_no_kubeversion_before_rendering() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert "kubeVersion" not in chart
    assert chart["annotations"]["nodegate.io/kube-version"] == ">=1.30.0-0"
    proc = _helm_template("nodegate", str(CHART_DIR), "--namespace", "nodegate-system", "--kube-version", "1.30.0")
    assert proc.returncode == 0, proc.stderr


# -- RBAC -------------------------------------------------------------------------------------------------

def _rbac_objects(objs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    out = {}
    for o in objs:
        if o["kind"] not in RBAC_KINDS:
            continue
        meta = o["metadata"]
        key = (o["kind"], meta["name"], meta.get("namespace", ""))
        out[key] = {k: o.get(k) for k in ("rules", "roleRef", "subjects", "automountServiceAccountToken")}
    return out


@pytest.mark.parametrize("name", ["defaults", "cert-manager", "custom", "custom+cert-manager"])
def test_chart_rbac_is_exactly_gate_controller_rbac(name: str) -> None:
    values = VALUE_SETS[name]
    prefix = values.get("fullnameOverride") or "nodegate"
    self_managed = not values.get("certManager", {}).get("enabled")
    want = [*rbac.operator_rbac("nodegate-system", prefix=prefix),
            *rbac.webhook_rbac("nodegate-system", prefix=prefix, self_managed=self_managed,
                               configuration_name=prefix, secret_name=f"{prefix}-webhook-tls"),
            *rbac.pre_delete_rbac("nodegate-system", prefix=prefix, configuration_name=prefix)]
    assert _rbac_objects(rendered(values)) == _rbac_objects(want)


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rbac_has_no_wildcards_and_every_rule_says_why(name: str) -> None:
    text = rendered_text(VALUE_SETS[name])
    for doc in text.split("\n---\n"):
        obj = yaml.safe_load(doc)
        if not obj or obj.get("kind") not in ("ClusterRole", "Role"):
            continue
        for rule in obj["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), f"{obj['metadata']['name']}: wildcard in {field}"
            assert rule["verbs"], obj["metadata"]["name"]
        lines = doc.splitlines()
        rule_lines = [i for i, line in enumerate(lines) if line.startswith("- apiGroups:")]
        assert len(rule_lines) == len(obj["rules"])
        for i in rule_lines:
            assert lines[i - 1].startswith("# ") and len(lines[i - 1]) > 12, \
                f"{obj['metadata']['name']}: rule without a reason: {lines[i]}"


def test_the_operator_runs_stage_pods_and_is_granted_no_jobs() -> None:
    """Stage pods are bare pods in the operator's namespace: its Role creates and deletes pods there,
    and none of its roles grants anything of batch/v1 (the pre-delete hook's Job is Helm's, not its)."""
    objs = _rbac_objects(rendered({}))
    operator = {key: o for key, o in objs.items() if key[0] in ("Role", "ClusterRole") and
                key[1].startswith("nodegate-operator")}
    assert operator, objs.keys()
    for key, role in operator.items():
        for rule in role["rules"]:
            assert "batch" not in rule["apiGroups"] and not {"jobs", "cronjobs"} & set(rule["resources"]), key
    namespaced = operator[("Role", "nodegate-operator", "nodegate-system")]["rules"]
    pod_verbs = {v for r in namespaced if r["apiGroups"] == [""] and "pods" in r["resources"] for v in r["verbs"]}
    assert {"create", "delete"} <= pod_verbs
    # Watching pods is the cluster rule's: the workload cache watches every namespace, the stage pod
    # cache the operator's own.
    cluster = operator[("ClusterRole", "nodegate-operator", "")]["rules"]
    assert any(r["apiGroups"] == [""] and "pods" in r["resources"] and "watch" in r["verbs"] for r in cluster)


def test_rule_reasons_of_rbac_py_reach_the_rendered_roles() -> None:
    text = rendered_text({})
    for rules in rbac.RULE_SETS.values():
        for rule in rules:
            assert f"# {rule.why}\n" in text


# -- webhook configurations -----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "namespace"), [("defaults", "nodegate-system"), ("custom", "platform"),
                                                 ("cert-manager", "kube-system")])
def test_webhook_configurations_are_exactly_webhook_configurations(name: str, namespace: str) -> None:
    values = VALUE_SETS[name]
    prefix = values.get("fullnameOverride") or "nodegate"
    hook = values.get("webhook", {})
    validating, mutating = webhook_configurations(
        mode="service", name=prefix, service_name=f"{prefix}-webhook", service_namespace=namespace,
        operator_namespace=namespace, operator_service_account=f"{prefix}-operator",
        timeout_seconds=hook.get("timeoutSeconds", 5),
        node_mutation_failure_policy=hook.get("nodeMutationFailurePolicy", "Ignore"))
    objs = rendered(values, namespace=namespace)
    for want in (validating, mutating):
        got = find(objs, want["kind"])
        assert got["metadata"]["name"] == want["metadata"]["name"]
        assert got["webhooks"] == want["webhooks"]
        assert {k: v for k, v in got["metadata"]["labels"].items() if k in want["metadata"]["labels"]} == \
            want["metadata"]["labels"]


def test_selectors_exclude_the_release_namespace_and_kube_system_and_failure_policies_are_as_documented() -> None:
    objs = rendered({}, namespace="tenant-ops")
    policies = {}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for hook in find(objs, kind)["webhooks"]:
            [expr] = hook["namespaceSelector"]["matchExpressions"]
            assert "caBundle" not in hook["clientConfig"]  # set at run time, so upgrades leave it alone
            assert hook["timeoutSeconds"] <= 5
            policies[hook["name"]] = hook["failurePolicy"]
            if hook["name"] == "stage-pod-connect.validate.nodegate.io":
                # exec into NodeGate's pods: only the release namespace, where they run; an Event is written
                assert expr == {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["tenant-ops"]}
                assert hook["sideEffects"] == "NoneOnDryRun"
                continue
            assert expr == {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                            "values": ["kube-system", "tenant-ops"]}
            assert hook["sideEffects"] == "None"
    # docs/admission.md: Fail for NodeGate and DeploymentPolicy, for removing the readiness taint and for exec
    # into NodeGate's pods; Ignore for the Node CREATE mutation unless asked for
    assert policies == {"nodegates.validate.nodegate.io": "Fail", "deploymentpolicies.validate.nodegate.io": "Fail",
                        "node-taint.validate.nodegate.io": "Fail", "stage-pod-connect.validate.nodegate.io": "Fail",
                        "defaults.mutate.nodegate.io": "Fail", "node-taint.mutate.nodegate.io": "Ignore"}
    strict = rendered({"webhook": {"nodeMutationFailurePolicy": "Fail"}})
    node = [h for h in find(strict, "MutatingWebhookConfiguration")["webhooks"] if h["name"].startswith("node-")]
    assert node[0]["failurePolicy"] == "Fail"


def test_cert_manager_mode_injects_the_ca_into_both_configurations() -> None:
    for values, namespace in ((CERT_MANAGER, "nodegate-system"), (NAMED_ISSUER, "ops")):
        objs = rendered(values, namespace=namespace)
        for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            annotations = find(objs, kind)["metadata"]["annotations"]
            assert annotations == {"cert-manager.io/inject-ca-from": f"{namespace}/nodegate-webhook"}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        assert "annotations" not in find(rendered({}), kind)["metadata"]


# -- certificates ---------------------------------------------------------------------------------------

def test_cert_manager_mode_issues_the_serving_certificate_from_a_ca_of_its_own_or_a_named_issuer() -> None:
    hosts = ["nodegate-webhook", "nodegate-webhook.nodegate-system", "nodegate-webhook.nodegate-system.svc",
             "nodegate-webhook.nodegate-system.svc.cluster.local"]
    own = rendered(CERT_MANAGER)
    issuers = {o["metadata"]["name"]: o["spec"] for o in own if o["kind"] == "Issuer"}
    assert issuers == {"nodegate-selfsigned": {"selfSigned": {}}, "nodegate-ca": {"ca": {"secretName": "nodegate-ca"}}}
    ca = find(own, "Certificate", "nodegate-ca")["spec"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == "nodegate-selfsigned"
    serving = find(own, "Certificate", "nodegate-webhook")["spec"]
    assert serving["dnsNames"] == hosts and serving["issuerRef"] == {"name": "nodegate-ca", "kind": "Issuer",
                                                                      "group": "cert-manager.io"}
    deployment = find(own, "Deployment", "nodegate-webhook")["spec"]["template"]["spec"]
    env = env_of(deployment["containers"][0])
    assert env["NODEGATE_WEBHOOK_CERT_MODE"] == "files" and env["NODEGATE_WEBHOOK_CERT_DIR"] == "/tls"
    secret_volume = [v for v in deployment["volumes"] if "secret" in v]
    assert secret_volume == [{"name": "tls", "secret": {"secretName": serving["secretName"]}}]
    assert {"name": "tls", "mountPath": "/tls", "readOnly": True} in deployment["containers"][0]["volumeMounts"]

    named = rendered(NAMED_ISSUER)
    assert [o["kind"] for o in named if o["kind"] in ("Issuer", "Certificate")] == ["Certificate"]
    assert find(named, "Certificate")["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer",
                                                              "group": "cert-manager.io"}
    assert not [o for o in rendered({}) if o["kind"] in ("Issuer", "Certificate")]


# -- workloads ------------------------------------------------------------------------------------------

def _resolve(env: dict[str, str], namespace: str, pod: str) -> dict[str, str]:
    refs = {"fieldRef:metadata.namespace": namespace, "fieldRef:metadata.name": pod}
    return {k: refs.get(v, v) for k, v in env.items()}


@pytest.mark.parametrize("name", ["defaults", "custom", "cert-manager"])
def test_processes_read_the_settings_the_chart_sets(name: str) -> None:
    """Every NODEGATE_* variable is a real setting, and parsed by the processes' own settings code they
    agree with the chart's names: lease, namespace, package ServiceAccount, Secret, configurations,
    the operator identity the webhook and the configurations trust."""
    values = VALUE_SETS[name]
    prefix = values.get("fullnameOverride") or "nodegate"
    objs = rendered(values, namespace="ops")
    operator = find(objs, "Deployment", f"{prefix}-operator")["spec"]["template"]["spec"]
    env = _resolve(env_of(operator["containers"][0]), "ops", "pod-a")
    known = {f"NODEGATE_{f.upper()}" for f in OperatorSettings.__dataclass_fields__}
    assert set(env) <= known, set(env) - known
    settings = OperatorSettings.from_args(None, env=env)
    assert settings.namespace == "ops" and settings.identity == "pod-a"
    assert settings.lease_name == f"{prefix}-operator"
    # the Secret the operator reads its record signing keys from is the one its Role names
    assert settings.state_key_secret == rbac.state_key_secret(prefix)
    [role] = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == f"{prefix}-operator"]
    assert any(r["resources"] == ["secrets"] and r.get("resourceNames") == [settings.state_key_secret]
               for r in role["rules"]), role["rules"]
    assert settings.package_service_account == find(objs, "ServiceAccount", f"{prefix}-package")["metadata"]["name"]
    assert settings.agent_image == operator["containers"][0]["image"]
    assert settings.lease_seconds == values.get("operator", {}).get("leaderElection", {}).get("leaseSeconds", 15)
    assert operator["serviceAccountName"] == f"{prefix}-operator"

    webhook = find(objs, "Deployment", f"{prefix}-webhook")["spec"]["template"]["spec"]
    wenv = _resolve(env_of(webhook["containers"][0]), "ops", "pod-b")
    wknown = {f"NODEGATE_WEBHOOK_{f.upper()}" for f in WebhookSettings.__dataclass_fields__}
    assert set(wenv) <= wknown, set(wenv) - wknown
    ws = webhook_settings_from(argparse.Namespace(), wenv)
    assert ws.operator_username == f"system:serviceaccount:ops:{prefix}-operator"
    [cond] = [c for h in find(objs, "ValidatingWebhookConfiguration")["webhooks"]
              for c in h.get("matchConditions", []) if c["name"] == "not-the-operator"]
    assert ws.operator_username in cond["expression"]
    port = next(p["containerPort"] for p in webhook["containers"][0]["ports"] if p["name"] == "https")
    assert ws.host_port == ("0.0.0.0", port)
    assert webhook["serviceAccountName"] == f"{prefix}-webhook"
    if ws.cert_mode == "self-managed":
        assert ws.secret_namespace == "ops" and ws.secret_name == f"{prefix}-webhook-tls"
        assert ws.configuration_name == find(objs, "MutatingWebhookConfiguration")["metadata"]["name"]
        assert set(ws.hosts) == {f"{prefix}-webhook", f"{prefix}-webhook.ops", f"{prefix}-webhook.ops.svc",
                                 f"{prefix}-webhook.ops.svc.cluster.local"}


SAFE_IMAGE_POLICY: Obj = {"allowedRepositories": ["registry.example.com/nodegate", "ghcr.io/acme"],
                          "requireDigest": True}


def test_the_image_policy_values_reach_the_webhook_settings() -> None:
    def policy(values: Obj) -> ImagePolicy:
        webhook = find(rendered(values), "Deployment", "nodegate-webhook")["spec"]["template"]["spec"]
        env = _resolve(env_of(webhook["containers"][0]), "nodegate-system", "pod")
        return webhook_settings_from(argparse.Namespace(), env).image_policy

    catalog = policy({}).package_repositories
    assert policy({}) == ImagePolicy(package_repositories=catalog)
    assert policy({"webhook": {"imagePolicy": SAFE_IMAGE_POLICY}}) == ImagePolicy(
        ("registry.example.com/nodegate", "ghcr.io/acme"), require_digest=True, package_repositories=catalog)
    # the safe setting the values comments show is this one
    comment = (CHART_DIR / "values.yaml").read_text()
    assert "allowedRepositories: [registry.example.com/nodegate, ghcr.io/acme]" in comment.replace("\n  # ", " ")


def catalog_images() -> dict[str, str]:
    """Each package of packages/ by its name, with the repository of its example gate's image."""
    out = {}
    for manifest in sorted(REPO.glob("packages/*/package.yaml")):
        name = yaml.safe_load(manifest.read_text())["name"]
        example = yaml.safe_load((manifest.parent / "nodegate.yaml").read_text())
        ref = syntax.parse_image(example["spec"]["packages"][name]["image"])
        assert not isinstance(ref, str), ref
        out[name] = ref.name
    return out


def test_the_chart_binds_every_catalog_package_to_its_own_image_repository_and_nothing_else() -> None:
    """Fails when a package joins or leaves packages/, or its image moves, and the chart's default
    binding does not follow (webhook.imagePolicy.packages in values.yaml)."""
    catalog = catalog_images()
    assert len(catalog) >= 14 and "sysctl-tuning" in catalog
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["webhook"]["imagePolicy"]
    assert defaults["packages"] == {name: [repository] for name, repository in catalog.items()}
    assert defaults["unboundPackages"] == "allow"
    # ... and each binding admits its own package's image and no other catalog package's
    webhook = find(rendered({}), "Deployment", "nodegate-webhook")["spec"]["template"]["spec"]
    policy = webhook_settings_from(argparse.Namespace(), _resolve(env_of(webhook["containers"][0]), "ns", "pod")) \
        .image_policy
    for name in catalog:
        for other, image in catalog.items():
            refused = image_violations({name: {"version": "1.0.0", "image": image}}, [name], policy)
            assert (refused == []) is (other == name), (name, image)


def test_the_binding_values_reach_the_webhook_settings_merged_over_the_catalog() -> None:
    def policy(values: Obj) -> ImagePolicy:
        webhook = find(rendered(values), "Deployment", "nodegate-webhook")["spec"]["template"]["spec"]
        env = _resolve(env_of(webhook["containers"][0]), "nodegate-system", "pod")
        return webhook_settings_from(argparse.Namespace(), env).image_policy

    mirror = {"sysctl-tuning": ["registry.internal:5000/mirror/sysctl-tuning"], "kdump": None,
              "my-own": ["ghcr.io/acme/my-own", "quay.io/acme"]}
    changed = policy({"webhook": {"imagePolicy": {"packages": mirror, "unboundPackages": "refuse"}}})
    assert changed.unbound_packages == "refuse"
    assert changed.bound_repositories("sysctl-tuning") == ("registry.internal:5000/mirror/sysctl-tuning",)
    assert changed.bound_repositories("kdump") is None  # null removes a default binding
    assert changed.bound_repositories("my-own") == ("ghcr.io/acme/my-own", "quay.io/acme")
    assert changed.bound_repositories("tuned") == ("ghcr.io/example/nodegate-tuned",)  # the rest stays
    # no binding at all: the variable is left out, and the webhook binds nothing
    every = {name: None for name in catalog_images()}
    assert policy({"webhook": {"imagePolicy": {"packages": every}}}).package_repositories == ()


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_no_env_var_renders_an_empty_value(name: str) -> None:
    # The API server stores value "" as no value: what the chart renders would differ from what runs.
    for obj in rendered(VALUE_SETS[name]):
        if obj["kind"] in ("Deployment", "Job"):
            for container in obj["spec"]["template"]["spec"]["containers"]:
                empty = [e["name"] for e in container.get("env", []) if "valueFrom" not in e and e.get("value") in
                         (None, "")]
                assert empty == [], f"{obj['metadata']['name']}: {empty}"


@pytest.mark.parametrize("entry", ["ghcr.io", "ghcr.io/acme", "ghcr.io/acme/", "registry.internal:5000",
                                   "registry:5000/team", "localhost/x", "[::1]:5000/a", "docker.io/nvidia",
                                   "acme", "library/ubuntu", "ghcr.io/Acme", "ghcr.io/acme:1.0", "ghcr.io//x",
                                   "ghcr.io/acme,quay.io", ""])
def test_the_schema_and_the_webhook_agree_on_what_an_allowed_repository_is(entry: str) -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    policy = schema["properties"]["webhook"]["properties"]["imagePolicy"]["properties"]
    item = policy["allowedRepositories"]["items"]
    assert (re.search(item["pattern"], entry) is not None) is (prefix_problem(entry) is None)
    # a package's bound repositories are entries of the same kind
    assert policy["packages"]["additionalProperties"]["items"] == item
    assert (re.search(item["pattern"], entry) is not None) is (prefix_problem(entry, "bound repository") is None)


def test_one_image_serves_webhook_operator_agent_and_hook() -> None:
    assert (CHART_DIR / "Chart.yaml").read_text().count(f'appVersion: "{gate.__version__}"') == 1
    for values, image in (({}, OperatorSettings().agent_image),
                          (CUSTOM, "registry.corp/ng@sha256:" + "a" * 64)):
        objs = rendered(values)
        images = {c["image"] for o in objs if o["kind"] in ("Deployment", "Job")
                  for c in o["spec"]["template"]["spec"]["containers"]}
        agent = {env_of(c)["NODEGATE_AGENT_IMAGE"] for o in objs if o["kind"] == "Deployment"
                 for c in o["spec"]["template"]["spec"]["containers"] if "NODEGATE_AGENT_IMAGE" in env_of(c)}
        assert images == agent == {image}


def test_webhook_runs_two_replicas_behind_a_service_with_a_budget_and_readiness_on_readyz() -> None:
    objs = rendered({})
    deployment = find(objs, "Deployment", "nodegate-webhook")
    pods = deployment["spec"]["template"]
    assert deployment["spec"]["replicas"] == 2
    assert pods["spec"]["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https",
                                                                          "scheme": "HTTPS"}
    labels = pods["metadata"]["labels"]
    service = find(objs, "Service", "nodegate-webhook")["spec"]
    assert service["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
    assert service["selector"].items() <= labels.items()
    pdb = find(objs, "PodDisruptionBudget", "nodegate-webhook")["spec"]
    assert pdb["minAvailable"] == 1 and pdb["selector"]["matchLabels"].items() <= labels.items()
    # selectors pick one component each: the webhook's budget never counts operator pods
    operator_labels = find(objs, "Deployment", "nodegate-operator")["spec"]["template"]["metadata"]["labels"]
    assert not pdb["selector"]["matchLabels"].items() <= operator_labels.items()
    # one replica: no budget (it would block every drain of its node)
    assert not [o for o in rendered(CUSTOM) if o["kind"] == "PodDisruptionBudget" and "webhook" in
                o["metadata"]["name"]]


def test_operator_runs_two_leader_elected_replicas_non_root_tolerating_the_readiness_taint() -> None:
    objs = rendered({})
    deployment = find(objs, "Deployment", "nodegate-operator")["spec"]
    assert deployment["replicas"] == 2
    for o in objs:
        if o["kind"] not in ("Deployment", "Job"):
            continue
        spec = o["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        for c in spec["containers"]:
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
        assert {"key": "nodegate.io/runtime-required", "operator": "Exists", "effect": "NoSchedule"} \
            in spec["tolerations"]
    assert find(objs, "ServiceAccount", "nodegate-package")["automountServiceAccountToken"] is False


def test_pre_delete_hook_deletes_the_webhook_configurations_with_its_own_narrow_rbac() -> None:
    from gate.cli.main import parser

    objs = [o for o in rendered(CUSTOM) if (o["metadata"].get("annotations") or {}).get("helm.sh/hook")]
    assert {o["kind"] for o in objs} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}
    for o in objs:
        assert o["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    job = find(objs, "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = parser().parse_args(container["args"])
    assert args.command == "pre-delete" and args.configuration_name == "ng"
    assert find(objs, "ClusterRole")["rules"] == [{
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
        "resourceNames": ["ng"], "verbs": ["delete"]}]
    assert not [o for o in rendered({"preDeleteHook": {"enabled": False}})
                if (o["metadata"].get("annotations") or {}).get("helm.sh/hook")]


# -- observability --------------------------------------------------------------------------------------

# Labels Prometheus adds to every series it scrapes (prometheus-operator's target labels).
TARGET_LABELS = {"namespace", "pod", "job", "instance", "service", "endpoint", "container"}


def exported_metrics() -> dict[str, set[str]]:
    """Every series name the operator and the webhook export, with its labels."""
    from prometheus_client.metrics import MetricWrapperBase

    from gate.admission.server import Metrics
    from gate.controller.metrics import OperatorMetrics, Tracked

    out: dict[str, set[str]] = {}
    for holder in (OperatorMetrics(), Metrics()):
        for held in vars(holder).values():
            metric = held.metric if isinstance(held, Tracked) else held  # a metric that remembers its series
            if not isinstance(metric, MetricWrapperBase):
                continue
            # prometheus_client keeps a metric's name and label names in these attributes
            name, labels, kind = metric._name, set(metric._labelnames), metric._type
            if kind == "counter":
                out[f"{name}_total"] = labels
            elif kind == "histogram":
                out[f"{name}_bucket"] = labels | {"le"}
                out[f"{name}_sum"] = out[f"{name}_count"] = labels
            else:
                out[name] = labels
    return out


def _check_expression(expr: str, exported: dict[str, set[str]]) -> None:
    used = re.findall(r"\b(nodegate_[a-z0-9_]+)\s*(\{[^}]*\})?", expr)
    assert used, f"no NodeGate metric in {expr!r}"
    labels: set[str] = set(TARGET_LABELS)
    for name, selector in used:
        assert name in exported, f"{name} is not a metric NodeGate exports ({expr!r})"
        labels |= exported[name]
        for key in re.findall(r"([a-z_]+)\s*(?:=~|!=|!~|=)", selector):
            assert key in exported[name] | TARGET_LABELS, f"{name} has no label {key}"
    for group in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
        for key in filter(None, (k.strip() for k in group.split(","))):
            assert key in labels, f"label {key} in {expr!r} is on none of its metrics"


def test_alerts_cover_the_issues_and_use_metrics_the_code_exports() -> None:
    rule = find(rendered(EVERYTHING), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"NodeGateRolloutStopped", "NodeGateNodeFailed", "NodeGateDrainBlocked", "NodeGateWebhookErrors",
            "NodeGateWebhookLatencyHigh", "NodeGateImageNotVerified"} <= set(alerts)
    exported = exported_metrics()
    for name, alert in alerts.items():
        if name == "NodeGateWebhookDown":  # Prometheus's own `up` of the webhook's scrape job
            assert 'job="nodegate-webhook"' in alert["expr"]
            continue
        _check_expression(alert["expr"], exported)
        assert alert["labels"]["severity"] in ("warning", "critical") and alert["annotations"]["summary"]
    assert alerts["NodeGateDrainBlocked"]["for"] == "30m"
    assert "> 0.5" in alerts["NodeGateWebhookLatencyHigh"]["expr"]
    assert "histogram_quantile(0.99" in alerts["NodeGateWebhookLatencyHigh"]["expr"]


def test_grafana_dashboard_is_valid_json_using_only_exported_metrics() -> None:
    dashboard = json.loads((CHART_DIR / "dashboards" / "nodegate.json").read_text())
    exported = exported_metrics()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    for expr in exprs:
        _check_expression(expr, exported)
    used = {n for e in exprs for n in re.findall(r"\b(nodegate_[a-z0-9_]+)", e)}
    # every family is on the dashboard (histograms through their buckets)
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exported}
    assert families <= {re.sub(r"_bucket$", "", n) for n in used}, families - used
    configmap = find(rendered(EVERYTHING), "ConfigMap", "nodegate-dashboard")
    assert json.loads(configmap["data"]["nodegate.json"]) == dashboard
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_service_monitors_scrape_both_components_and_verify_the_webhook_certificate() -> None:
    objs = rendered(EVERYTHING)
    operator = find(objs, "ServiceMonitor", "nodegate-operator")["spec"]
    assert operator["endpoints"][0]["port"] == "metrics"
    webhook = find(objs, "ServiceMonitor", "nodegate-webhook")["spec"]["endpoints"][0]
    assert webhook["scheme"] == "https" and webhook["tlsConfig"]["ca"]["secret"] == {
        "name": "nodegate-webhook-tls", "key": "ca.crt"}
    assert webhook["tlsConfig"]["serverName"] == "nodegate-webhook.nodegate-system.svc"
    assert not [o for o in rendered({}) if o["kind"] in ("ServiceMonitor", "PrometheusRule", "NetworkPolicy")]


def test_network_policies_let_in_only_webhook_and_metrics_ports_and_out_only_dns_and_the_api_server() -> None:
    objs = rendered(EVERYTHING)
    webhook = find(objs, "NetworkPolicy", "nodegate-webhook")["spec"]
    assert webhook["ingress"] == [{"ports": [{"port": 9443, "protocol": "TCP"}],
                                   "from": [{"ipBlock": {"cidr": "10.0.0.0/8"}},
                                            {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]}]
    operator = find(objs, "NetworkPolicy", "nodegate-operator")["spec"]
    assert operator["ingress"][0]["ports"] == [{"port": 8080, "protocol": "TCP"}]
    for spec in (webhook, operator):
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        ports = {(p["port"], p["protocol"]) for rule in spec["egress"] for p in rule["ports"]}
        assert ports == {(53, "UDP"), (53, "TCP"), (443, "TCP"), (6443, "TCP")}
        assert all("to" not in rule for rule in spec["egress"][:2])  # DNS and the API server



def test_the_operator_reaches_registries_only_while_it_resolves_image_digests() -> None:
    def operator(values: Obj) -> Obj:
        objs = rendered(values)
        env = {e["name"]: e.get("value") for e in find(objs, "Deployment", "nodegate-operator")["spec"]["template"]
               ["spec"]["containers"][0]["env"]}
        return {"env": (env["NODEGATE_RESOLVE_DIGESTS"], env["NODEGATE_RESOLVE_TIMEOUT"]),
                "egress": find(objs, "NetworkPolicy", "nodegate-operator")["spec"]["egress"]}

    on = operator(EVERYTHING)
    assert on["env"] == ("true", "15")
    # DNS, the API server, and the registries (any address on 443 but link-local and metadata ones,
    # unless registryTo names them)
    assert on["egress"][-1] == {"ports": [{"port": 443, "protocol": "TCP"}], "to": PUBLIC_PEERS}
    peers = [{"ipBlock": {"cidr": "192.0.2.10/32"}}]
    named = operator({**EVERYTHING, "networkPolicy": {**EVERYTHING["networkPolicy"], "registryTo": peers,
                                                      "registryPorts": [5000]}})
    assert named["egress"][-1] == {"ports": [{"port": 5000, "protocol": "TCP"}], "to": peers}
    off = operator({**EVERYTHING, "operator": {"images": {"resolveDigests": False}}})
    assert off["env"] == ("false", "15")
    assert len(off["egress"]) == len(on["egress"]) - 1 and all("to" not in rule for rule in off["egress"])


PUBLIC_PEERS = [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16", "100.100.100.200/32"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10", "fd00:ec2::254/128"]}}]


def test_the_operators_egress_reaches_only_dns_the_api_server_registries_and_prometheus() -> None:
    """Off by default; on, the operator's pods reach DNS, the API server, registries and the configured
    Prometheus endpoints on their ports, and by default never a link-local or cloud metadata address."""
    assert not [o for o in rendered(ENDPOINTS) if o["kind"] == "NetworkPolicy"]
    egress = find(rendered({**EVERYTHING, **ENDPOINTS}), "NetworkPolicy", "nodegate-operator")["spec"]["egress"]
    assert [sorted(p["port"] for p in rule["ports"]) for rule in egress] == [[53, 53], [443, 6443], [443], [9090]]
    assert egress[2]["to"] == egress[3]["to"] == PUBLIC_PEERS
    for rule in egress[2:]:
        blocks = [peer["ipBlock"] for peer in rule["to"]]
        assert {"169.254.0.0/16", "fe80::/10"} <= {e for b in blocks for e in b["except"]}
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    named = find(rendered({**EVERYTHING, **ENDPOINTS, "networkPolicy": {
        **EVERYTHING["networkPolicy"], "prometheusTo": peers, "prometheusPorts": [9091]}}),
        "NetworkPolicy", "nodegate-operator")["spec"]["egress"]
    assert named[-1] == {"ports": [{"port": 9091, "protocol": "TCP"}], "to": peers}
    # Without an endpoint, no Prometheus rule.
    assert len(find(rendered(EVERYTHING), "NetworkPolicy", "nodegate-operator")["spec"]["egress"]) == 3


def test_prometheus_endpoints_reach_the_operator_as_a_file_and_mounted_secrets() -> None:
    objs = rendered(ENDPOINTS)
    config = find(objs, "ConfigMap", "nodegate-operator-prometheus-endpoints")
    endpoints = parse_endpoints(yaml.safe_load(config["data"]["endpoints.yaml"]))  # as the operator reads it
    assert endpoints["main"].url == "https://prometheus-operated.monitoring:9090"
    assert endpoints["main"].ca_file == "/etc/nodegate/prometheus/main/ca.crt"
    assert endpoints["main"].bearer_token_file == "/etc/nodegate/prometheus/main/token"
    assert endpoints["plain"].ca_file is None and endpoints["plain"].bearer_token_file is None
    pod = find(objs, "Deployment", "nodegate-operator")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert env_of(container)["NODEGATE_PROMETHEUS_ENDPOINTS"] == "/etc/nodegate/endpoints/endpoints.yaml"
    assert env_of(container)["NODEGATE_REGISTRY_TOKEN_HOSTS"] == "auth.docker.io"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert set(mounts) == {"/etc/nodegate/endpoints", "/etc/nodegate/prometheus/main"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert [s["secret"] for s in volumes[mounts["/etc/nodegate/prometheus/main"]]["projected"]["sources"]] == [
        {"name": "prom-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
        {"name": "prom-reader", "items": [{"key": "token", "path": "token"}]}]
    # None configured: no file, no mounts, and the operator asks no Prometheus at all.
    default = find(rendered({}), "Deployment", "nodegate-operator")["spec"]["template"]["spec"]
    assert "NODEGATE_PROMETHEUS_ENDPOINTS" not in env_of(default["containers"][0]) and "volumes" not in default



def _public_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def test_image_signatures_reach_the_operator_as_a_policy_file_it_loads_and_alert_by_mode() -> None:
    pem = _public_pem()
    policy_values: Obj = {"mode": "warn", "rules": [
        {"name": "team", "repositories": ["registry.example.com/team/*"], "keys": [{"name": "team-2026", "pem": pem}]}]}
    objs = rendered({**EVERYTHING, "operator": {"imageSignatures": policy_values}})
    config = find(objs, "ConfigMap", "nodegate-operator-image-signatures")
    policy = load_policy(config["data"]["policy.yaml"], source="chart")  # as the operator reads it
    assert policy.mode == "warn" and policy.unmatched == "allow"
    rule = policy.rule_for("registry.example.com/team/tool")
    assert rule is not None and rule.name == "team" and [k.name for k in rule.keys] == ["team-2026"]
    pod = find(objs, "Deployment", "nodegate-operator")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    path = env_of(container)["NODEGATE_IMAGE_SIGNATURES"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "image-signatures"]
    assert path == f"{mount['mountPath']}/policy.yaml" and mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == "image-signatures"]
    assert volume["configMap"]["name"] == config["metadata"]["name"]
    alerts = {r["alert"]: r for g in find(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert alerts["NodeGateImageNotVerified"]["labels"]["severity"] == "warning"  # warn mode: runs anyway
    enforcing = {**EVERYTHING, "operator": {"imageSignatures": {**policy_values, "mode": "enforce"}}}
    alerts = {r["alert"]: r for g in find(rendered(enforcing), "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert alerts["NodeGateImageNotVerified"]["labels"]["severity"] == "critical"  # a held gate
    # unmatched: refuse alone is a policy too (every image needs a rule)
    refusing = find(rendered({"operator": {"imageSignatures": {"unmatched": "refuse"}}}), "ConfigMap",
                    "nodegate-operator-image-signatures")
    assert load_policy(refusing["data"]["policy.yaml"], source="chart").unmatched == "refuse"
    # The defaults verify nothing: no policy file, no mount, no setting.
    default = find(rendered({}), "Deployment", "nodegate-operator")["spec"]["template"]["spec"]
    assert "NODEGATE_IMAGE_SIGNATURES" not in env_of(default["containers"][0]) and "volumes" not in default
    assert not [o for o in rendered({}) if o["kind"] == "ConfigMap" and "image-signatures" in o["metadata"]["name"]]


# -- generated files ------------------------------------------------------------------------------------

def test_chart_crds_are_the_top_level_crds_byte_for_byte() -> None:
    top = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART_DIR / "crds").glob("*.yaml")}
    assert top and chart == top


def test_generated_rules_and_plain_manifests_are_current() -> None:
    assert stale(REPO) == [], "run `make manifests`"


def test_plain_manifests_build_with_kustomize() -> None:
    from tests.conftest import kubectl_path

    kinds: dict[str, set[str]] = {}
    for directory in ("operator", "webhooks", "certs"):
        proc = subprocess.run([kubectl_path(), "kustomize", str(REPO / directory)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        kinds[directory] = {o["kind"] for o in yaml.safe_load_all(proc.stdout)}
        assert "Job" not in kinds[directory]  # no Helm hook in plain manifests
        assert "helm.sh/chart" not in proc.stdout and "managed-by: Helm" not in proc.stdout
    assert {"Namespace", "CustomResourceDefinition", "Deployment", "ClusterRole", "Role"} <= kinds["operator"]
    assert {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "Deployment", "Service",
            "PodDisruptionBudget"} <= kinds["webhooks"]
    assert {"Issuer", "Certificate", "ValidatingWebhookConfiguration"} <= kinds["certs"]
    assert "Issuer" not in kinds["webhooks"]


def test_kind_script_is_valid_bash() -> None:
    script = REPO / "hack" / "kind-e2e.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    for step in ("docker build", "kind create cluster", "cert-manager", "helm upgrade --install", "NodeGate"):
        assert step in text
