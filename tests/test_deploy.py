"""The deployment files (deploy/): every Kubernetes manifest valid against the Kubernetes API
schemas (kubernetes-validate, offline), wired to what the server really serves (ports, probe
routes, the autoscaler's metric, a drain that fits the grace period), the configs they mount
loadable, and the Dockerfiles copying files that exist. No Docker engine or cluster runs here:
the images themselves are not built by CI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from voicert.config import Config, load_config
from voicert.server.app import CLOSE_WAIT_S, VoiceServer
from voicert.telemetry.metrics import Metrics

kv = pytest.importorskip("kubernetes_validate")
ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.33"  # PodLifecycleSleepAction (preStop sleep) is on by default from 1.30


def manifests() -> list[dict]:
    docs = []
    for file in sorted(K8S.glob("*.yaml")):
        if file.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(file.read_text()) if d]
    return docs


def by_kind(kind: str) -> list[dict]:
    return [d for d in manifests() if d["kind"] == kind]


def test_every_manifest_is_valid_for_the_kubernetes_api():
    docs = manifests()
    assert {d["kind"] for d in docs} >= {
        "Deployment",
        "Service",
        "ConfigMap",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    }
    for doc in docs:
        kv.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_refuses_a_misspelt_field():
    doc = by_kind("Deployment")[0]
    doc["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 30
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_names_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {f.name for f in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


def mounted_configs(tmp_path) -> dict[str, Config]:
    """The ConfigMap's files, loaded as the pods load them (the image's gpu.yaml: this repo's)."""
    data = by_kind("ConfigMap")[0]["data"]
    out = {}
    for name, text in data.items():
        text = text.replace("/opt/voicert/configs/", f"{ROOT}/configs/")
        (tmp_path / name).write_text(text)
        out[name] = load_config(tmp_path / name, environ={})
    return out


def test_the_mounted_configs_load_and_the_front_end_asks_the_engine_service(tmp_path):
    configs = mounted_configs(tmp_path)
    front, llm = configs["frontend.yaml"], configs["llm.yaml"]
    assert front.llm.engine == "openai" and llm.llm.engine == "fast" and llm.llm.device == "cuda"
    service = next(s for s in by_kind("Service") if s["metadata"]["name"] == "voicert-llm")
    assert front.llm.base_url == f"http://voicert-llm:{service['spec']['ports'][0]['port']}/v1"
    assert llm.server.max_completions >= front.server.max_sessions
    # the engine pods answer to the name the front ends use (DNS-rebinding guard: server/access.py)
    from urllib.parse import urlsplit

    from voicert.server.access import host_allowed, split_list

    name = urlsplit(front.llm.base_url).netloc
    assert host_allowed(name, split_list(llm.server.allowed_hosts))


def test_probes_ports_and_drain_fit_the_server(tmp_path):
    configs = mounted_configs(tmp_path)
    routes = VoiceServer().routes()
    for dep in by_kind("Deployment"):
        pod = dep["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        cfg = configs[Path(container["args"][container["args"].index("--config") + 1]).name]
        assert container["ports"][0]["containerPort"] == cfg.server.port
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            path = container[probe]["httpGet"]["path"]
            assert not hasattr(routes.find("GET", path), "status"), path  # a real route
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert (
            pod["terminationGracePeriodSeconds"]
            > pre_stop + cfg.server.shutdown_grace_s + CLOSE_WAIT_S
        )


def test_the_autoscaler_scales_the_front_end_on_a_metric_the_server_exports():
    (hpa,) = by_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "voicert"
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric.encode() in Metrics(100.0, 10).exposition()


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfiles_copy_what_exists_and_run_the_server(name):
    text = (ROOT / "deploy" / "docker" / name).read_text()
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    copies = re.findall(r"^COPY (?:--\S+ )*(.+?) \S+$", text, re.M)
    assert copies
    copied = {src for sources in copies for src in sources.split()}
    for src in copied:
        assert (ROOT / src).exists(), src
        assert src not in ignored, src
        for link in (p for p in (ROOT / src).rglob("*") if p.is_symlink()):
            # a link inside the image must land inside it (voicert/web -> ../web)
            target = link.resolve().relative_to(ROOT).parts[0]
            assert target in copied, f"{link.relative_to(ROOT)} -> {target}, not copied"
    assert "scripts/setup.sh" in text  # the same set-up as the README's first command
    assert re.search(r'^ENTRYPOINT \["/opt/voicert/\.venv/bin/voicert"\]', text, re.M)
    assert re.search(r"^EXPOSE 8765$", text, re.M) and "/readyz" in text
    for config in re.findall(r'"--config", "([^"]+)"', text):
        assert (ROOT / config).is_file()
