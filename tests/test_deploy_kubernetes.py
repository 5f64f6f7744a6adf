"""The Kubernetes manifests (deploy/kubernetes/):

- built-in kinds are validated strictly against the Kubernetes OpenAPI schemas
  (kubernetes-validate) for the oldest and newest versions we claim;
- CRDs have no schema offline: a PyTorchJob's pod templates are validated as core
  v1 PodTemplates, and PodMonitor/ServiceMonitor are checked structurally and
  against what they select (labels, port names);
- every WATCHDOG_* variable is a real flag and the agent/coordinator environments
  load through the daemons' own parsers; no token is passed on a command line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

from watchdog import flags
from watchdog.agent import config as agent_config
from watchdog.agent.metrics import RANK_LABELS
from watchdog.coordinator import config as coord_config
from watchdog.hook import config as hook_config

K8S = promcheck.REPO / "deploy" / "kubernetes"
# 1.29: native sidecars (initContainers with restartPolicy: Always) on by default.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
CRD_GROUPS = ("kubeflow.org/", "monitoring.coreos.com/")


def documents() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


DOCS = documents()


def by_kind(kind: str) -> list[dict]:
    return [d for _, d in DOCS if d["kind"] == kind]


def pod_templates() -> list[tuple[str, dict]]:
    """(owner, pod template) for every workload, CRDs included."""
    out = []
    for _, d in DOCS:
        if d["kind"] in ("DaemonSet", "Deployment"):
            out.append((f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]))
        elif d["kind"] == "PyTorchJob":
            for role, spec in d["spec"]["pytorchReplicaSpecs"].items():
                out.append((f"PyTorchJob/{d['metadata']['name']}/{role}", spec["template"]))
    return out


def containers(template: dict) -> list[dict]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def test_manifests_found():
    kinds = {d["kind"] for _, d in DOCS}
    assert {"DaemonSet", "Deployment", "Service", "PyTorchJob", "PodMonitor", "ServiceMonitor"} <= kinds, kinds


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "name,doc",
    [(n, d) for n, d in DOCS if not d["apiVersion"].startswith(CRD_GROUPS)],
    ids=lambda x: x if isinstance(x, str) else x["kind"],
)
def test_builtin_kinds_validate(name: str, doc: dict, version: str):
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_crd_pod_templates_validate_as_core_pod_templates(version: str):
    jobs = by_kind("PyTorchJob")
    assert jobs
    for job in jobs:
        assert job["apiVersion"] == "kubeflow.org/v1"
        specs = job["spec"]["pytorchReplicaSpecs"]
        assert set(specs) <= {"Master", "Worker"} and "Master" in specs
        for role, spec in specs.items():
            assert isinstance(spec["replicas"], int) and spec["restartPolicy"] in (
                "OnFailure",
                "Never",
                "Always",
                "ExitCode",
            )
            assert any(c["name"] == "pytorch" for c in spec["template"]["spec"]["containers"]), role
            wrapped = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": f"{role.lower()}"},
                "template": spec["template"],
            }
            kubernetes_validate.validate(wrapped, version, strict=True)


def test_validation_can_fail():
    bad = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "x"},
        "template": {"spec": {"containers": [{"name": "c", "image": "i", "bogusField": 1}]}},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


def test_monitors_select_what_exists_and_keep_prometheus_labels():
    pods = pod_templates()
    (podmon,) = by_kind("PodMonitor")
    sel = podmon["spec"]["selector"]["matchLabels"]
    selected = [(o, t) for o, t in pods if sel.items() <= t["metadata"].get("labels", {}).items()]
    owners = {o.split("/")[0] for o, _ in selected}
    assert {"DaemonSet", "PyTorchJob"} <= owners, owners
    for ep in podmon["spec"]["podMetricsEndpoints"]:
        assert not ep.get("honorLabels"), "job/instance stay Prometheus'; the training job is training_job"
        assert not {r.get("targetLabel") for r in ep.get("relabelings", [])} & set(RANK_LABELS), ep
        assert {"targetLabel": "watchdog_component", "replacement": "agent"} in ep["relabelings"]
        for owner, t in selected:
            ports = {p["name"] for c in containers(t) for p in c.get("ports", [])}
            assert ep["port"] in ports, (owner, ep["port"], ports)

    (svcmon,) = by_kind("ServiceMonitor")
    services = [
        s
        for s in by_kind("Service")
        if svcmon["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert services
    for ep in svcmon["spec"]["endpoints"]:
        assert not ep.get("honorLabels"), "job/instance stay Prometheus'; the training job is training_job"
        assert not {r.get("targetLabel") for r in ep.get("relabelings", [])} & set(RANK_LABELS), ep
        assert {"targetLabel": "watchdog_component", "replacement": "coordinator"} in ep["relabelings"]
        assert all(ep["port"] in {p["name"] for p in s["spec"]["ports"]} for s in services)


def test_pid_namespace_choices():
    for owner, t in pod_templates():
        spec = t["spec"]
        if owner.startswith("DaemonSet"):
            assert spec.get("hostPID") is True, owner  # documented in the manifest: pids via /proc
        elif owner.startswith("PyTorchJob"):
            assert spec.get("shareProcessNamespace") is True and not spec.get("hostPID"), owner


def env_of(container: dict, tmp_path: Path) -> dict[str, str]:
    env = {}
    for e in container.get("env", []):
        env[e["name"]] = e.get("value", "node-1" if "valueFrom" in e else "")
    if "WATCHDOG_JOB_TOKEN_FILE" in env:
        token = tmp_path / "token"
        token.write_text("s3cret-of-32-bytes-s3cret-s3cret\n")
        env["WATCHDOG_JOB_TOKEN_FILE"] = str(token)
    return env


def test_environments_load_through_the_real_parsers(tmp_path: Path):
    agent_envs = {f.env for f in agent_config.FLAGS}
    coord_envs = {f.env for f in coord_config.FLAGS}
    hook_envs = {v for v in hook_config.ENV.values() if v}
    seen = set()
    for owner, t in pod_templates():
        for c in containers(t):
            args = c.get("args", [])
            assert not any("--job.token" in a and "--job.token-file" not in a for a in args + c.get("command", [])), (
                owner
            )
            env = env_of(c, tmp_path)
            assert "WATCHDOG_JOB_TOKEN" not in env, f"{owner}/{c['name']}: the token must come from a file"
            watchdog_vars = {k for k in env if k.startswith("WATCHDOG_")}
            if args[:1] == ["agent"]:
                assert watchdog_vars <= agent_envs, (owner, watchdog_vars - agent_envs)
                cfg = agent_config.load(args[1:], env)
                assert cfg.run_dir and cfg.token == "s3cret-of-32-bytes-s3cret-s3cret", owner
                seen.add("agent")
            elif args[:1] == ["coordinator"]:
                assert watchdog_vars <= coord_envs, (owner, watchdog_vars - coord_envs)
                cfg = coord_config.from_values(
                    flags.parse("watchdog coordinator", "", coord_config.FLAGS, args[1:], env)
                )
                assert cfg.token == "s3cret-of-32-bytes-s3cret-s3cret" and cfg.world_size > 0, owner
                seen.add("coordinator")
            else:  # a training container: the hook's variables only
                assert watchdog_vars <= hook_envs, (owner, watchdog_vars - hook_envs)
    assert seen == {"agent", "coordinator"}


def test_run_dir_is_shared_between_ranks_and_agent():
    for owner, t in pod_templates():
        if not owner.startswith("PyTorchJob"):
            continue
        mounts = {c["name"]: {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])} for c in containers(t)}
        agent, train = mounts["watchdog-agent"], mounts["pytorch"]
        run_dir = next(e["value"] for e in containers(t)[0]["env"] if e["name"] == "WATCHDOG_RUN_DIR")
        assert agent.get(run_dir) and agent[run_dir] == train.get(run_dir), owner


# -- one namespace, recommended labels, service accounts, probes ------------------------
NAMESPACE = "training"


def test_one_namespace_for_everything():
    (ns,) = by_kind("Namespace")
    assert ns["metadata"]["name"] == NAMESPACE
    for name, d in DOCS:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == NAMESPACE, (name, d["kind"], d["metadata"]["name"])


def test_recommended_labels():
    """app.kubernetes.io/* on every object and pod template; ours say they are part of rank-watchdog."""
    for name, d in DOCS:
        labels = d["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/name"), (name, d["kind"])
        assert labels.get("app.kubernetes.io/managed-by") or d["kind"] == "PrometheusRule", (name, d["kind"])
        if labels["app.kubernetes.io/name"] == "rank-watchdog":
            assert labels.get("app.kubernetes.io/part-of") == "rank-watchdog", (name, d["kind"])
            assert labels.get("app.kubernetes.io/component"), (name, d["kind"])
    for owner, t in pod_templates():
        assert t["metadata"]["labels"].get("app.kubernetes.io/name"), owner
    for d in by_kind("Deployment") + by_kind("DaemonSet"):
        sel = d["spec"]["selector"]["matchLabels"]
        assert sel.items() <= d["spec"]["template"]["metadata"]["labels"].items(), d["metadata"]["name"]


def test_each_workload_has_its_own_service_account_without_an_api_token():
    accounts = {sa["metadata"]["name"]: sa for sa in by_kind("ServiceAccount")}
    for owner, t in pod_templates():
        spec = t["spec"]
        assert spec.get("serviceAccountName") in accounts, owner
        assert spec.get("automountServiceAccountToken") is False, owner
    assert all(sa.get("automountServiceAccountToken") is False for sa in accounts.values())
    assert not by_kind("Role") and not by_kind("ClusterRole"), "the daemons never call the Kubernetes API"


def agent_containers() -> list[tuple[str, dict, dict]]:
    return [(owner, t, c) for owner, t in pod_templates() for c in containers(t) if c.get("args", [])[:1] == ["agent"]]


def test_agents_have_health_probes():
    found = agent_containers()
    assert {o.split("/")[0] for o, _, _ in found} == {"DaemonSet", "PyTorchJob"}
    for owner, _, c in found:
        port = {p["name"] for p in c["ports"]}
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["path"] == "/healthz" and c[probe]["httpGet"]["port"] in port, (owner, probe)


# -- privileges, per feature ------------------------------------------------------------
def effective(t: dict, c: dict, key: str):
    """A securityContext field as the kubelet resolves it: the container's, else the pod's."""
    return c.get("securityContext", {}).get(key, t["spec"].get("securityContext", {}).get(key))


def test_sidecar_runs_as_the_ranks_uid_with_only_what_stacks_need():
    """Signals and checkpoint requests need the ranks' uid; stack dumps also CAP_SYS_PTRACE,
    which Kubernetes makes effective for uid 0 only. So: same uid as the training
    container, every capability dropped, SYS_PTRACE added back only when that uid is 0."""
    sidecars = [(o, t, c) for o, t, c in agent_containers() if o.startswith("PyTorchJob")]
    assert sidecars
    for owner, t, agent in sidecars:
        (train,) = [c for c in t["spec"]["containers"] if c["name"] == "pytorch"]
        uid = effective(t, agent, "runAsUser")
        assert uid is not None and uid == effective(t, train, "runAsUser"), owner
        assert effective(t, agent, "runAsGroup") == effective(t, train, "runAsGroup"), owner
        sc = agent["securityContext"]
        assert sc["capabilities"]["drop"] == ["ALL"] and sc["allowPrivilegeEscalation"] is False, owner
        assert not sc.get("privileged") and sc["readOnlyRootFilesystem"] is True, owner
        assert sc["capabilities"].get("add", []) == (["SYS_PTRACE"] if uid == 0 else []), owner
        assert t["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", owner


def test_daemonset_and_coordinator_are_unprivileged():
    for owner, t in pod_templates():
        if owner.startswith("PyTorchJob"):
            continue
        for c in containers(t):
            sc = c["securityContext"]
            assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False, owner
            assert effective(t, c, "runAsNonRoot") is True and effective(t, c, "runAsUser") != 0, owner


def test_each_feature_is_stated_where_it_is_deployed():
    text = (K8S / "pytorchjob-with-agent-sidecar.yaml").read_text()
    for feature in ("metrics", "signals", "checkpoint requests", "stack dumps", "SYS_PTRACE", "ptrace_scope"):
        assert feature in text, feature
    daemonset = (K8S / "agent-daemonset.yaml").read_text()
    assert "CAP_SYS_PTRACE" in daemonset and "CAP_KILL" in daemonset


def test_a_job_and_its_agents_take_the_job_name_from_the_operators_label():
    # Copying the PyTorchJob for another job changes metadata.name only: the training
    # operator labels every pod with it, and the ranks and the sidecar read that label,
    # so they cannot disagree with each other or with the job. The coordinator is one
    # per job and names it (and its world size) itself.
    label = "metadata.labels['training.kubeflow.org/job-name']"
    (job,) = by_kind("PyTorchJob")
    for owner, t in pod_templates():
        if not owner.startswith("PyTorchJob"):
            continue
        for c in containers(t):
            (e,) = [e for e in c.get("env", []) if e["name"] == "WATCHDOG_JOB_NAME"]
            assert "value" not in e and e["valueFrom"]["fieldRef"]["fieldPath"] == label, (owner, c["name"])
    coords = [
        c
        for owner, t in pod_templates()
        if owner.startswith("Deployment")
        for c in containers(t)
        if c["args"][:1] == ["coordinator"]
    ]
    assert coords and all(
        {e["name"]: e.get("value") for e in c["env"]}["WATCHDOG_JOB_NAME"] == job["metadata"]["name"] for c in coords
    )
