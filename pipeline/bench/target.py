"""The requests of one `lpx bench` run, settled before any load: where the prompts come from (a dataset,
the served tokenizer's exact-length text, common words, or token ids), and what the served model
declares (output tokens counted, input tokens returned, output length forced), each said in a note."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .load import COUNT_INPUT, COUNT_PROMPT, ENGINE, FORCE_OUTPUT, LoadSpec, model_inputs, probe
from .options import DEFAULT_VOCAB, BenchOptions


def dataset_texts(opts: BenchOptions) -> tuple[str, ...]:
    """--dataset's prompts (text models only); () without one."""
    if opts.dataset is None:
        return ()
    if opts.model == ENGINE:
        raise UsageError("--dataset gives text prompts: use it with --model ensemble or tensorrt_llm_bls")
    from ..texts import read_texts

    prompts = tuple(read_texts(opts.dataset, opts.dataset_field, "--dataset", "--dataset-field")[0])
    if not prompts:
        raise UsageError(f"--dataset: {opts.dataset} holds no prompts")
    return prompts


def text_prompts(opts: BenchOptions, prompts: tuple[str, ...], notes: list[str]) -> tuple[Any, dict]:
    """(PromptMaker or None, the prompt source for the report) of a text model: the served tokenizer when
    one is found, else a note that lengths are approximate (unless a dataset gives the prompts)."""
    from .prompts import NO_TOKENIZER_NOTE, PromptMaker, describe, find_tokenizer, server_tokenization

    url = opts.url or ""
    maker, source = None, {"kind": "synthetic"}
    folder = find_tokenizer(url, opts.tokenizer, opts.repo)
    if folder is not None:
        how = (
            {"add_special_tokens": True, "chat": opts.endpoint == "chat"}
            if opts.protocol == "openai"
            else server_tokenization(url, opts.protocol)
        )
        maker = PromptMaker.load(folder, **how)
        source = {"kind": "exact (tokenizer)", **describe(maker)}
    elif not prompts:
        notes.append(NO_TOKENIZER_NOTE.format(url=url, n=opts.input_len))
        source = {"kind": "approximate (no tokenizer)", "tokenizer": None}
    if prompts:
        source = {**source, "kind": "dataset", "count": len(prompts)}
    return maker, source


def load_spec(opts: BenchOptions, **extra: Any) -> LoadSpec:
    """The LoadSpec of these options; `extra`: what the options do not hold (prompts, maker, vocab,
    prompt_ids)."""
    fields: dict[str, Any] = {
        "url": opts.url or "",
        "model": opts.model,
        "protocol": opts.protocol,
        "input_len": opts.input_len,
        "output_len": opts.output_len,
        "input_len_std": opts.input_len_std,
        "output_len_std": opts.output_len_std,
        "vocab": opts.vocab_range or DEFAULT_VOCAB,
        "seed": opts.seed,
        "endpoint": opts.endpoint,
        "api_key": opts.api_key,
    }
    return LoadSpec(**{**fields, **extra})


def vocab_of(model_config: dict[str, Any]) -> tuple[int, int]:
    """The range random prompt ids are drawn from: a model's vocabulary (its config.json's vocab_size),
    its first ids (often special tokens) left out."""
    text = model_config.get("text_config") or {}
    size = int(model_config.get("vocab_size") or text.get("vocab_size") or 32000)
    return min(100, size // 4), size


def served_vocab(folder: Path) -> tuple[int, int] | None:
    """vocab_of the model whose tokenizer folder this is (the repository's copy holds its config.json);
    None when the folder has no config.json with a vocab_size."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UsageError(f"Cannot read {folder / 'config.json'} ({exc}) - pass --vocab LO,HI") from None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") or {}
    return vocab_of(config) if config.get("vocab_size") or text.get("vocab_size") else None


def token_ids(opts: BenchOptions, notes: list[str]) -> tuple[tuple[int, int], dict[str, Any]]:
    """(the token id range, the prompt source) of --model tensorrt_llm: --vocab, else the served
    model's vocabulary when its tokenizer folder is found, else DEFAULT_VOCAB with a note."""
    if opts.vocab_range is not None:
        return opts.vocab_range, {"kind": "token ids", "vocab_from": "--vocab"}
    from .prompts import find_tokenizer

    folder = find_tokenizer(opts.url or "", opts.tokenizer, opts.repo)
    found = served_vocab(folder) if folder is not None else None
    if found is not None:
        return found, {"kind": "token ids", "vocab_from": str(folder / "config.json")}
    lo, hi = DEFAULT_VOCAB
    notes.append(
        f"token ids drawn from {lo}-{hi}: the served model's vocabulary is not known here (no config.json "
        "in its tokenizer folder) - pass --vocab LO,HI (or --tokenizer DIR) if its vocabulary is smaller"
    )
    return DEFAULT_VOCAB, {"kind": "token ids", "vocab_from": "default"}


def requests_of(opts: BenchOptions) -> tuple[LoadSpec, list[str], dict[str, Any]]:
    """(the LoadSpec, notes, the prompt source) of a run at opts.url."""
    prompts = dataset_texts(opts)
    notes: list[str] = []
    if opts.model == ENGINE:
        vocab, source = token_ids(opts, notes)
        return load_spec(opts, vocab=vocab), notes, source
    maker, source = text_prompts(opts, prompts, notes)
    return load_spec(opts, prompts=prompts, maker=maker), notes, source


def declare(spec: LoadSpec) -> set[str]:
    """Set what the served model declares on `spec` (Triton's metadata): output tokens counted (text
    models), input tokens returned, output length forced with min_tokens. Returns the declared inputs."""
    declared = (model_inputs(spec) or set()) if spec.protocol != "openai" else set()
    if spec.model != ENGINE and not spec.count_tokens:  # count tokens, not responses, where the model can
        spec.count_tokens = COUNT_INPUT in declared
    spec.count_input = COUNT_PROMPT in declared
    # OpenAI's API: vLLM's extensions (ignore_eos, min_tokens), which LPX's gateway takes; output_notes
    # probes whether the server does
    spec.force_output = FORCE_OUTPUT in declared or spec.protocol == "openai"
    return declared


def _openai_output_notes(spec: LoadSpec) -> list[str]:
    """--api openai: output lengths forced with ignore_eos + min_tokens = max_tokens (vLLM's extensions,
    LPX's gateway takes them), unless one probe request shows the server refuses them."""
    head = f"OpenAI API ({spec.endpoint}): ISL and OSL measured from each response's usage; "
    tried = probe(spec) if spec.force_output else None
    if tried is not None and tried.error:
        spec.force_output = False
        return [
            head
            + f"output length not forced: the server refused ignore_eos / min_tokens ({tried.error[:200]})"
            " - requests stop at max_tokens or at end-of-sequence, whichever comes first"
        ]
    if spec.force_output:
        return [head + "output length forced (ignore_eos, min_tokens = max_tokens)"]
    return [head + "output length not forced"]


def output_notes(spec: LoadSpec) -> list[str]:
    """Whether the output length is forced, said; one probe request finds a model that declares
    min_tokens but refuses it (the torch target), which then is sent none."""
    if spec.protocol == "openai":
        return _openai_output_notes(spec)
    if not spec.force_output:
        return [
            f"output length not forced: {spec.model} does not declare min_tokens - requests stop at "
            "max_tokens or at end-of-sequence, whichever comes first; measured OSL shows which"
        ]
    tried = probe(spec)
    if tried.error and FORCE_OUTPUT in tried.error:  # declared but not honoured (the torch target)
        spec.force_output = False
        return [
            f"output length not forced: {spec.model} declares min_tokens but refused "
            f"min_tokens={tried.osl} ({tried.error[:200]}) - requests stop at max_tokens or at "
            "end-of-sequence, whichever comes first; measured OSL shows which"
        ]
    return []
