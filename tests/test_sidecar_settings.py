"""The Kubernetes gateway sidecar runs with every lpx.yaml serving.openai setting, as `lpx serve`'s gateway
does: a non-default value of each field of the section is set, `lpx deploy k8s`'s objects are rendered, the
sidecar's ConfigMap is laid out as the kubelet would mount it, and its command line is parsed by the real
`lpx gateway` into the GatewaySettings it would run with (nothing started). The pod's own values (bind
address, port, keys Secret, access log on stdout) are the fields the sidecar overrides on purpose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.cli.gateway import gateway as gateway_command
from pipeline.cli.gateway import sidecar_settings
from pipeline.config import OpenAIGateway, parse_config
from pipeline.demo import demo_config_dict
from pipeline.deploy import k8s_files
from pipeline.deploy.k8s import CHAT_TEMPLATE, CONFIG_MOUNT, KEYS_MOUNT, PORTS, grace_period
from pipeline.gateway.settings import GatewaySettings, from_config

POD_OWNED = {"host": "0.0.0.0", "port": PORTS["openai"], "api_keys_file": Path(KEYS_MOUNT) / "keys.json"}
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def non_default(name: str, field, tmp: Path):
    """A valid value for `field` other than its default (each kind of field the section has)."""
    default = field.get_default(call_default_factory=True)
    chosen = {
        "enabled": True,  # the sidecar exists only when the gateway is enabled
        "host": "127.0.0.2",
        "port": 9100,
        "model_name": "served-as",
        "api_keys_file": tmp / "keys.json",
        "open_routes": ["/health/live", "/health/ready"],
        "rate_limit_storage": "memory://?tag=sidecar",
        "access_log": tmp / "access.log",
        "log_prompts": True,
        "chat_template": tmp / "template.jinja",
    }
    if name in chosen:
        return chosen[name]
    if isinstance(default, bool):
        return not default
    if default is None:  # the per-key rate limits: counts >= 1
        return 17
    if isinstance(default, (int, float)):
        return default + 7 if isinstance(default, int) else default + 1.5
    raise AssertionError(f"serving.openai.{name}: no non-default value chosen for a {type(default)} field")


@pytest.fixture
def deployed(tmp_path: Path):
    """(the config's serving.openai, the sidecar's GatewaySettings, the pod spec, the ConfigMap)."""
    (tmp_path / "template.jinja").write_text(TEMPLATE)
    data = demo_config_dict(str(tmp_path / "checkpoint"))
    fields = OpenAIGateway.model_fields
    openai = {n: non_default(n, f, tmp_path) for n, f in fields.items()}
    for name, value in openai.items():
        assert name == "enabled" or value != fields[name].get_default(call_default_factory=True), (
            name
        )  # the test can fail
    data["serving"] = {**data.get("serving", {}), "openai": {k: _yaml(v) for k, v in openai.items()}}
    cfg = parse_config(yaml.safe_load(yaml.safe_dump(data)))
    objects = [o for doc in k8s_files(cfg, "fp8").values() for o in _docs(doc)]
    (pod,) = [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Deployment"]
    (cmap,) = [o for o in objects if o["kind"] == "ConfigMap"]
    (sidecar,) = [c for c in pod["containers"] if c["name"] == "gateway"]
    mounted = tmp_path / "etc-lpx-config"  # the ConfigMap volume, as the kubelet lays it out
    mounted.mkdir()
    for key, text in cmap["data"].items():
        (mounted / key).write_text(text)
    args = [a.replace(CONFIG_MOUNT, str(mounted)) for a in sidecar["args"][1:]]
    params = gateway_command.make_context("gateway", args).params
    params["repo_dir"] = _packaged_repo(tmp_path / "models", cfg.model.name)
    return cfg.serving.openai, sidecar_settings(**params), pod, cmap


def _yaml(value):
    return str(value) if isinstance(value, Path) else value


def _docs(doc):
    return doc if isinstance(doc, list) else [doc]


def _packaged_repo(folder: Path, model: str) -> Path:
    """A repository folder as `lpx repo` leaves it (a complete manifest + ensemble/), enough for the
    sidecar's choice of repository; its name is its key, as in the store."""
    from pipeline.artifacts import MANIFEST, SCHEMA

    repo = folder / "0123456789ab"
    (repo / "ensemble").mkdir(parents=True)
    manifest = {"schema": SCHEMA, "key": repo.name, "complete": True, "stage": "repo", "model": model}
    manifest.update(variant="fp8", arch="any", created=1.0)
    (repo / MANIFEST).write_text(json.dumps(manifest))
    return repo


def test_every_serving_openai_setting_reaches_the_sidecar(deployed) -> None:
    section, settings, _, cmap = deployed
    for name in OpenAIGateway.model_fields:
        got = getattr(settings, name)
        if name in POD_OWNED:
            assert got == POD_OWNED[name], name
        elif name == "enabled":
            assert got is True  # a sidecar is the gateway enabled
        elif name == "access_log":
            assert got == "-", "the sidecar's access log goes to stdout (kubectl logs)"
        elif name == "chat_template":
            assert got == Path(CONFIG_MOUNT) / CHAT_TEMPLATE and cmap["data"][CHAT_TEMPLATE] == TEMPLATE
        else:
            assert got == getattr(section, name), name


def test_lpx_serve_and_the_sidecar_use_one_settings_model(deployed) -> None:
    """`lpx serve`'s gateway (from_config) and the sidecar agree on every field they do not own."""
    section, sidecar, _, _ = deployed
    served = from_config(parse_config(demo_config_dict("/x")), "127.0.0.1:8001", Path("/t"))
    assert type(sidecar) is type(served) is GatewaySettings and issubclass(GatewaySettings, OpenAIGateway)
    local = {
        n
        for n in OpenAIGateway.model_fields
        if n not in POD_OWNED and n not in ("access_log", "chat_template")
    }
    assert {n: getattr(sidecar, n) for n in local} == {n: getattr(section, n) for n in local}


def test_the_grace_period_follows_the_drain(deployed) -> None:
    section, _, pod, _ = deployed
    assert pod["terminationGracePeriodSeconds"] == grace_period_of(section.drain_timeout_s)
    assert pod["terminationGracePeriodSeconds"] > section.drain_timeout_s


def grace_period_of(drain_s: float) -> int:
    cfg = parse_config(demo_config_dict("/x"))
    cfg.serving.openai.drain_timeout_s = drain_s
    return grace_period(cfg)


def test_an_unreadable_chat_template_is_refused_at_deploy(tmp_path: Path) -> None:
    from pipeline.errors import UsageError

    data = demo_config_dict(str(tmp_path / "checkpoint"))
    data["serving"] = {
        **data.get("serving", {}),
        "openai": {"chat_template": str(tmp_path / "missing.jinja")},
    }
    with pytest.raises(UsageError, match="serving.openai.chat_template: cannot read"):
        k8s_files(parse_config(data), "fp8")
