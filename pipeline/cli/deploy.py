"""`lpx deploy k8s` and `lpx deploy dynamo`: manifests for a variant, written as a kustomize tree."""

from __future__ import annotations

from pathlib import Path

import click

from .options import config_option


def _config(config_path: Path | None):
    from ..config import resolve_config

    return resolve_config(config_path)


def _variant(cfg, variant: str | None) -> str:
    """--variant, or the config's only variant (as every other command defaults)."""
    if variant is not None:
        return variant
    names = [v.name for v in cfg.variants]
    if len(names) == 1:
        return names[0]
    from ..errors import UsageError

    raise UsageError(f"lpx.yaml has several variants ({', '.join(names)}) - pick one with --variant")


def _with_registry(cfg, registry: str):
    """cfg with deploy.registry set, validated as lpx.yaml's own value would be."""
    from ..config import Deploy

    data = cfg.deploy.model_dump()
    data["registry"] = registry
    try:
        deploy = Deploy.model_validate(data)
    except ValueError:
        raise click.BadParameter(
            f"{registry!r} is not a registry: write host[:port][/path], e.g. ghcr.io/my-org or localhost:5000",
            param_hint="--registry",
        ) from None
    return cfg.model_copy(update={"deploy": deploy})


@click.group("deploy")
def deploy() -> None:
    """Write deployment manifests (Kubernetes, NVIDIA Dynamo) for one variant. They are generated as data
    and validated offline; applying them (kubectl apply -k) is yours."""


@deploy.command("k8s")
@config_option
@click.option("--variant", default=None, help="The variant to deploy (default: the config's only one).")
@click.option(
    "--registry",
    default=None,
    help="Registry of LPX's images (host[:port][/path]; default: deploy.registry, localhost:5000).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("deploy/k8s"),
    show_default=True,
    help="Folder to write.",
)
def k8s(config_path: Path | None, variant: str, registry: str | None, out: Path) -> None:
    """Kubernetes for the engine, torch and vllm targets: base/ (Services, PDB, NetworkPolicy,
    ServiceMonitor, PrometheusRule, HPA) and overlays/<arch>/ (the Deployment, or a LeaderWorkerSet when
    tp x pp spans nodes) per build.archs. Apply every arch's overlay (they coexist: a mixed cluster serves
    each arch behind one Service), each with kubectl apply -k OUT/overlays/<arch>."""
    from ..deploy import deploy_k8s, images

    cfg = _config(config_path)
    if registry is not None:
        cfg = _with_registry(cfg, registry)
    written = deploy_k8s(cfg, _variant(cfg, variant), out)
    click.echo(f"wrote {len(written)} files under {out}")
    click.echo(f"  images: {', '.join(sorted({images.server(cfg), images.slim(cfg)}))}")
    click.echo("  (each overlay's kustomization.yaml lists them under images: to change one per overlay)")
    for arch in cfg.build.archs:
        click.echo(f"  kubectl apply -k {out / 'overlays' / arch}")
    click.echo(
        f"  (first: kubectl -n {cfg.deploy.namespace} create secret generic {cfg.deploy.keys_secret} "
        "--from-file=keys.json=<lpx keys file>)"
    )
    from ..deploy import k8s as k8s_objects
    from ..deploy import mpi

    chosen = cfg.for_variant(
        cfg.variant(_variant(cfg, variant))
    )  # as deploy_k8s decides: the variant's target
    if k8s_objects.is_lws(chosen):  # the LeaderWorkerSet's pods mount the SSH Secret (docs/deploy.md)
        click.echo(
            f"  (and the ranks' SSH keys: {mpi.secret_command(cfg.deploy.namespace, cfg.deploy.ssh_secret)})"
        )


@deploy.command("dynamo")
@config_option
@click.option(
    "--variant",
    default=None,
    help="The variant to deploy (build.target: llmapi or vllm; default: the only one).",
)
@click.option("--disagg", is_flag=True, help="Disaggregated prefill and decode workers.")
@click.option(
    "--api-version",
    type=click.Choice(["v1alpha1", "v1beta1"]),
    default="v1beta1",
    show_default=True,
    help="DynamoGraphDeployment version: v1beta1 (operators from Dynamo 1.2.0; storage version from 1.5.0), "
    "v1alpha1 for older operators.",
)
@click.option(
    "--model-path",
    default=None,
    help="The checkpoint's path inside the pods (default: the llmapi repository's, under /models).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("deploy/dynamo"),
    show_default=True,
    help="Folder to write.",
)
def dynamo(
    config_path: Path | None, variant: str, disagg: bool, api_version: str, model_path: str | None, out: Path
) -> None:
    """NVIDIA Dynamo for the llmapi and vllm targets: a DynamoGraphDeployment (aggregated, or --disagg)
    with Dynamo's TensorRT-LLM or vLLM worker (and llmapi's engine args in a ConfigMap), and the two
    commands that serve the same on one machine."""
    from ..deploy import deploy_dynamo
    from ..deploy import dynamo as dynamo_images

    cfg = _config(config_path)
    written, commands = deploy_dynamo(
        cfg, _variant(cfg, variant), out, disagg=disagg, model_path=model_path, api_version=api_version
    )
    click.echo(f"wrote {len(written)} files under {out}; apply: kubectl apply -k {out}")
    click.echo(f"  image: {dynamo_images.IMAGES[cfg.build.target]} (kustomization.yaml images: to change it)")
    click.echo("on one machine:")
    for command in commands:
        click.echo(f"  {command}")
