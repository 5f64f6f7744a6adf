"""The Kubernetes deployment (deploy/kubernetes/): every kustomization rendered with
`kubectl kustomize`, as a user applies it, then checked:

- built-in kinds are validated strictly against the Kubernetes OpenAPI schemas
  (kubernetes-validate) for the oldest and newest versions we claim;
- CRDs have no schema offline: the pod templates of a PyTorchJob and of a
  TrainingRuntime (with what its TrainJob fills in) are validated as core v1
  PodTemplates, the runtime's job template as a batch/v1 Job; PodMonitor,
  ServiceMonitor and TrainJob are checked field by field against their CRDs' fields
  and against what they select (labels, port names);
- each kustomization's settings.yaml is the one place for its job name, world size,
  images, namespace, `release` label and runbook base: changed there, every object
  follows, and no default is left behind;
- every WATCHDOG_* variable is a real flag and the agent/coordinator environments
  load through the daemons' own parsers; no token is passed on a command line;
- the ranks run under `watchdog run --`, in a run directory the hook accepts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

from watchdog import flags, rundir
from watchdog.agent import config as agent_config
from watchdog.agent.export.metrics import RANK_LABELS
from watchdog.coordinator import config as coord_config
from watchdog.hook import config as hook_config

K8S = promcheck.REPO / "deploy" / "kubernetes"
# What a user applies; base/ and components/ only through them.
KUSTOMIZATIONS = ("cluster", "node-agent", "overlays/pytorchjob-sidecar", "overlays/trainjob-sidecar")
JOBS = ("overlays/pytorchjob-sidecar", "overlays/trainjob-sidecar")
# The kinds whose pods carry the agent as a sidecar, and their training container's name.
TRAINING_CONTAINER = {"PyTorchJob": "pytorch", "TrainingRuntime": "node"}
# The label with the job's name on its pods, set by its operator.
JOB_LABEL = {
    "PyTorchJob": "metadata.labels['training.kubeflow.org/job-name']",
    "TrainingRuntime": "metadata.labels['jobset.sigs.k8s.io/jobset-name']",
}
# 1.29: native sidecars (initContainers with restartPolicy: Always) on by default.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
CRD_GROUPS = ("kubeflow.org/", "monitoring.coreos.com/", "trainer.kubeflow.org/")
CLUSTER_SCOPED = ("Namespace", "PriorityClass")


def kustomize(path: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with kustomize) is needed: CI's image has it at /usr/bin/kubectl"
    res = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@cache
def rendered(name: str) -> tuple[dict, ...]:
    return tuple(kustomize(K8S / name))


def settings(name: str) -> dict[str, str]:
    return yaml.safe_load((K8S / name / "settings.yaml").read_text())["data"]


DOCS = [(name, d) for name in KUSTOMIZATIONS for d in rendered(name)]


def by_kind(kind: str, name: str | None = None) -> list[dict]:
    return [d for n, d in DOCS if d["kind"] == kind and (name is None or n == name)]


def pod_templates(name: str | None = None) -> list[tuple[str, dict]]:
    """(owner, pod template) for every workload whose pods are spelled out, CRDs included."""
    out = []
    for n, d in DOCS:
        if name is not None and n != name:
            continue
        if d["kind"] in ("DaemonSet", "Deployment"):
            out.append((f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]))
        elif d["kind"] == "PyTorchJob":
            for role, spec in d["spec"]["pytorchReplicaSpecs"].items():
                out.append((f"PyTorchJob/{d['metadata']['name']}/{role}", spec["template"]))
        elif d["kind"] == "TrainingRuntime":
            for rj in d["spec"]["template"]["spec"]["replicatedJobs"]:
                out.append(
                    (f"TrainingRuntime/{d['metadata']['name']}/{rj['name']}", rj["template"]["spec"]["template"])
                )
    return out


def sidecar_pods() -> list[tuple[str, dict]]:
    return [(o, t) for o, t in pod_templates() if o.split("/")[0] in TRAINING_CONTAINER]


def training_container(owner: str, t: dict) -> dict:
    (c,) = [c for c in t["spec"]["containers"] if c["name"] == TRAINING_CONTAINER[owner.split("/")[0]]]
    return c


def containers(template: dict) -> list[dict]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def test_every_kustomization_is_rendered():
    shipped = {p.parent.relative_to(K8S).as_posix() for p in K8S.rglob("kustomization.yaml")}
    assert shipped - {"base", "components/job-settings"} == set(KUSTOMIZATIONS)
    kinds = {d["kind"] for _, d in DOCS}
    assert {
        "DaemonSet",
        "Deployment",
        "Service",
        "PersistentVolumeClaim",
        "PriorityClass",
        "ConfigMap",
        "PyTorchJob",
        "TrainJob",
        "TrainingRuntime",
        "PodMonitor",
        "ServiceMonitor",
        "PrometheusRule",
    } <= kinds, kinds
    # the settings never reach the cluster (local-config)
    assert not [d for _, d in DOCS if d["metadata"]["name"] == "rank-watchdog-settings"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "name,doc",
    [(n, d) for n, d in DOCS if not d["apiVersion"].startswith(CRD_GROUPS)],
    ids=lambda x: x if isinstance(x, str) else f"{x['kind']}/{x['metadata']['name']}",
)
def test_builtin_kinds_validate(name: str, doc: dict, version: str):
    kubernetes_validate.validate(doc, version, strict=True)


def as_pod_template(name: str, template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


@pytest.mark.parametrize("version", VERSIONS)
def test_pytorchjob_pod_templates_validate_as_core_pod_templates(version: str):
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
            kubernetes_validate.validate(as_pod_template(role.lower(), spec["template"]), version, strict=True)


# The fields of Kubeflow Trainer 2.0's TrainJob and TrainingRuntime
# (trainer.kubeflow.org/v1alpha1) that the example may use.
TRAINJOB_SPEC = {
    "runtimeRef",
    "initializer",
    "trainer",
    "labels",
    "annotations",
    "podSpecOverrides",
    "suspend",
    "managedBy",
}
TRAINER = {"image", "command", "args", "env", "numNodes", "resourcesPerNode", "numProcPerNode"}
RUNTIME_SPEC = {"mlPolicy", "podGroupPolicy", "template"}


@pytest.mark.parametrize("version", VERSIONS)
def test_trainjob_and_its_runtime(version: str):
    (job,) = by_kind("TrainJob")
    (runtime,) = by_kind("TrainingRuntime")
    assert job["apiVersion"] == runtime["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    spec = job["spec"]
    assert set(spec) <= TRAINJOB_SPEC and set(spec["trainer"]) <= TRAINER, (set(spec), set(spec["trainer"]))
    assert spec["runtimeRef"] == {
        "name": runtime["metadata"]["name"],
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
    }
    assert isinstance(spec["trainer"]["numNodes"], int) and isinstance(spec["trainer"]["numProcPerNode"], int)
    assert set(runtime["spec"]) <= RUNTIME_SPEC and "torch" in runtime["spec"]["mlPolicy"]
    (rj,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    # the trainer's job, as the runtime marks it; a batch/v1 Job template
    assert rj["name"] == "node"
    assert rj["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    kubernetes_validate.validate(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "node"}, "spec": rj["template"]["spec"]},
        version,
        strict=True,
    )
    # and its pod with what the TrainJob fills in
    pod = rj["template"]["spec"]["template"]
    node = training_container("TrainingRuntime/x/node", pod)
    node.update(image=spec["trainer"]["image"], command=spec["trainer"]["command"])
    node["resources"] = spec["trainer"]["resourcesPerNode"]
    kubernetes_validate.validate(as_pod_template("node", pod), version, strict=True)


def test_validation_can_fail():
    bad = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "x"},
        "template": {"spec": {"containers": [{"name": "c", "image": "i", "bogusField": 1}]}},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


# -- Prometheus Operator objects ----------------------------------------------------------
MONITOR_SPEC = {"selector", "namespaceSelector", "podMetricsEndpoints", "endpoints", "jobLabel", "podTargetLabels"}
ENDPOINT = {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings", "honorLabels", "scheme"}


def test_monitors_select_what_exists_and_keep_prometheus_labels():
    for name in KUSTOMIZATIONS:
        for podmon in by_kind("PodMonitor", name):
            assert set(podmon["spec"]) <= MONITOR_SPEC
            sel = podmon["spec"]["selector"]["matchLabels"]
            selected = [
                (o, t) for o, t in pod_templates(name) if sel.items() <= t["metadata"].get("labels", {}).items()
            ]
            assert selected, (name, sel)
            for ep in podmon["spec"]["podMetricsEndpoints"]:
                assert set(ep) <= ENDPOINT, ep
                assert not ep.get("honorLabels"), "job/instance stay Prometheus'; the training job is training_job"
                assert not {r.get("targetLabel") for r in ep.get("relabelings", [])} & set(RANK_LABELS), ep
                assert {"targetLabel": "watchdog_component", "replacement": "agent"} in ep["relabelings"]
                for owner, t in selected:
                    ports = {p["name"] for c in containers(t) for p in c.get("ports", [])}
                    assert ep["port"] in ports, (owner, ep["port"], ports)
        for svcmon in by_kind("ServiceMonitor", name):
            assert set(svcmon["spec"]) <= MONITOR_SPEC
            services = [
                s
                for s in by_kind("Service", name)
                if svcmon["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
            ]
            assert services, name
            for ep in svcmon["spec"]["endpoints"]:
                assert set(ep) <= ENDPOINT, ep
                assert not ep.get("honorLabels"), "job/instance stay Prometheus'; the training job is training_job"
                assert not {r.get("targetLabel") for r in ep.get("relabelings", [])} & set(RANK_LABELS), ep
                assert {"targetLabel": "watchdog_component", "replacement": "coordinator"} in ep["relabelings"]
                assert all(ep["port"] in {p["name"] for p in s["spec"]["ports"]} for s in services)
    # agents are scraped in both forms, coordinators in every job
    assert {o.split("/")[0] for n in KUSTOMIZATIONS for o, _ in pod_templates(n)} >= {"DaemonSet", *TRAINING_CONTAINER}
    assert all(by_kind("ServiceMonitor", job) for job in JOBS)


def test_operator_objects_carry_the_release_label():
    for name in KUSTOMIZATIONS:
        release = settings(name)["RELEASE"]
        objects = [d for n, d in DOCS if n == name and d["kind"] in ("PodMonitor", "ServiceMonitor", "PrometheusRule")]
        assert objects, name
        assert all(d["metadata"]["labels"]["release"] == release for d in objects), name


def test_dashboards_are_configmaps_for_the_grafana_sidecar():
    gen = generator()
    assert (K8S / "cluster" / "dashboards.yaml").read_text() == gen.render_dashboards(), (
        "deploy/kubernetes/cluster/dashboards.yaml is stale: run .venv/bin/python deploy/kubernetes/generate.py"
    )
    maps = [d for d in by_kind("ConfigMap", "cluster") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    shipped = sorted((promcheck.REPO / "grafana" / "dashboards").glob("*.json"))
    assert sorted(k for m in maps for k in m["data"]) == [p.name for p in shipped]
    for m in maps:
        for key, text in m["data"].items():
            # The shipped dashboard, but for the runbook links' base (RUNBOOK_BASE cannot reach
            # into the JSON, and the placeholder is no place to send anyone): left to set in Grafana.
            got, shipped_doc = (
                json.loads(text),
                json.loads((promcheck.REPO / "grafana" / "dashboards" / key).read_text()),
            )
            var = next(v for v in got["templating"]["list"] if v["name"] == "runbooks")
            assert var["query"] == "" and var["hide"] == 0, var
            shipped_var = next(v for v in shipped_doc["templating"]["list"] if v["name"] == "runbooks")
            shipped_var.update(query="", current={"text": "", "value": ""}, hide=0)
            assert got == shipped_doc, key
        assert m["metadata"]["namespace"] == settings("cluster")["NAMESPACE"]


def generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "generate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- one place for the settings ----------------------------------------------------------
CHANGED = {
    "JOB_NAME": "other-job",
    "NAMESPACE": "team-b",
    "WORLD_SIZE": "64",
    "IMAGE": "registry.corp/rank-watchdog:9.9",
    "TRAINING_IMAGE": "registry.corp/train:7",
    "RELEASE": "prom-b",
    "RUNBOOK_BASE": "https://runbooks.corp/rw",
}


def test_settings_are_set_in_one_place(tmp_path: Path):
    """Each kustomization's settings.yaml changed, nothing else: every object follows,
    and none of the shipped values is left anywhere in what would be applied."""
    copy = tmp_path / "kubernetes"
    shutil.copytree(K8S, copy)
    for name in KUSTOMIZATIONS:
        path = copy / name / "settings.yaml"
        doc = yaml.safe_load(path.read_text())
        defaults = dict(doc["data"])
        doc["data"] = {k: CHANGED[k] for k in defaults}
        path.write_text(yaml.safe_dump(doc))
        out = kustomize(copy / name)
        text = yaml.safe_dump_all(out)
        for key, old in defaults.items():
            if key == "NAMESPACE":
                assert not re.search(rf"namespace: {old}\b", text), name
            elif key != "WORLD_SIZE":
                assert old not in text, (name, key, old)
        for d in out:
            if d["kind"] not in CLUSTER_SCOPED:
                assert d["metadata"]["namespace"] == CHANGED["NAMESPACE"], (name, d["kind"])
            if d["kind"] in ("PodMonitor", "ServiceMonitor", "PrometheusRule"):
                assert d["metadata"]["labels"]["release"] == CHANGED["RELEASE"]
            if d["kind"] == "PrometheusRule":
                urls = [
                    r["annotations"]["runbook_url"] for g in d["spec"]["groups"] for r in g["rules"] if "alert" in r
                ]
                assert urls and all(u.startswith(CHANGED["RUNBOOK_BASE"] + "/RankWatchdog") for u in urls)
        if name in JOBS:
            (coord,) = [d for d in out if d["kind"] == "Deployment"]
            env = {e["name"]: e.get("value") for e in coord["spec"]["template"]["spec"]["containers"][0]["env"]}
            assert env["WATCHDOG_JOB_NAME"] == "other-job" and env["WATCHDOG_JOB_WORLD_SIZE"] == "64"
            assert {d["metadata"]["name"] for d in out if d["kind"] in ("PyTorchJob", "TrainJob")} == {"other-job"}
            images = {c["image"] for d in out for c in _all_containers(d)} | {
                d["spec"]["trainer"]["image"] for d in out if d["kind"] == "TrainJob"
            }
            assert images == {CHANGED["IMAGE"], CHANGED["TRAINING_IMAGE"]}, images


def _all_containers(doc: dict) -> list[dict]:
    if doc["kind"] in ("DaemonSet", "Deployment"):
        return containers(doc["spec"]["template"])
    if doc["kind"] == "PyTorchJob":
        return [c for s in doc["spec"]["pytorchReplicaSpecs"].values() for c in containers(s["template"])]
    if doc["kind"] == "TrainingRuntime":
        return [
            c
            for rj in doc["spec"]["template"]["spec"]["replicatedJobs"]
            for c in containers(rj["template"]["spec"]["template"])
        ]
    return []


def test_world_size_is_what_the_job_runs():
    for name in JOBS:
        (coord,) = by_kind("Deployment", name)
        env = {e["name"]: e.get("value") for e in coord["spec"]["template"]["spec"]["containers"][0]["env"]}
        for job in by_kind("PyTorchJob", name):
            nodes = sum(s["replicas"] for s in job["spec"]["pytorchReplicaSpecs"].values())
            assert nodes * int(job["spec"]["nprocPerNode"]) == int(env["WATCHDOG_JOB_WORLD_SIZE"])
        for job in by_kind("TrainJob", name):
            trainer = job["spec"]["trainer"]
            assert trainer["numNodes"] * trainer["numProcPerNode"] == int(env["WATCHDOG_JOB_WORLD_SIZE"])


# -- the ranks run under `watchdog run`, in a run directory the hook accepts -----------------
def training_commands() -> list[tuple[str, list[str]]]:
    out = [(o, c["command"]) for o, t in pod_templates() for c in t["spec"]["containers"] if c["name"] == "pytorch"]
    # a TrainingRuntime's trainer container gets its command from the TrainJob
    out += [(f"TrainJob/{d['metadata']['name']}", d["spec"]["trainer"]["command"]) for d in by_kind("TrainJob")]
    return out


def test_ranks_run_under_watchdog_run_and_the_image_install_line_is_shown():
    commands = training_commands()
    assert {o.split("/")[0] for o, _ in commands} == {"PyTorchJob", "TrainJob"}
    for owner, command in commands:
        assert command[:3] == ["watchdog", "run", "--"] and command[3] == "torchrun", (owner, command)
    for path in (K8S / "overlays").rglob("*.yaml"):
        if {d["kind"] for d in yaml.safe_load_all(path.read_text()) if d} & {"PyTorchJob", "TrainJob"}:
            assert "RUN pip install rank-watchdog\n" in path.read_text(), path


def run_dir_preparers() -> list[tuple[str, dict, str]]:
    """(owner, container, mount path) of the init containers that prepare the run dir."""
    out = []
    for owner, t in pod_templates():
        for c in t["spec"].get("initContainers", []):
            if c.get("command", [])[:2] == ["sh", "-c"]:
                out.append((owner, c, c["volumeMounts"][0]["mountPath"]))
    return out


def test_run_dir_is_made_writable_for_ranks_of_any_uid(tmp_path: Path):
    """What the kubelet creates (an emptyDir 0777, a hostPath 0755), after the init
    container's own command: writable for every uid, and accepted by the hook and
    the agent (sticky: no rank can swap another's slot file)."""
    found = run_dir_preparers()
    assert {o.split("/")[0] for o, _, _ in found} == {"DaemonSet", *TRAINING_CONTAINER}, found
    for owner, c, mount in found:
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}, owner
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, owner
        assert len(c["volumeMounts"]) == 1, "it touches the run dir and nothing else"
        for kubelet_mode in (0o777, 0o755):
            where = tmp_path / f"{owner.replace('/', '-')}-{kubelet_mode:o}"
            where.mkdir()
            where.chmod(kubelet_mode)
            assert rundir.insecure(str(where)) or kubelet_mode == 0o755  # as created: refused (0777) or closed
            script = c["command"][2].replace(mount, str(where))
            subprocess.run(["sh", "-c", script], check=True)
            assert where.stat().st_mode & 0o7777 == 0o1777, owner
            assert rundir.insecure(str(where)) == "", owner


def test_pid_namespace_choices():
    for owner, t in pod_templates():
        spec = t["spec"]
        if owner.startswith("DaemonSet"):
            assert spec.get("hostPID") is True, owner  # documented in the manifest: pids via /proc
        elif owner.split("/")[0] in TRAINING_CONTAINER:
            assert spec.get("shareProcessNamespace") is True and not spec.get("hostPID"), owner


def test_node_agent_has_its_own_privileged_namespace():
    (ns,) = by_kind("Namespace")
    assert ns["metadata"]["name"] == settings("node-agent")["NAMESPACE"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for _, d in [(n, d) for n, d in DOCS if n == "node-agent" and d["kind"] != "Namespace"]:
        assert d["metadata"]["namespace"] == ns["metadata"]["name"], d["kind"]
    # no training job lives there, and nothing of a job needs hostPID
    for name in JOBS:
        assert all(
            d["metadata"].get("namespace") == settings(name)["NAMESPACE"]
            for n, d in DOCS
            if n == name and d["kind"] not in CLUSTER_SCOPED
        )
        assert settings(name)["NAMESPACE"] != ns["metadata"]["name"]
        assert not [o for o, t in pod_templates(name) if t["spec"].get("hostPID")]


def expand(value: str, env: dict[str, str]) -> str:
    """$(VAR) as the kubelet expands it from the variables defined before."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def env_of(container: dict, tmp_path: Path, job: str = "job-1") -> dict[str, str]:
    """The container's environment as the kubelet gives it: ``job`` for the training
    operator's job-name label, "node-1" for any other field reference."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "valueFrom" in e:
            value = job if e["valueFrom"]["fieldRef"]["fieldPath"] in JOB_LABEL.values() else "node-1"
        else:
            value = expand(e.get("value", ""), env)
        env[e["name"]] = value
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
                coord_cfg = coord_config.from_values(
                    flags.parse("watchdog coordinator", "", coord_config.FLAGS, args[1:], env)
                )
                assert coord_cfg.token == "s3cret-of-32-bytes-s3cret-s3cret" and coord_cfg.world_size > 0, owner
                seen.add("coordinator")
            else:  # a training container or the run dir's init container: the hook's variables only
                assert watchdog_vars <= hook_envs, (owner, watchdog_vars - hook_envs)
    assert seen == {"agent", "coordinator"}


def test_sidecars_report_to_their_own_jobs_coordinator(tmp_path: Path):
    for name in JOBS:
        services = {s["metadata"]["name"]: s for s in by_kind("Service", name)}
        for owner, t in pod_templates(name):
            for c in containers(t):
                if c.get("args", [])[:1] != ["agent"]:
                    continue
                env = env_of(c, tmp_path, job=settings(name)["JOB_NAME"])
                url = env["WATCHDOG_COORDINATOR_URL"]
                host, port = url.removeprefix("http://").split(":")
                assert host in services, (owner, url, list(services))
                assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}


def test_run_dir_is_shared_between_ranks_and_agent():
    for owner, t in sidecar_pods():
        mounts = {c["name"]: {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])} for c in containers(t)}
        agent, train = mounts["watchdog-agent"], mounts[TRAINING_CONTAINER[owner.split("/")[0]]]
        run_dir = next(
            e["value"]
            for c in containers(t)
            if c["name"] == TRAINING_CONTAINER[owner.split("/")[0]]
            for e in c["env"]
            if e["name"] == "WATCHDOG_RUN_DIR"
        )
        assert agent.get(run_dir) and agent[run_dir] == train.get(run_dir), owner
    (daemonset,) = by_kind("DaemonSet")
    (vol,) = [v for v in daemonset["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
    assert vol["hostPath"]["path"] == "/run/rank-watchdog", (
        "the node's run dir, as training pods mount it (daemonset.yaml)"
    )


def test_recommended_labels():
    """app.kubernetes.io/* on every object and pod template; ours say they are part of rank-watchdog."""
    for name, d in DOCS:
        labels = d["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/name"), (name, d["kind"])
        assert labels.get("app.kubernetes.io/managed-by") == "kustomize", (name, d["kind"])
        if labels["app.kubernetes.io/name"] == "rank-watchdog":
            assert labels.get("app.kubernetes.io/part-of") == "rank-watchdog", (name, d["kind"])
            assert labels.get("app.kubernetes.io/component"), (name, d["kind"])
    for owner, t in pod_templates():
        assert t["metadata"]["labels"].get("app.kubernetes.io/name"), owner
    for d in by_kind("Deployment") + by_kind("DaemonSet"):
        sel = d["spec"]["selector"]["matchLabels"]
        assert sel.items() <= d["spec"]["template"]["metadata"]["labels"].items(), d["metadata"]["name"]


def test_each_workload_has_its_own_service_account_without_an_api_token():
    for name in KUSTOMIZATIONS:
        accounts = {sa["metadata"]["name"]: sa for sa in by_kind("ServiceAccount", name)}
        for owner, t in pod_templates(name):
            spec = t["spec"]
            assert spec.get("serviceAccountName") in accounts, owner
            assert spec.get("automountServiceAccountToken") is False, owner
        assert all(sa.get("automountServiceAccountToken") is False for sa in accounts.values())
    assert not by_kind("Role") and not by_kind("ClusterRole"), "the daemons never call the Kubernetes API"


def test_daemons_have_the_priority_class_that_is_shipped():
    (pc,) = by_kind("PriorityClass")
    assert pc["preemptionPolicy"] == "Never" and pc["value"] > 0 and not pc["globalDefault"]
    for d in by_kind("Deployment") + by_kind("DaemonSet"):
        assert d["spec"]["template"]["spec"]["priorityClassName"] == pc["metadata"]["name"], d["metadata"]["name"]


def test_journal_is_on_a_persistent_volume_claim():
    for name in JOBS:
        (coord,) = by_kind("Deployment", name)
        spec = coord["spec"]["template"]["spec"]
        journal = next(e["value"] for e in spec["containers"][0]["env"] if e["name"] == "WATCHDOG_JOURNAL")
        mount = next(m for m in spec["containers"][0]["volumeMounts"] if journal.startswith(m["mountPath"] + "/"))
        (vol,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        claims = {p["metadata"]["name"] for p in by_kind("PersistentVolumeClaim", name)}
        assert vol["persistentVolumeClaim"]["claimName"] in claims, name
        assert coord["spec"]["strategy"]["type"] == "Recreate"  # one writer, a ReadWriteOnce volume


def agent_containers() -> list[tuple[str, dict, dict]]:
    return [(owner, t, c) for owner, t in pod_templates() for c in containers(t) if c.get("args", [])[:1] == ["agent"]]


def test_agents_have_health_probes():
    found = agent_containers()
    assert {o.split("/")[0] for o, _, _ in found} == {"DaemonSet", *TRAINING_CONTAINER}
    for owner, _, c in found:
        port = {p["name"] for p in c["ports"]}
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["path"] == "/healthz" and c[probe]["httpGet"]["port"] in port, (owner, probe)


def test_sidecar_claims_no_gpu_it_does_not_get():
    """NVIDIA_VISIBLE_DEVICES=all in a container that requests no GPU exposes every
    GPU of the node (or none on hardened runtimes): not the sidecar's business."""
    for owner, _, c in agent_containers():
        if owner.split("/")[0] in TRAINING_CONTAINER:
            assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in c.get("env", [])}, owner


# -- privileges, per feature ------------------------------------------------------------
def effective(t: dict, c: dict, key: str):
    """A securityContext field as the kubelet resolves it: the container's, else the pod's."""
    return c.get("securityContext", {}).get(key, t["spec"].get("securityContext", {}).get(key))


def test_sidecar_runs_as_the_ranks_uid_with_only_what_stacks_need():
    """Signals and checkpoint requests need the ranks' uid; stack dumps also CAP_SYS_PTRACE,
    which Kubernetes makes effective for uid 0 only. So: same uid as the training
    container, every capability dropped, SYS_PTRACE added back only when that uid is 0."""
    sidecars = [(o, t, c) for o, t, c in agent_containers() if o.split("/")[0] in TRAINING_CONTAINER]
    assert {o.split("/")[0] for o, _, _ in sidecars} == set(TRAINING_CONTAINER)
    for owner, t, agent in sidecars:
        train = training_container(owner, t)
        uid = effective(t, agent, "runAsUser")
        assert uid is not None and uid == effective(t, train, "runAsUser"), owner
        assert effective(t, agent, "runAsGroup") == effective(t, train, "runAsGroup"), owner
        sc = agent["securityContext"]
        assert sc["capabilities"]["drop"] == ["ALL"] and sc["allowPrivilegeEscalation"] is False, owner
        assert not sc.get("privileged") and sc["readOnlyRootFilesystem"] is True, owner
        assert sc["capabilities"].get("add", []) == (["SYS_PTRACE"] if uid == 0 else []), owner
        assert t["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", owner


def test_daemonset_and_coordinator_are_unprivileged():
    """Both run as a non-root uid with every capability dropped; the only root in them
    is the run dir's init container (checked above: its one command, no capability)."""
    preparers = {id(c) for _, c, _ in run_dir_preparers()}
    for owner, t in pod_templates():
        if owner.split("/")[0] in TRAINING_CONTAINER:
            continue
        for c in containers(t):
            sc = c["securityContext"]
            assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False, owner
            if id(c) in preparers:
                continue
            assert effective(t, c, "runAsNonRoot") is True and effective(t, c, "runAsUser") != 0, owner


def test_each_feature_is_stated_where_it_is_deployed():
    text = (K8S / "overlays" / "pytorchjob-sidecar" / "pytorchjob.yaml").read_text()
    for feature in ("metrics", "signals", "checkpoint requests", "stack dumps", "SYS_PTRACE", "ptrace_scope"):
        assert feature in text, feature
    daemonset = (K8S / "node-agent" / "daemonset.yaml").read_text()
    assert "CAP_SYS_PTRACE" in daemonset and "CAP_KILL" in daemonset


def test_a_job_and_its_agents_take_the_job_name_from_the_operators_label():
    # The ranks and the sidecar read the training operator's label with the job's
    # name, so they cannot disagree with each other or with the job. The coordinator
    # is one per job and names it (and its world size) from settings.yaml.
    for name in JOBS:
        for owner, t in pod_templates(name):
            if owner.split("/")[0] not in TRAINING_CONTAINER:
                continue
            label = JOB_LABEL[owner.split("/")[0]]
            for c in containers(t):
                if c["name"] == "watchdog-run-dir":
                    continue
                (e,) = [e for e in c.get("env", []) if e["name"] == "WATCHDOG_JOB_NAME"]
                assert "value" not in e and e["valueFrom"]["fieldRef"]["fieldPath"] == label, (owner, c["name"])
        (coord,) = by_kind("Deployment", name)
        env = {e["name"]: e.get("value") for e in coord["spec"]["template"]["spec"]["containers"][0]["env"]}
        jobs = by_kind("PyTorchJob", name) + by_kind("TrainJob", name)
        assert [j["metadata"]["name"] for j in jobs] == [env["WATCHDOG_JOB_NAME"]] == [settings(name)["JOB_NAME"]]
        assert os.path.basename(coord["metadata"]["name"]) == f"{settings(name)['JOB_NAME']}-watchdog"
