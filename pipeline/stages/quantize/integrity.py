"""Every parameter and persistent buffer of the model is loaded from the checkpoint, and none is NaN / inf
(LPX issue 23). transformers fills a tensor the checkpoint lacks with random values and only logs it, so a
checkpoint missing a layer, or a config of another model over these weights, would quantize, evaluate
(random against random) and build with exit 0. Three checks, cheapest first:

  before loading   the tensors of the safetensors headers against the model config.json describes, built
                   on the meta device (no memory, no weights read; Llama-3.1-8B: 1.0 s on the shared CI
                   CPU, 2.7 s on first use with its lazy imports) - missing, unexpected and mis-shaped
                   tensors, tied embeddings and transformers' own ignore-lists honoured; a config of
                   another model (bert over llama) named as such
  at load          what from_pretrained itself reports (output_loading_info): belt and braces
  after load       every floating tensor finite (see FINITE_SCAN below for the cost)

A ModelOpt calibration that meets NaN / inf anyway (activations overflowing the dtype) becomes a message
too (`calibration_error`)."""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import LpxError, StageFailed
from ...inspection.checkpoint import CheckpointInfo, tensor_shapes
from ...inspection.integrity import check_tokenizer_files, names

# The weights' family, for the message when config.json describes another model: a characteristic tensor
# name (layer index 0) of each, most specific first.
SIGNATURES = (
    (r"model\.layers\.0\.self_attn\.q_norm\.weight", "qwen3"),
    (r"model\.layers\.0\.self_attn\.q_proj\.bias", "qwen2"),
    (r"model\.layers\.0\.mlp\.gate_proj\.weight", "llama / mistral"),
    (r"transformer\.h\.0\.attn\.c_attn\.weight", "gpt2"),
    (r"gpt_neox\.layers\.0\.", "gpt_neox"),
    (r"(bert\.)?embeddings\.word_embeddings\.weight", "bert"),
)
# names transformers renames on load (its "legacy" conversions): the header comparison leaves such a
# checkpoint to the load-time check
LEGACY_NAMES = re.compile(r"LayerNorm\.(gamma|beta)$|\.weight_[gv]$")
OTHER_MODEL = 0.5  # under this share of the model's tensors present: the config describes another model


def weights_family(present) -> str | None:
    for pattern, family in SIGNATURES:
        if any(re.fullmatch(pattern, n) for n in present):
            return family
    return None


def meta_model(info: CheckpointInfo, trust_remote_code: bool):
    """The model config.json describes, on the meta device (no memory, no init)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_file = info.path / "config.json"
    model_type = info.config.get("model_type")
    try:
        config = AutoConfig.from_pretrained(info.path, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        if "trust_remote_code" in str(exc):
            fix = (
                "it needs its own Python code: set model.trust_remote_code: true only if you trust its source"
            )
        elif "Unrecognized" in str(exc) or isinstance(exc, KeyError):
            fix = (
                f"model_type '{model_type}' is not a causal language model this transformers knows - "
                "LPX quantizes decoder LMs (llama, mistral, qwen2, ...): fix model_type in config.json"
            )
        else:
            fix = "fix config.json (compare it with the model's published config.json) or re-download it"
        raise LpxError(
            f"model.checkpoint: transformers cannot build the model {cfg_file} describes ({first}) - {fix}"
        ) from None


def expected_tensors(model) -> tuple[dict, dict, re.Pattern | None, re.Pattern | None]:
    """(name -> shape of every parameter and persistent buffer, tied target -> source, the missing and
    unexpected names transformers ignores, as regexes)."""
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    tied = dict(getattr(model, "all_tied_weights_keys", None) or {})
    missing_ok = set(getattr(model, "_keys_to_ignore_on_load_missing", None) or ())
    unexpected_ok = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    unexpected_ok |= {r"rotary_emb\.inv_freq", r"(^|\.)position_ids$"}  # old checkpoints' buffers

    def rx(patterns):
        return re.compile("|".join(f"({p})" for p in patterns)) if patterns else None

    return expected, tied, rx(missing_ok), rx(unexpected_ok)


def _other_model(info, present, where, found, needed, missing, unexpected) -> str:
    """The message for a config.json of another model than the weights' (bert over llama)."""
    family = weights_family(present)
    arch = info.config.get("architectures")
    return (
        f"config.json describes model_type '{info.config.get('model_type')}'"
        + (f" ({', '.join(map(str, arch))})" if isinstance(arch, list) else "")
        + f" but the weights ({where}) are "
        + (f"a {family} model's" if family else "another model's")
        + f": {found} of the {needed} tensors it needs are there (it needs e.g. "
        f"{names(missing, 2)}; the weights hold e.g. {names(unexpected or list(present), 2)}) - "
        "use the config.json that came with these weights"
        + (f" (model_type '{family.split(' ')[0]}')" if family else "")
    )


def _problems(info: CheckpointInfo, present: dict, model) -> list[str]:
    """Missing, unexpected and mis-shaped tensors of the checkpoint (present: name -> (dtype, shape, file))
    against the meta-device model's."""
    expected, tied, missing_ok, unexpected_ok = expected_tensors(model)
    prefix = getattr(model, "base_model_prefix", "")
    # a checkpoint of the base model (no "model." prefix): transformers adds the prefix on load
    renamed = {}
    for name, v in present.items():
        alt = f"{prefix}.{name}" if prefix else name
        renamed[alt if name not in expected and alt in expected else name] = v
    optional = {t for t, s in tied.items() if s in renamed or t in renamed} | {
        s for t, s in tied.items() if s in renamed or t in renamed
    }
    missing = [
        n
        for n in expected
        if n not in renamed and n not in optional and not (missing_ok and missing_ok.search(n))
    ]
    unexpected = [n for n in renamed if n not in expected and not (unexpected_ok and unexpected_ok.search(n))]
    shown = {v[2] for v in present.values()}
    where = names(shown, 2)
    found = len(expected) - len(missing)
    if expected and found < OTHER_MODEL * len(expected):
        return [_other_model(info, present, where, found, len(expected), missing, unexpected)]
    out = []
    if missing:
        untied = [n for n in missing if n in tied or n in tied.values() or n.endswith("lm_head.weight")]
        out.append(
            f"{len(missing)} tensor(s) the model needs are not in {where}: {names(missing)} - transformers "
            "would fill them with random values; re-download the checkpoint (a shard may be missing)"
            + (
                " or, if the model shares its embeddings, set tie_word_embeddings: true in config.json"
                if untied
                else ""
            )
        )
    if unexpected:
        out.append(
            f"{len(unexpected)} tensor(s) in {where} are not part of the model config.json describes: "
            f"{names(unexpected)} - the config and the weights come from different models (or versions); "
            "use the config.json that came with these weights"
        )
    bad = [
        f"{n} {renamed[n][1]} in {renamed[n][2]} (model: {expected[n]})"
        for n in renamed
        if n in expected and renamed[n][1] != expected[n]
    ]
    if bad:
        out.append(
            f"{len(bad)} tensor(s) have another shape than the model config.json describes: {names(bad, 3)} - "
            "the config and the weights come from different models; use the config.json of these weights"
        )
    return out


def check_architecture(info: CheckpointInfo) -> None:
    """architectures[0], when it is a causal-LM class transformers knows, belongs to config.json's
    model_type (LPX picks the TensorRT-LLM decoder by architecture, transformers builds by model_type)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type, arch = info.config.get("model_type"), (info.config.get("architectures") or [None])[0]
    owners = sorted(t for t, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items() if cls == arch)
    if owners and model_type not in owners and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise LpxError(
            f"model.checkpoint: {info.path / 'config.json'} says model_type '{model_type}' but architectures "
            f"['{arch}'] (model_type '{owners[0]}') - one of the two was edited: set both to the model these "
            "weights belong to, or use the config.json that came with them"
        )


def check_tensors(info: CheckpointInfo, trust_remote_code: bool) -> str:
    """Refuse, before anything is loaded, a checkpoint whose safetensors headers do not hold exactly the model
    config.json describes. Returns what was checked (for the log), or why the check was left to load time."""
    if info.pickle_only:
        return "pickle weights: checked when loaded"
    if isinstance(info.config.get("quantization_config"), dict):
        return "a pre-quantized checkpoint: its tensors are checked when loaded"
    check_architecture(info)
    model = meta_model(info, trust_remote_code)
    present = tensor_shapes(info.weights)
    from transformers.conversion_mapping import get_model_conversion_mapping

    if get_model_conversion_mapping(model, add_legacy=False) or any(LEGACY_NAMES.search(n) for n in present):
        return "transformers renames this model's tensors on load: checked when loaded"
    problems = _problems(info, present, model)
    if problems:
        raise LpxError(
            f"model.checkpoint: {info.path} does not hold the model its config.json describes, refused "
            "before loading it:\n" + "\n".join(f"  {p}" for p in problems)
        )
    return f"{len(present)} tensors match the model config.json describes"


def check_before_loading(cfg, info: CheckpointInfo) -> str:
    """What the quantize stage checks before it loads anything (once per run): the tokenizer's files and
    the checkpoint's tensors. Returns the note for the manifest. Not in the stage's `check`: the checks that
    run before any stage (memory fit, lengths) also take metadata-only stand-ins of large checkpoints."""
    m = cfg.model
    if m.tokenizer:
        check_tokenizer_files(Path(m.tokenizer), "model.tokenizer")
    else:
        check_tokenizer_files(info.path, "model.checkpoint")
    return f"integrity: {check_tensors(info, m.trust_remote_code)}"


def check_loading_info(loading: dict, path: Path) -> None:
    """What from_pretrained reports it could not load (output_loading_info=True), refused: anything missing
    was filled with random values."""
    parts = []
    for field, what in (
        ("missing_keys", "missing (filled with random values)"),
        ("unexpected_keys", "in the checkpoint but not in the model"),
        ("mismatched_keys", "of another shape than the model's"),
        ("error_msgs", "errors"),
    ):
        items = [str(k[0] if isinstance(k, tuple) else k) for k in loading.get(field) or ()]
        if items:
            parts.append(f"{len(items)} {what}: {names(items)}")
    if parts:
        raise LpxError(
            f"model.checkpoint: transformers did not load {path} completely - "
            + "; ".join(parts)
            + " - re-download the checkpoint, or use the config.json that came with these weights"
        )


# FINITE_SCAN: one torch.aminmax per floating tensor. aminmax propagates NaN (documented) and returns +-inf
# when present, so one reduction with no temporary says whether a tensor is finite; torch.isfinite(t).all()
# says the same but first writes a bool tensor as large as the weight, and is 20-40x slower on CPU.
# Measured on the CI CPU (AMD EPYC, 2 threads, shared with other jobs: load average 15-17), Llama-3.1-8B
# MLP / attention shapes: aminmax 1.1-3.3 GB/s in bf16 (2.6 GB/s in fp32), isfinite().all() 0.05-0.08 GB/s.
# Llama-3.1-8B in bf16 is 16.1 GB: about 5-15 s with aminmax (190-320 s with isfinite) on such a CPU, less
# than reading its 16 GB from disk. The stage records the time it took (results.timings.finite_scan_s).
# isfinite runs only on a tensor found non-finite, to count its bad values for the message.
def check_finite(model, path: Path) -> int:
    """Refuse NaN / inf in any floating parameter or persistent buffer, naming the tensors. Returns the
    number of tensors scanned."""
    import torch

    bad, seen = [], set()
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if id(t) in seen or not t.is_floating_point() or t.numel() == 0 or t.device.type == "meta":
                continue  # a tied weight (lm_head = embedding) is scanned once, under its first name
            seen.add(id(t))
            lo, hi = torch.aminmax(t)
            if not (torch.isfinite(lo) and torch.isfinite(hi)):
                count = int((~torch.isfinite(t)).sum())
                bad.append(f"{name} ({count} of {t.numel()} values NaN / inf)")
    if bad:
        raise LpxError(
            f"model.checkpoint: {path} has non-finite weights in {len(bad)} tensor(s): {names(bad, 3)} - "
            "the checkpoint is damaged (or was saved after a diverged training run); re-download it or use "
            "an earlier checkpoint"
        )
    return len(seen)


def calibration_error(exc: BaseException, variant: str, dtype: str) -> StageFailed | None:
    """ModelOpt's "detected nan values in amax" (an AssertionError in its max calibrator) as a message; None
    for any other error. The weights were checked finite before, so the activations overflowed."""
    text = str(exc)
    if not isinstance(exc, AssertionError) or not re.search(r"(nan|inf) values in amax", text):
        return None
    what = "NaN" if "nan values" in text else "inf"
    wider = ", or try calibration.dtype: float32" if dtype != "float32" else ""
    return StageFailed(
        f"variant '{variant}': ModelOpt met {what} in a calibration range (amax) - the weights are finite, so "
        f"the model's activations on the calibration text overflow {dtype}: check the checkpoint (weights far "
        f"outside the usual range are a damaged or mis-converted checkpoint){wider}",
        detail=f"ModelOpt: {text.splitlines()[0] if text else 'AssertionError'}",
    )
