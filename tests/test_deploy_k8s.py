"""Kubernetes manifests: every overlay rendered by kustomize (kubectl's, as `kubectl apply -k` does)
alone and with the optional components, validated against the Kubernetes OpenAPI schemas (strict:
unknown fields fail), and checked for what matters: NPU resources, the project's probes with the
right modes, graceful termination, volumes, settings equal to env/ascend-<target>.env."""

from __future__ import annotations

import os
import pathlib

import pytest
import yaml

from conftest import REPO
from test_deploy_support import (
    APP_DIR,
    JOBS,
    K8S,
    OVERLAYS,
    allowed_env_vars,
    by_kind,
    copy_map,
    dockerfile_instructions,
    env_mapping,
    final_stage,
    lint_tool,
    one,
    project_image,
    render_everything,
    render_kustomization,
    run_tool,
    server_container,
)

# Oldest and newest Kubernetes versions whose schemas kubernetes-validate 1.37 ships (1.25 is
# out of support everywhere; 1.27 is still found on managed clusters such as CCE).
K8S_VERSIONS = ("1.27.0", "1.37.0")
NPU_RESOURCE = {"a2": "huawei.com/Ascend910", "a3": "huawei.com/Ascend910", "cce": "huawei.com/ascend-1980"}
DRIVER_MOUNTS = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64/",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
)
# Not settings: the API key comes from the optional secret in Kubernetes.
SECRET_ONLY = {"VLLM_API_KEY", "API_KEY_FILE"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Each overlay, each overlay with every component, and each Job kustomization."""
    return render_everything(tmp_path_factory)


def validate(docs: list[dict], version: str) -> None:
    core = [d for d in docs if "monitoring.coreos.com" not in d["apiVersion"]]
    result = run_tool(lint_tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, "-",
                      input=yaml.safe_dump_all(core))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_manifests_match_the_kubernetes_schemas(rendered, version: str) -> None:
    for name, docs in rendered.items():
        try:
            validate(docs, version)
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from None


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
def test_settings_equal_the_env_file_of_the_target(rendered, overlay: str) -> None:
    docs = rendered[overlay]
    configmap = one(docs, "ConfigMap")
    env_file = {k: v for k, v in env_mapping(REPO / "env" / f"ascend-{OVERLAYS[overlay]}.env").items()
                if v and k not in SECRET_ONLY}
    assert configmap["data"] == env_file
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
    assert ports[service_port["targetPort"]] == int(one(docs, "ConfigMap")["data"]["PORT"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_components_driver_mounts_model_hostpath_and_servicemonitor(rendered, overlay: str) -> None:
    docs = rendered[f"{overlay}+components"]
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in server_container(deployment)["volumeMounts"]}
    for path in DRIVER_MOUNTS:  # FACTS §4, for nodes without Ascend Docker Runtime
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


@pytest.mark.parametrize("rendering", [*(f"{o}+components" for o in OVERLAYS), *(f"job/{j}+node-arch" for j in JOBS)])
def test_node_arch_component_pins_the_deployment_and_jobs_to_the_image_architecture(rendered, rendering) -> None:
    """Atlas servers are usually aarch64: with components/node-arch, every pod template of the
    Deployment and the Jobs selects kubernetes.io/arch=arm64 (merged into any other selector)."""
    templates = [d["spec"]["template"]["spec"] for d in rendered[rendering] if d["kind"] in ("Deployment", "Job")]
    assert templates
    for pod in templates:
        assert pod["nodeSelector"]["kubernetes.io/arch"] == "arm64"
    plain = rendering.removesuffix("+components").removesuffix("+node-arch")
    assert all("nodeSelector" not in d["spec"]["template"]["spec"] for d in rendered[plain]
               if d["kind"] in ("Deployment", "Job")), "the component is opt-in"


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


def test_smoke_job_runs_the_smoke_probe_against_the_service(rendered) -> None:
    job = one(rendered["job/smoke"], "Job")
    service = one(rendered["a2"], "Service")
    container = job["spec"]["template"]["spec"]["containers"][0]
    script = container["command"][-1]
    env = {e["name"]: e for e in container["env"]}
    url = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    assert env["SERVICE_URL"]["value"] == url
    assert f"{APP_DIR}/healthcheck/probe.py ready" in script
    assert f"exec python3 {APP_DIR}/healthcheck/probe.py smoke" in script
    assert env["SERVED_MODEL_NAME"]["value"] == env_mapping(REPO / "env" / "ascend-a2.env")["SERVED_MODEL_NAME"]
    assert job["spec"]["activeDeadlineSeconds"] > 20 * 60, "waits through a cold start, bounded"
    assert "huawei.com/Ascend910" not in str(container["resources"]), "no NPU for a client"


def test_download_job_fills_the_models_claim_with_the_images_script(rendered) -> None:
    job = one(rendered["job/download-weights"], "Job")
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    files = copy_map(final_stage(dockerfile_instructions(REPO / "Dockerfile")))
    assert container["command"] == [f"{APP_DIR}/scripts/download_weights.sh", "/models"]
    assert files[container["command"][0]] == REPO / "scripts" / "download_weights.sh"
    (mount,) = container["volumeMounts"]
    (volume,) = pod["volumes"]
    assert mount["mountPath"] == "/models" and not mount.get("readOnly")
    assert volume["persistentVolumeClaim"]["claimName"] == "minicpmv-models"
    model_path = env_mapping(REPO / "env" / "ascend-a2.env")["MODEL_PATH"]
    assert model_path == "/models/MiniCPM-V-4.6-Thinking", "where the script puts OpenBMB/MiniCPM-V-4.6-Thinking"


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
