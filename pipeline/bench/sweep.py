"""`lpx bench`: sweep concurrency levels (closed loop) or one request rate (open loop) against a URL, or
against a variant LPX builds and serves for the purpose (`served_variant`); the command line is
pipeline/cli/tools.py's."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from ..errors import LpxError, StageFailed, UsageError
from ..facts.gpu import lookup_gpu
from ..slo import parse_slo
from . import report, roofline
from .compare import parse_variant
from .load import (
    COUNT_INPUT,
    COUNT_PROMPT,
    ENGINE,
    FORCE_OUTPUT,
    LoadSpec,
    model_inputs,
    probe,
    run_closed,
    run_open,
)
from .metrics import summarize


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise LpxError(f"Bad --concurrency {text!r} - use a comma list such as 1,4,16,64") from None
    if not levels or min(levels) < 1:
        raise LpxError(f"Bad --concurrency {text!r} - every level must be >= 1")
    return levels


def bench(
    spec: LoadSpec,
    concurrency: list[int] | None = None,
    rate: float | None = None,
    burstiness: float = 1.0,
    requests: int | None = 100,
    duration_s: float | None = None,
    warmup: int = 10,
    slo: dict[str, float] | None = None,
    out: Path | None = None,
    echo: Any = None,
    label: str | None = None,
    variant: dict[str, Any] | None = None,
    roof: dict[str, Any] | None = None,
    notes: list[str] | None = None,
    prompt_source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the load against `spec.url` and return the report document; write it to `out` if given.
    `label` and `variant` ({'model', 'name', 'artifact'}) are recorded for `lpx compare`; `roof`
    ({'gpu', 'checkpoint', 'format', 'kv_dtype'}) adds the decode roofline (see roofline_inputs)."""
    from ..progress import Reporter

    bar = Reporter()
    results = []
    notes = list(notes or [])
    declared = (model_inputs(spec) or set()) if spec.protocol != "openai" else set()
    if spec.model != ENGINE and not spec.count_tokens:  # count tokens, not responses, where the model can
        spec.count_tokens = COUNT_INPUT in declared
    spec.count_input = COUNT_PROMPT in declared
    spec.force_output = FORCE_OUTPUT in declared
    if spec.protocol == "openai":
        notes.append(
            f"OpenAI API ({spec.endpoint}): ISL and OSL measured from each response's usage; output length "
            "not forced - requests stop at max_tokens or at end-of-sequence, whichever comes first"
        )
    elif spec.force_output:
        tried = probe(spec)
        if tried.error and FORCE_OUTPUT in tried.error:  # declared but not honoured (the torch target)
            spec.force_output = False
            notes.append(
                f"output length not forced: {spec.model} declares min_tokens but refused "
                f"min_tokens={tried.osl} ({tried.error[:200]}) - requests stop at max_tokens or at "
                "end-of-sequence, whichever comes first; measured OSL shows which"
            )
    else:
        notes.append(
            f"output length not forced: {spec.model} does not declare min_tokens - requests stop at "
            "max_tokens or at end-of-sequence, whichever comes first; measured OSL shows which"
        )
    if echo:
        for note in notes:
            echo(f"note: {note}")

    def progressed(label: str, total: int | None, run):
        with bar.task(label, total) as advance:
            spec.on_done = lambda _rec: advance()
            try:
                return run()
            finally:
                spec.on_done = None

    if rate is not None:
        n = requests or max(1, int(rate * (duration_s or 60)))
        results.append(
            summarize(
                progressed(
                    f"rate {rate:g}/s", n + warmup, lambda: run_open(spec, rate, n, burstiness, warmup)
                ),
                slo,
            )
        )
    else:
        for c in concurrency or [1]:
            total = None if duration_s else requests + warmup
            results.append(
                summarize(
                    progressed(
                        f"concurrency {c}",
                        total,
                        lambda c=c: run_closed(spec, c, None if duration_s else requests, duration_s, warmup),
                    ),
                    slo,
                )
            )
            if echo:
                r = results[-1]
                echo(
                    f"c={c}: {r['succeeded']} ok, {r['failed']} failed, "
                    f"{r['output_tokens_per_s']:.1f} tok/s, TTFT p50 "
                    f"{r['ttft_ms']['p50'] if r['ttft_ms'] else float('nan'):.1f} ms"
                )
    doc = {
        "target": {
            "url": spec.url,
            "model": spec.model,
            "protocol": spec.protocol,
            "input_len": spec.input_len,
            "output_len": spec.output_len,
            "input_len_std": spec.input_len_std,
            "output_len_std": spec.output_len_std,
            "dataset_prompts": len(spec.prompts),
            "vocab": list(spec.vocab),
            "seed": spec.seed,
            "prompts": prompt_source or {},
            "output_forced": spec.force_output,
            "input_tokens_from": "usage"
            if spec.protocol == "openai"
            else "num_input_tokens"
            if spec.count_input
            else "client",
            **({"endpoint": spec.endpoint} if spec.protocol == "openai" else {}),
        },
        "notes": notes,
        "results": results,
        "environment": report.environment(),
        "finished_at": time.time(),
    }
    if label:
        doc["label"] = label
    if variant:
        doc["variant"] = variant
    if roof is not None:
        try:
            args = roofline_inputs(doc, **roof)
            if isinstance(args, str):
                doc["roofline_note"] = args
            else:
                roofline.roofline(doc, *args)
        except LpxError as exc:
            doc["roofline_note"] = f"roofline skipped: {exc}"
    if out is not None:
        doc["files"] = {k: str(v) for k, v in report.write(doc, out).items()}
    return doc


def roofline_inputs(
    doc: dict[str, Any],
    gpu: str | None = None,
    checkpoint: Path | None = None,
    format: str | None = None,
    kv_dtype: str | None = None,
) -> tuple | str:
    """(Gpu, checkpoint, format, kv dtype) for the roofline, from the options or the variant's quantize
    manifest; a note saying what is missing otherwise."""
    g = roofline.roofline_gpu(doc["environment"].get("gpus") or [], gpu)
    variant = doc.get("variant") or {}
    if (checkpoint is None or format is None) and variant.get("name"):
        from ..artifacts import Store

        found = Store().newest("quantize", variant["name"], variant.get("model"))
        if found:
            res = found[0].manifest.get("results", {})
            checkpoint = checkpoint or found[0].path
            format = format or res.get("format")
            kv_dtype = kv_dtype or roofline.kv_dtype_of(res.get("kv_cache"))
    missing = [
        what
        for what, v in (
            ("--gpu (no known GPU detected)", g),
            ("--checkpoint", checkpoint),
            ("--format", format),
        )
        if v is None
    ]
    if missing:
        return "roofline skipped: give " + ", ".join(missing) + " (or --variant with a quantize artifact)"
    return g, Path(checkpoint), format, kv_dtype or "bf16"  # type: ignore[arg-type]


@contextlib.contextmanager
def served_variant(config_path: Path | None, variant_name: str | None, protocol: str):
    """Run the stages for one variant, serve its repository on 127.0.0.1, yield (url, variant info), stop."""
    from ..config import resolve_config
    from ..progress import Reporter
    from ..runner import Runner
    from ..stages.serve import server as triton_server
    from ..stages.serve.selection import choose

    report = Reporter()
    cfg = resolve_config(config_path, report)
    variants = cfg.select([variant_name] if variant_name else None)
    if len(variants) != 1:
        raise UsageError(
            "lpx bench -c measures one variant; pick it with --variant "
            f"(have: {', '.join(v.name for v in variants)})"
        )
    runner = Runner(cfg, report)
    outcome = runner.run(variants, "repo")[0]
    runner.raise_gate_failures()
    picked = choose(outcome)
    if picked is None:
        raise StageFailed(
            f"variant '{variants[0].name}' has no model repository to serve - see the messages above"
        )
    engine, repo = picked
    with triton_server(cfg, variants[0].name, repo) as server:
        report.stage("serve", variants[0].name, f"ready: gRPC {server.grpc_url}, HTTP {server.http_url}")
        yield (
            server.grpc_url if protocol == "grpc" else server.http_url,
            {
                "model": cfg.model.name,
                "name": variants[0].name,
                "artifact": engine.path,
                "repo": repo.path,
                "provenance": {
                    "config": cfg.model_dump(mode="json"),
                    "artifact_keys": {k: a.key for k, a in outcome.artifacts.items()},
                },
            },
        )


def measure(
    url: str | None,
    config_path: Path | None,
    model: str,
    protocol: str,
    concurrency: str,
    rate: float | None,
    burstiness: float,
    requests: int,
    duration: float | None,
    warmup: int,
    input_len: int,
    output_len: int,
    vocab: str,
    seed: int,
    slo: str | None,
    out: Path | None,
    label: str | None,
    variant_ref: str | None,
    artifact: Path | None,
    gpu: str | None,
    checkpoint: Path | None,
    fmt: str | None,
    kv_dtype: str | None,
    input_len_std: float = 0.0,
    output_len_std: float = 0.0,
    dataset: Path | None = None,
    dataset_field: str = "prompt",
    provenance: dict | None = None,
    tokenizer: Path | None = None,
    repo: Path | None = None,
    api: str = "triton",
    endpoint: str = "chat",
    api_key: str | None = None,
    echo=print,
) -> dict[str, Any]:
    """What `lpx bench` does: measure the model at `url` (or, without one, the variant LPX builds and serves
    from config_path) and print the report through `echo`; returns the report document."""
    try:
        lo, hi = (int(x) for x in vocab.split(","))
    except ValueError:
        raise LpxError(f"Bad --vocab {vocab!r} - use LO,HI such as 100,30000") from None
    if api == "openai":
        if url is None:  # the running lpx serve's gateway
            from ..stages.serve import running_server

            url = running_server().get("openai_url")
            if not url:
                raise UsageError("--api openai measures a running server: pass --url http://HOST:PORT")
        from .openai_load import api_key as find_key
        from .openai_load import served_model

        protocol, api_key = "openai", find_key(api_key)
        if model in ("ensemble", "tensorrt_llm_bls", ENGINE):  # Triton's model names: ask the server
            model = served_model(url, api_key)
    if url is None:
        with served_variant(config_path, variant_ref, protocol) as (url, served):
            return measure(
                url,
                None,
                model,
                protocol,
                concurrency,
                rate,
                burstiness,
                requests,
                duration,
                warmup,
                input_len,
                output_len,
                vocab,
                seed,
                slo,
                out,
                label or served["name"],
                f"{served['model']}/{served['name']}",
                served["artifact"],
                gpu,
                checkpoint,
                fmt,
                kv_dtype,
                input_len_std,
                output_len_std,
                dataset,
                dataset_field,
                provenance=served["provenance"],
                tokenizer=tokenizer,
                repo=served["repo"],
                echo=echo,
            )
    prompts: tuple[str, ...] = ()
    if dataset is not None:
        if model == "tensorrt_llm":
            raise UsageError("--dataset gives text prompts: use it with --model ensemble or tensorrt_llm_bls")
        from ..texts import read_texts

        prompts = tuple(read_texts(dataset, dataset_field, "--dataset", "--dataset-field")[0])
        if not prompts:
            raise UsageError(f"--dataset: {dataset} holds no prompts")
    maker, notes, source = None, [], {"kind": "token ids" if model == ENGINE else "synthetic"}
    if model != ENGINE:
        from .prompts import (
            NO_TOKENIZER_NOTE,
            PromptMaker,
            describe,
            find_tokenizer,
            server_tokenization,
        )

        folder = find_tokenizer(url, tokenizer, repo)
        if folder is not None:
            how = (
                {"add_special_tokens": True, "chat": endpoint == "chat"}
                if protocol == "openai"
                else server_tokenization(url, protocol)
            )
            maker = PromptMaker.load(folder, **how)
            source = {"kind": "exact (tokenizer)", **describe(maker)}
        elif not prompts:
            notes.append(NO_TOKENIZER_NOTE.format(url=url, n=input_len))
            source = {"kind": "approximate (no tokenizer)", "tokenizer": None}
        if prompts:
            source = {**source, "kind": "dataset", "count": len(prompts)}
    spec = LoadSpec(
        url=url,
        model=model,
        protocol=protocol,
        input_len=input_len,
        output_len=output_len,
        input_len_std=input_len_std,
        output_len_std=output_len_std,
        vocab=(lo, hi),
        seed=seed,
        prompts=prompts,
        maker=maker,
        endpoint=endpoint,
        api_key=api_key,
    )
    variant: dict[str, Any] | None = parse_variant(variant_ref) if variant_ref else None
    if artifact is not None:
        variant = {**(variant or {"model": None, "name": None}), "artifact": str(artifact.resolve())}
    if provenance:  # the config and the key of every artifact behind the served repository
        variant = {**(variant or {}), **provenance}
    if gpu:
        lookup_gpu(gpu)  # an unknown name fails before the load runs
    roof = {"gpu": gpu, "checkpoint": checkpoint, "format": fmt, "kv_dtype": kv_dtype}
    doc = bench(
        spec,
        None if rate is not None else parse_levels(concurrency),
        rate,
        burstiness,
        requests,
        duration,
        warmup,
        parse_slo(slo),
        out,
        echo=echo,
        label=label,
        variant=variant,
        roof=roof,
        notes=notes,
        prompt_source=source,
    )
    echo(report.markdown(doc))
    for note in ("plots_note", "roofline_note"):
        if note in doc:
            echo(doc[note])
    if out is not None:
        echo(f"Wrote {out}/results.json")
    if all(r["succeeded"] == 0 for r in doc["results"]):
        raise StageFailed(
            f"Every request failed against {url} - first errors: {doc['results'][0]['errors'][:2]}"
        )
    return doc
