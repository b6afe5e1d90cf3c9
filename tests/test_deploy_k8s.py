"""Kubernetes manifests: every overlay rendered by kustomize (kubectl's, as `kubectl apply -k` does)
alone and with the optional components, validated against the Kubernetes OpenAPI schemas (strict:
unknown fields fail), and checked for what matters: NPU resources, the project's probes with the
right modes, graceful termination, volumes, settings equal to env/ascend.env (overlays change only
what differs from the base and from the defaults)."""

from __future__ import annotations

import os
import pathlib

import pytest
import yaml

from minicpmv_ascend import settings
from support.deploy import (
    APP_DIR,
    ASCEND_ENV,
    JOB_TEMPLATES,
    K8S,
    OVERLAYS,
    VOLCANO,
    allowed_env_vars,
    by_kind,
    by_name,
    copy_map,
    dockerfile_instructions,
    env_mapping,
    final_stage,
    lint_tool,
    one,
    pod_templates,
    project_image,
    render_kustomization,
    restated_defaults,
    run_tool,
    server_container,
)
from support.server import REPO

# Oldest and newest Kubernetes versions whose schemas kubernetes-validate 1.37 ships (1.25 is
# out of support everywhere; 1.27 is still found on managed clusters such as CCE).
K8S_VERSIONS = ("1.27.0", "1.37.0")
NPU_RESOURCE = {"a2": "huawei.com/Ascend910", "a3": "huawei.com/Ascend910", "cce": "huawei.com/ascend-1980",
                "cce-a3": "huawei.com/ascend-1980", "autoscaling": "huawei.com/Ascend910"}
DRIVER_MOUNTS = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64/",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
)


@pytest.fixture(scope="module")
def rendered(k8s_rendered) -> dict[str, list[dict]]:
    """Each overlay alone, with its components, and with the storage patch."""
    return k8s_rendered


def validate(docs: list[dict], version: str) -> None:
    core = [d for d in docs if "monitoring.coreos.com" not in d["apiVersion"]]
    result = run_tool(lint_tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, "-",
                      input=yaml.safe_dump_all(core))
    assert result.returncode == 0, result.stdout + result.stderr


# The newest in make check, the others in make test (each version's validation: ~3-4 s of CPU).
@pytest.mark.parametrize("version", [pytest.param(v, marks=[] if v == K8S_VERSIONS[-1] else [pytest.mark.slow])
                                     for v in K8S_VERSIONS])
def test_rendered_manifests_match_the_kubernetes_schemas(rendered, version: str) -> None:
    # One validator run for every rendering (each start costs more than the validation); on a
    # failure, one per rendering, to name the one that fails.
    try:
        validate([doc for docs in rendered.values() for doc in docs], version)
        return
    except AssertionError:
        pass
    for name, docs in rendered.items():
        try:
            validate(docs, version)
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from None
    raise AssertionError("the renderings fail the schemas together but none alone")


def test_schema_validation_catches_a_mistake(rendered) -> None:
    deployment = one(rendered["a2"], "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"exec": {"command": ["true"]}}
    with pytest.raises(AssertionError, match="readinesProbe"):
        validate([broken], K8S_VERSIONS[-1])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_npu_per_replica_and_the_image_of_the_target(rendered, overlay: str) -> None:
    deployment = one(rendered[overlay], "Deployment")
    container = server_container(deployment)
    resources = container["resources"]
    npu = NPU_RESOURCE[overlay]
    assert resources["limits"][npu] == "1" and resources["requests"][npu] == "1"
    other = {"huawei.com/Ascend910", "huawei.com/ascend-1980"} - {npu}
    assert not other & (resources["limits"].keys() | resources["requests"].keys())
    assert container["image"] == project_image(OVERLAYS[overlay])  # the table's default target
    if overlay == "autoscaling":  # the HPA owns the count
        assert "replicas" not in deployment["spec"]
    else:
        assert deployment["spec"]["replicas"] >= 1
    # No spare card is assumed: replace pods one at a time rather than surge into Pending.
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_call_the_projects_healthcheck_with_the_right_mode(rendered, overlay: str) -> None:
    from minicpmv_ascend import probes

    container = server_container(one(rendered[overlay], "Deployment"))
    files = copy_map(final_stage(dockerfile_instructions(REPO / "Dockerfile")))
    for probe, mode in (("startupProbe", "live"), ("readinessProbe", "ready"), ("livenessProbe", "live")):
        spec = container[probe]
        command = spec["exec"]["command"]
        assert command == ["python3", f"{APP_DIR}/healthcheck/probe.py", mode], probe
        assert files[command[1]] == REPO / "healthcheck" / "probe.py"
        assert spec["timeoutSeconds"] > probes.DEFAULT_TIMEOUT[mode], \
            f"{probe}: the probe must report its own timeout before the kubelet gives up"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60, "long cold-start budget"
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 30


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_image_entrypoint_runs_and_terminates_gracefully(rendered, overlay: str) -> None:
    deployment = one(rendered[overlay], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = server_container(deployment)
    assert "command" not in container, "tini -> CANN env -> launcher must not be replaced"
    assert pod["terminationGracePeriodSeconds"] >= 60
    assert pod["enableServiceLinks"] is False, "Service env vars (e.g. VLLM_PORT=tcp://...) confuse vLLM"
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    security = pod["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] != 0
    assert security["supplementalGroups"], "the driver's group (HwHiAiUser) for the non-root user"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_volumes_models_read_only_and_shared_memory(rendered, overlay: str) -> None:
    deployment = one(rendered[overlay], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in server_container(deployment)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["/models"]["readOnly"] is True
    assert volumes[mounts["/models"]["name"]]["persistentVolumeClaim"] == {"claimName": "minicpmv-models",
                                                                            "readOnly": True}
    assert one(rendered[overlay], "PersistentVolumeClaim")["metadata"]["name"] == "minicpmv-models"
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
    assert mounts["/home/minicpmv/.cache"], "writable caches for the non-root user"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_settings_are_the_ascend_env_file(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    configmap = one(docs, "ConfigMap")
    assert configmap["data"] == env_mapping(ASCEND_ENV)
    container = server_container(one(docs, "Deployment"))
    assert container["envFrom"] == [{"configMapRef": {"name": configmap["metadata"]["name"]}}]
    names = set(configmap["data"]) | {e["name"] for e in container.get("env", [])}
    assert names <= allowed_env_vars(), names - allowed_env_vars()
    api_key = next(e for e in container["env"] if e["name"] == "VLLM_API_KEY")
    assert api_key["valueFrom"]["secretKeyRef"]["optional"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_reaches_the_server_port(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    service, deployment = one(docs, "Service"), one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ports = {p["name"]: p["containerPort"] for p in server_container(deployment)["ports"]}
    (service_port,) = service["spec"]["ports"]
    assert ports[service_port["targetPort"]] == settings.resolve((), one(docs, "ConfigMap")["data"])["port"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_components_driver_mounts_model_hostpath_and_servicemonitor(rendered, overlay: str) -> None:
    docs = rendered[f"{overlay}+components"]
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in server_container(deployment)["volumeMounts"]}
    # For nodes without Ascend Docker Runtime (docs/design/ascend-stack.md, "Running Ascend containers").
    for path in DRIVER_MOUNTS:
        assert mounts[path]["readOnly"] is True, path
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    models = volumes[mounts["/models"]["name"]]
    assert models == {"name": "models", "hostPath": {"path": "/data/models", "type": "Directory"}}
    assert not by_kind(docs, "PersistentVolumeClaim"), "the unused claim is dropped"
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


@pytest.mark.parametrize("rendering", [f"{o}+{c}" for o in OVERLAYS for c in ("components", "storage")])
def test_node_arch_component_pins_the_deployment_and_jobs_to_the_image_architecture(rendered, rendering) -> None:
    """Atlas servers are usually aarch64: with components/node-arch, every pod template of the
    Deployment and the Job templates selects kubernetes.io/arch=arm64 (merged into any other selector)."""
    templates = pod_templates(rendered[rendering])
    dropped = 1 if rendering.endswith("+components") else 0  # model-hostpath drops the download Job
    assert len(templates) == 1 + len(JOB_TEMPLATES) - dropped
    for name, pod in templates:
        assert pod["nodeSelector"]["kubernetes.io/arch"] == "arm64", name
    plain = rendering.split("+")[0]
    assert all("kubernetes.io/arch" not in pod.get("nodeSelector", {}) for _, pod in pod_templates(rendered[plain])), \
        "the component is opt-in"


def test_node_arch_component_keeps_an_existing_selector(tmp_path) -> None:
    """Merged, not replaced: an overlay's own nodeSelector (e.g. an accelerator label) survives."""
    rel = pathlib.Path(os.path.relpath(K8S, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(rel / "overlays" / "a2")], "components": [str(rel / "components" / "node-arch")],
        "patches": [{"target": {"kind": "Deployment", "name": "minicpmv"}, "patch": yaml.safe_dump({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "minicpmv"},
            "spec": {"template": {"spec": {"nodeSelector": {"accelerator": "huawei-Ascend910"}}}}})}],
    }))
    pod = one(render_kustomization(tmp_path), "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"accelerator": "huawei-Ascend910", "kubernetes.io/arch": "arm64"}


def job_pod(docs: list[dict], name: str) -> dict:
    return by_name(docs, "CronJob", name)["spec"]["jobTemplate"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_job_templates_never_run_by_themselves(rendered, overlay: str) -> None:
    """Suspended CronJobs: templates for `kubectl create job --from=cronjob/...`, re-appliable."""
    for name in JOB_TEMPLATES:
        cronjob = by_name(rendered[overlay], "CronJob", name)
        assert cronjob["spec"]["suspend"] is True
        assert cronjob["spec"]["schedule"] == "0 0 31 2 *", "and a date that never comes"
        assert "selector" not in cronjob["spec"]["jobTemplate"]["spec"], "Jobs generate their own"


@pytest.mark.parametrize("rendering", [f"{o}{c}" for o in OVERLAYS for c in ("", "+components", "+storage")])
def test_jobs_and_init_container_take_the_servers_image(rendered, rendering: str) -> None:
    """One `images:` entry in the overlay sets every image: server, its init container, the Jobs."""
    docs = rendered[rendering]
    image = server_container(one(docs, "Deployment"))["image"]
    assert image == project_image(OVERLAYS[rendering.split("+")[0]])
    for name, pod in pod_templates(docs):
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert container["image"] == image, f"{name} {container['name']}"


def test_an_overlays_image_reaches_the_jobs(tmp_path) -> None:
    """A registry image set once (as CCE's SWR example does) reaches the Job templates too."""
    rel = pathlib.Path(os.path.relpath(K8S, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(rel / "overlays" / "cce-a3")],
        "images": [{"name": "minicpmv-ascend", "newName": "swr.example.com/org/minicpmv-ascend",
                    "newTag": "v0.30.0-a3"}]}))
    docs = render_kustomization(tmp_path)
    images = {c["image"] for _, pod in pod_templates(docs) for c in pod.get("initContainers", []) + pod["containers"]}
    assert images == {"swr.example.com/org/minicpmv-ascend:v0.30.0-a3"}


@pytest.mark.parametrize("rendering", [f"{o}{c}" for o in OVERLAYS for c in ("", "+components")])
def test_the_server_waits_for_complete_weights(rendered, rendering: str) -> None:
    """An init container runs the model check with --wait on MODEL_PATH, read-only, before vLLM."""
    docs = rendered[rendering]
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    files = copy_map(final_stage(dockerfile_instructions(REPO / "Dockerfile")))
    assert init["command"][:2] == ["python3", f"{APP_DIR}/scripts/verify_model_dir.py"]
    assert files[init["command"][1]] == REPO / "scripts" / "verify_model_dir.py"
    assert init["command"][2:] == ["--wait", "30", "$(MODEL_PATH)"]
    configmap = one(docs, "ConfigMap")
    assert init["envFrom"] == [{"configMapRef": {"name": configmap["metadata"]["name"]}}]
    assert configmap["data"]["MODEL_PATH"].startswith("/models/")
    (mount,) = init["volumeMounts"]
    server_mounts = {m["mountPath"]: m for m in server_container(deployment)["volumeMounts"]}
    assert mount == server_mounts["/models"] and mount["readOnly"] is True
    assert "huawei.com" not in str(init.get("resources")), "no NPU while waiting"


def test_smoke_job_runs_the_smoke_probe_against_the_service(rendered) -> None:
    docs = rendered["a2"]
    container = job_pod(docs, "minicpmv-smoke")["containers"][0]
    job = by_name(docs, "CronJob", "minicpmv-smoke")["spec"]["jobTemplate"]
    service = one(docs, "Service")
    script = container["command"][-1]
    env = {e["name"]: e for e in container["env"]}
    url = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    assert env["SERVICE_URL"]["value"] == url
    assert f"{APP_DIR}/healthcheck/probe.py ready" in script
    assert f"exec python3 {APP_DIR}/healthcheck/probe.py smoke" in script
    assert env["SERVED_MODEL_NAME"]["value"] == settings.resolve((), env_mapping(ASCEND_ENV))["served_model_name"]
    assert job["spec"]["activeDeadlineSeconds"] > 20 * 60, "waits through a cold start, bounded"
    assert "huawei.com/Ascend910" not in str(container["resources"]), "no NPU for a client"


@pytest.mark.parametrize("rendering", ["a2", "a2+storage"])
def test_download_job_fills_the_models_claim_with_the_images_script(rendered, rendering: str) -> None:
    docs = rendered[rendering]
    pod = job_pod(docs, "minicpmv-download-weights")
    container = pod["containers"][0]
    files = copy_map(final_stage(dockerfile_instructions(REPO / "Dockerfile")))
    assert container["command"] == [f"{APP_DIR}/scripts/download_weights.sh", "/models"]
    assert files[container["command"][0]] == REPO / "scripts" / "download_weights.sh"
    (mount,) = container["volumeMounts"]
    (volume,) = pod["volumes"]
    assert mount["mountPath"] == "/models" and not mount.get("readOnly")
    claim = one(docs, "PersistentVolumeClaim")
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"] == "minicpmv-models"
    model_path = env_mapping(ASCEND_ENV)["MODEL_PATH"]
    assert model_path == "/models/MiniCPM-V-4.6-Thinking", "where the script puts OpenBMB/MiniCPM-V-4.6-Thinking"


def test_storage_component_sets_class_and_access_mode_in_one_patch(rendered) -> None:
    plain, patched = one(rendered["a2"], "PersistentVolumeClaim"), one(rendered["a2+storage"], "PersistentVolumeClaim")
    assert plain["spec"]["accessModes"] == ["ReadWriteMany"] and "storageClassName" not in plain["spec"]
    patch = yaml.safe_load((K8S / "components" / "storage" / "pvc-storage.yaml").read_text())
    assert patched["spec"]["storageClassName"] == patch["spec"]["storageClassName"]
    assert patched["spec"]["accessModes"] == patch["spec"]["accessModes"] == ["ReadWriteOnce"], "replaced, not merged"
    assert patched["spec"]["resources"] == plain["spec"]["resources"]


def test_model_hostpath_drops_the_claim_and_the_download_job(rendered) -> None:
    docs = rendered["a2+components"]
    assert not by_kind(docs, "PersistentVolumeClaim")
    assert [d["metadata"]["name"] for d in by_kind(docs, "CronJob")] == ["minicpmv-smoke"]


@pytest.mark.parametrize("overlay", ["a2", "a3", "autoscaling"])
def test_volcano_component_makes_the_pods_what_mindcluster_expects(rendered, overlay: str) -> None:
    docs = rendered[f"{overlay}+components"]
    template = one(docs, "Deployment")["spec"]["template"]
    pod = template["spec"]
    assert pod["schedulerName"] == "volcano"
    assert template["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b"
    assert template["metadata"]["labels"]["fault-scheduling"] == "grace"
    assert template["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == "default"
    expected = {"a2": "module-910b-8", "a3": "module-a3-16"}[OVERLAYS[overlay]]
    assert pod["nodeSelector"]["accelerator-type"] == expected
    assert pod["nodeSelector"]["host-arch"] == "huawei-arm"
    env = {e["name"]: e for e in server_container(one(docs, "Deployment"))["env"]}
    npu = NPU_RESOURCE[overlay]
    assert env["ASCEND_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{npu}']"
    assert npu in server_container(one(docs, "Deployment"))["resources"]["limits"]
    for name, job in pod_templates(docs)[1:]:
        assert "schedulerName" not in job, f"{name}: no NPU, the default scheduler"
    assert "schedulerName" not in one(rendered[overlay], "Deployment")["spec"]["template"]["spec"], "opt-in"
    assert set(VOLCANO) == {"a2", "a3"}


@pytest.mark.parametrize("overlay", ["cce", "cce-a3"])
def test_cce_with_either_target(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    container = server_container(one(docs, "Deployment"))
    assert container["image"] == project_image(OVERLAYS[overlay])
    assert container["resources"]["limits"] == {"huawei.com/ascend-1980": "1", "memory": "64Gi"}
    target = OVERLAYS[overlay]
    assert one(docs, "ConfigMap")["data"] == one(rendered[target], "ConfigMap")["data"], "the target's settings"


def test_autoscaler_scales_the_deployment_on_vllm_queue_metrics(rendered) -> None:
    docs = rendered["autoscaling"]
    hpa, deployment = one(docs, "HorizontalPodAutoscaler"), one(docs, "Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert "replicas" not in deployment["spec"], "kubectl apply would fight the HPA"
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    metrics = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in hpa["spec"]["metrics"]}
    assert set(metrics) == set(adapter_metric_names().values())
    max_num_seqs = settings.resolve((), one(docs, "ConfigMap")["data"])["max_num_seqs"]
    assert 0 < float(metrics["vllm_num_requests_running"]["averageValue"]) < max_num_seqs
    up = hpa["spec"]["behavior"]["scaleUp"]["policies"]
    assert up == [{"type": "Pods", "value": 1, "periodSeconds": 180}], "one cold start at a time"
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 600
    assert one(docs, "ServiceMonitor"), "the scrape the metrics come through"


def test_autoscaling_must_wrap_the_overlay_not_join_its_components(tmp_path) -> None:
    """Why overlays/autoscaling builds on overlays/a2: kustomize applies an overlay's own
    `replicas:` after its components, so inside the overlay the count would come back."""
    rel = pathlib.Path(os.path.relpath(K8S, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(rel / "base")], "replicas": [{"name": "minicpmv", "count": 1}],
        "components": [str(rel / "components" / "autoscaling")]}))
    assert one(render_kustomization(tmp_path), "Deployment")["spec"]["replicas"] == 1


ADAPTER_VALUES = REPO / "deploy" / "prometheus-adapter" / "values.yaml"


def adapter_metric_names() -> dict[str, str]:
    """vLLM's metric name (as /metrics spells it) -> the custom metrics API name the adapter gives."""
    import re

    out = {}
    for rule in yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]:
        series = re.fullmatch(r"([a-z_:]+)\{namespace!=\"\",pod!=\"\"\}", rule["seriesQuery"])
        assert series, rule["seriesQuery"]
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        assert "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)" == rule["metricsQuery"], "summed over engines"
        out[series[1]] = re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\1"), series[1])
    return out


def test_servicemonitor_scrapes_a_path_the_api_key_leaves_open(rendered) -> None:
    """Whatever the access rules become, Prometheus must reach /metrics without the key."""
    from minicpmv_ascend.server import access

    public = {(route.path, method) for route in access.PUBLIC_ROUTES for method in route.methods}
    for rendering in ("a2+components", "autoscaling"):
        (endpoint,) = one(rendered[rendering], "ServiceMonitor")["spec"]["endpoints"]
        assert (endpoint["path"], "GET") in public
        assert "bearerTokenSecret" not in endpoint and "authorization" not in endpoint


@pytest.mark.server
def test_autoscaling_metric_names_are_what_vllm_serves(server) -> None:
    """The adapter's series exist on a running server's /metrics (no key needed), with the labels
    the rules rely on, and each is one gauge per engine."""
    from support.server import http_get

    status, body = http_get(f"{server.base_url}/metrics")
    assert status == 200
    text = body.decode()
    for series in adapter_metric_names():
        assert f"# TYPE {series} gauge" in text, series
        lines = [line for line in text.splitlines() if line.startswith(series + "{")]
        assert lines and all('engine="' in line and f'model_name="{server.model}"' in line for line in lines), lines


def test_overlays_change_only_what_differs_from_the_base_and_the_defaults(tmp_path, tiny_config) -> None:
    """An overlay's `configMapGenerator` (behavior: merge) may change a setting for its clusters;
    a value equal to the base's, or to the default, would be a second copy to keep in step."""
    base = env_mapping(ASCEND_ENV)
    for path in sorted((K8S / "overlays").glob("*/kustomization.yaml")):
        for generator in yaml.safe_load(path.read_text()).get("configMapGenerator") or []:
            literals = dict(literal.split("=", 1) for literal in generator.get("literals", []))
            assert not generator.get("envs") and not generator.get("files"), f"{path}: literals only"
            assert not {k: v for k, v in literals.items() if base.get(k) == v}, f"{path} repeats the base"
            merged = tmp_path / f"{path.parent.name}.env"
            merged.write_text("".join(f"# {path}\n{k}={v}\n" for k, v in {**base, **literals}.items()))
            assert restated_defaults(merged, "ascend", tiny_config) == [], path


def test_every_manifest_file_is_used() -> None:
    """Each YAML file under deploy/k8s is a kustomization or listed by one (no stale manifests)."""
    listed: set[pathlib.Path] = set()
    for kustomization in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        for key in ("resources", "components"):
            for entry in spec.get(key, []):
                listed.add((kustomization.parent / entry).resolve())
        for patch in spec.get("patches", []):
            if "path" in patch:
                listed.add((kustomization.parent / patch["path"]).resolve())
    for path in K8S.rglob("*.yaml"):
        if path.name != "kustomization.yaml":
            assert path.resolve() in listed, f"{path.relative_to(REPO)} is not referenced by a kustomization"


def test_rendering_refuses_a_file_outside_the_kustomization(tmp_path) -> None:
    """What `kubectl apply -k` does, and the tests now too (no LoadRestrictionsNone): the old Job's
    hint "include ../../base/pvc.yaml yourself" fails; a directory (another kustomization) works."""
    (tmp_path / "base").symlink_to(K8S / "base")
    job = tmp_path / "job"
    job.mkdir()
    (job / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../base/pvc.yaml"]}))
    with pytest.raises(AssertionError, match="security; file .* is not in or below"):
        render_kustomization(job)
