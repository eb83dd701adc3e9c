"""Every Triton tensor LPX's models declare, in one table: names, types and dims follow upstream's
TensorRT-LLM backend (tests/contracts/tensorrtllm_backend_models.json, `latest`), for the request
tensors LPX supports. The repository stage writes configs from it; the client types requests by it."""

from __future__ import annotations

from dataclasses import dataclass

from .upstream_io import BLS_IO, ENSEMBLE_IO, F32, I32, ONE, U64, B, S
from .upstream_trtllm import TRTLLM_IO


@dataclass(frozen=True)
class Spec:
    """One input or output tensor of one model."""

    model: str
    io: str  # "in" | "out"
    name: str
    dtype: str  # Triton DataType name
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None  # () = scalar per batch item, as upstream declares
    ragged: bool = False


def _specs(model: str, io: str, rows: list[tuple]) -> list[Spec]:
    return [Spec(model, io, *row) for row in rows]


DEFAULT_DTYPES = {
    "logits_datatype": "TYPE_FP32",
    "prompt_embedding_table_data_type": "TYPE_FP16",
    "encoder_input_features_data_type": "TYPE_FP16",
}
# ensemble / BLS input -> the `tensorrt_llm` input it feeds directly (upstream's ensemble steps; the
# rest go through preprocessing). v0.16's names differ for two of them.
ENGINE_INPUT_NAMES = {
    "latest": {
        "exclude_input_in_output": "exclude_input_in_output",
        "top_k": "runtime_top_k",
        "top_p": "runtime_top_p",
        "temperature": "temperature",
        "length_penalty": "len_penalty",
        "repetition_penalty": "repetition_penalty",
        "min_tokens": "min_tokens",
        "presence_penalty": "presence_penalty",
        "frequency_penalty": "frequency_penalty",
        "seed": "seed",
        "return_log_probs": "return_log_probs",
        "return_context_logits": "return_context_logits",
        "return_generation_logits": "return_generation_logits",
        "return_perf_metrics": "return_perf_metrics",
        "return_num_input_tokens": "return_num_input_tokens",
        "return_num_output_tokens": "return_num_output_tokens",
        "num_return_sequences": "num_return_sequences",
        "beam_width": "beam_width",
        "stream": "streaming",
        "prompt_embedding_table": "prompt_embedding_table",
        "prompt_vocab_size": "prompt_vocab_size",
        "lora_task_id": "lora_task_id",
        "lora_weights": "lora_weights",
        "lora_config": "lora_config",
        "guided_decoding_guide_type": "guided_decoding_guide_type",
        "guided_decoding_guide": "guided_decoding_guide",
    },
}
ENGINE_INPUT_NAMES["v0.16.0"] = {
    **{
        k: v
        for k, v in ENGINE_INPUT_NAMES["latest"].items()
        if not k.startswith(("guided_", "return_perf", "return_num_")) and k not in ("min_tokens", "seed")
    },
    "min_length": "min_length",
    "random_seed": "random_seed",
    "return_kv_cache_reuse_stats": "return_kv_cache_reuse_stats",
}
# ensemble / BLS input -> preprocessing input (upstream's ensemble step)
PREPROCESSING_INPUT_NAMES = {
    "text_input": "QUERY",
    "decoder_text_input": "DECODER_QUERY",
    "max_tokens": "REQUEST_OUTPUT_LEN",
    "bad_words": "BAD_WORDS_DICT",
    "stop_words": "STOP_WORDS_DICT",
    "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
    "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS",
    "end_id": "END_ID",
    "pad_id": "PAD_ID",
    "prompt_table_extra_id": "PROMPT_TABLE_EXTRA_ID",
}


# preprocessing output -> (the ensemble's internal tensor, upstream's name; the tensorrt_llm input it feeds)
PRE_TO_ENGINE = {
    "INPUT_ID": ("_INPUT_ID", "input_ids"),
    "REQUEST_INPUT_LEN": ("_REQUEST_INPUT_LEN", "input_lengths"),
    "REQUEST_OUTPUT_LEN": ("_REQUEST_OUTPUT_LEN", "request_output_len"),
    "STOP_WORDS_IDS": ("_STOP_WORDS_IDS", "stop_words_list"),
    "BAD_WORDS_IDS": ("_BAD_WORDS_IDS", "bad_words_list"),
    "EMBEDDING_BIAS": ("_EMBEDDING_BIAS", "embedding_bias"),
    "OUT_END_ID": ("_PREPROCESSOR_END_ID", "end_id"),
    "OUT_PAD_ID": ("_PREPROCESSOR_PAD_ID", "pad_id"),
    "OUT_PROMPT_TABLE_EXTRA_IDS": ("_OUT_PROMPT_TABLE_EXTRA_IDS", "prompt_table_extra_ids"),
}


def request_specs(model: str, version: str, io: str, dtypes: dict[str, str] | None = None) -> list[Spec]:
    """The ensemble's or the BLS model's tensors at one contract version, `${var}` types filled."""
    table = {"ensemble": ENSEMBLE_IO, "tensorrt_llm_bls": BLS_IO}[model][version][io]
    fill = {**DEFAULT_DTYPES, **(dtypes or {})}
    out = []
    for row in table:
        name, dtype, dims = row[:3]
        dtype = fill[dtype[2:-1]] if dtype.startswith("${") else dtype
        if io == "in":
            out.append(Spec(model, io, name, dtype, dims, row[3], None, row[4]))
        else:
            out.append(Spec(model, io, name, dtype, dims))
    return out


TENSORS: list[Spec] = [
    *request_specs("ensemble", "latest", "in"),
    *request_specs("ensemble", "latest", "out"),
    *request_specs("tensorrt_llm_bls", "latest", "in"),
    *request_specs("tensorrt_llm_bls", "latest", "out"),
    *_specs(
        "preprocessing",
        "in",
        [
            ("QUERY", S, ONE),
            ("DECODER_QUERY", S, ONE, True),
            ("REQUEST_OUTPUT_LEN", I32, ONE),
            ("BAD_WORDS_DICT", S, (-1,), True),
            ("STOP_WORDS_DICT", S, (-1,), True),
            ("EMBEDDING_BIAS_WORDS", S, (-1,), True),
            ("EMBEDDING_BIAS_WEIGHTS", F32, (-1,), True),
            ("END_ID", I32, ONE, True),
            ("PAD_ID", I32, ONE, True),
            ("PROMPT_TABLE_EXTRA_ID", U64, ONE, True),
        ],
    ),
    *_specs(
        "preprocessing",
        "out",
        [
            ("INPUT_ID", I32, (-1,)),
            ("REQUEST_INPUT_LEN", I32, ONE),
            ("BAD_WORDS_IDS", I32, (2, -1)),
            ("STOP_WORDS_IDS", I32, (2, -1)),
            ("EMBEDDING_BIAS", F32, (-1,)),
            ("REQUEST_OUTPUT_LEN", I32, (-1,)),
            ("OUT_END_ID", I32, ONE),
            ("OUT_PAD_ID", I32, ONE),
            ("OUT_PROMPT_TABLE_EXTRA_IDS", U64, (-1,)),
        ],
    ),
    *_specs("postprocessing", "in", [("TOKENS_BATCH", I32, (-1, -1)), ("SEQUENCE_LENGTH", I32, (-1,))]),
    *_specs("postprocessing", "out", [("OUTPUT", S, (-1,))]),
]


def specs(model: str, io: str) -> list[Spec]:
    return [s for s in TENSORS if s.model == model and s.io == io]


def triton_dtype(model: str, name: str) -> str | None:
    """The client-side datatype ("INT32", "BYTES", ...) of one input, or None if the model has no such input."""
    for s in specs(model, "in"):
        if s.name == name:
            return "BYTES" if s.dtype == "TYPE_STRING" else s.dtype[len("TYPE_") :]
    return None


def trtllm_specs(version: str, io: str, dtypes: dict[str, str]) -> list[Spec]:
    """The engine target's `tensorrt_llm` tensors for one contract version, `${var}` types filled from dtypes."""
    rows = TRTLLM_IO[version][io]
    return [
        Spec(
            "tensorrt_llm",
            io,
            name,
            dtypes[dt[2:-1]] if dt.startswith("${") else dt,
            dims,
            opt,
            reshape,
            ragged,
        )
        for name, dt, dims, opt, reshape, ragged in rows
    ]


# LPX's own `tensorrt_llm` python models (torch and llmapi targets) declare every input and output of
# upstream's latest one, so the ensemble passes the whole request language through.
TENSORS += [*trtllm_specs("latest", "in", DEFAULT_DTYPES), *trtllm_specs("latest", "out", DEFAULT_DTYPES)]
# LPX's extension of them (not upstream's): the k most likely tokens per generated token and their log
# probs, asked with top_log_probs_k (with return_log_probs), returned as [beams, tokens, k]; the
# OpenAI gateway's top_logprobs (pipeline/gateway/triton.py). The engine target's C++ model lacks them.
LPX_TRTLLM = [
    Spec("tensorrt_llm", "in", "top_log_probs_k", I32, ONE, True, ()),
    Spec("tensorrt_llm", "out", "top_log_probs", F32, (-1, -1, -1)),
    Spec("tensorrt_llm", "out", "top_log_prob_ids", I32, (-1, -1, -1)),
]
TENSORS += LPX_TRTLLM

# LPX's addition to upstream's preprocessing: the request's scalar sampling inputs, under their ensemble
# names, read only to validate them (pipeline/runtime/validate.py) before any engine work - the ensemble
# feeds each of them to preprocessing as well as to tensorrt_llm, so the `engine` target's C++ model
# gets only requests that passed the same checks as LPX's python engines.
VALIDATED_INPUTS: dict[str, list[tuple]] = {
    version: [
        row
        for row in ENSEMBLE_IO[version]["in"]
        if row[0] in ENGINE_INPUT_NAMES[version] and row[2] == (1,) and row[1] in (I32, U64, F32, B)
    ]
    for version in ENSEMBLE_IO
}


def preprocessing_specs(version: str, io: str) -> list[Spec]:
    """Upstream's preprocessing tensors LPX implements, plus (inputs) the validated sampling inputs."""
    base = specs("preprocessing", io)
    if io == "out":
        return base
    return base + [
        Spec("preprocessing", "in", row[0], row[1], row[2], True) for row in VALIDATED_INPUTS[version]
    ]
