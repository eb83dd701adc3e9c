"""Every Triton tensor LPX's models declare, in one table: names, types and dims follow upstream's
TensorRT-LLM backend (tests/contracts/tensorrtllm_backend_models.json, `latest`), for the request
tensors LPX supports. The repository stage writes configs from it; the client types requests by it."""

from __future__ import annotations

from dataclasses import dataclass


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


S, I32, U64, F32, B = "TYPE_STRING", "TYPE_INT32", "TYPE_UINT64", "TYPE_FP32", "TYPE_BOOL"
ONE = (1,)
# The request tensors of upstream's ensemble and BLS model, per contract version, every one of them
# (tests/contracts/tensorrtllm_backend_models.json; upstream's latest ensemble lists
# kv_cache_alloc_total_blocks twice, LPX once). Rows: name, dtype, dims, optional, ragged for inputs;
# name, dtype, dims for outputs. `${var}` types are filled from DEFAULT_DTYPES (or an engine's own).
ENSEMBLE_IO: dict[str, dict[str, list[tuple]]] = {
    "latest": {
        "in": [
            ("text_input", S, (1,), False, False),
            ("decoder_text_input", S, (1,), True, False),
            ("max_tokens", I32, (1,), False, False),
            ("num_return_sequences", I32, (1,), True, False),
            ("bad_words", S, (-1,), True, False),
            ("stop_words", S, (-1,), True, False),
            ("exclude_input_in_output", B, (1,), True, False),
            ("end_id", I32, (1,), True, False),
            ("pad_id", I32, (1,), True, False),
            ("top_k", I32, (1,), True, False),
            ("top_p", F32, (1,), True, False),
            ("temperature", F32, (1,), True, False),
            ("length_penalty", F32, (1,), True, False),
            ("repetition_penalty", F32, (1,), True, False),
            ("min_tokens", I32, (1,), True, False),
            ("presence_penalty", F32, (1,), True, False),
            ("frequency_penalty", F32, (1,), True, False),
            ("seed", U64, (1,), True, False),
            ("return_log_probs", B, (1,), True, False),
            ("return_context_logits", B, (1,), True, False),
            ("return_generation_logits", B, (1,), True, False),
            ("return_perf_metrics", B, (1,), True, False),
            ("return_num_input_tokens", B, (1,), True, False),
            ("return_num_output_tokens", B, (1,), True, False),
            ("beam_width", I32, (1,), True, False),
            ("stream", B, (1,), True, False),
            ("prompt_embedding_table", "TYPE_FP16", (-1, -1), True, False),
            ("prompt_table_extra_id", U64, (1,), True, False),
            ("prompt_vocab_size", I32, (1,), True, False),
            ("embedding_bias_words", S, (-1,), True, False),
            ("embedding_bias_weights", F32, (-1,), True, False),
            ("lora_task_id", U64, (1,), True, False),
            ("lora_weights", "TYPE_FP16", (-1, -1), True, True),
            ("lora_config", I32, (-1, 3), True, True),
            ("guided_decoding_guide_type", S, (1,), True, True),
            ("guided_decoding_guide", S, (1,), True, True),
        ],
        "out": [
            ("text_output", S, (-1,)),
            ("cum_log_probs", F32, (-1,)),
            ("output_log_probs", F32, (-1, -1)),
            ("context_logits", "${logits_datatype}", (-1, -1)),
            ("generation_logits", "${logits_datatype}", (-1, -1, -1)),
            ("batch_index", I32, (1,)),
            ("sequence_index", I32, (1,)),
            ("kv_cache_alloc_new_blocks", I32, (1,)),
            ("kv_cache_reused_blocks", I32, (1,)),
            ("kv_cache_alloc_total_blocks", I32, (1,)),
            ("arrival_time_ns", "TYPE_INT64", (1,)),
            ("first_scheduled_time_ns", "TYPE_INT64", (1,)),
            ("first_token_time_ns", "TYPE_INT64", (1,)),
            ("last_token_time_ns", "TYPE_INT64", (1,)),
            ("acceptance_rate", F32, (1,)),
            ("total_accepted_draft_tokens", I32, (1,)),
            ("total_draft_tokens", I32, (1,)),
            ("num_input_tokens", I32, (1,)),
            ("num_output_tokens", I32, (1,)),
        ],
    },
    "v0.16.0": {
        "in": [
            ("text_input", S, (1,), False, False),
            ("decoder_text_input", S, (1,), True, False),
            ("max_tokens", I32, (1,), False, False),
            ("num_return_sequences", I32, (1,), True, False),
            ("bad_words", S, (-1,), True, False),
            ("stop_words", S, (-1,), True, False),
            ("exclude_input_in_output", B, (1,), True, False),
            ("end_id", I32, (1,), True, False),
            ("pad_id", I32, (1,), True, False),
            ("top_k", I32, (1,), True, False),
            ("top_p", F32, (1,), True, False),
            ("temperature", F32, (1,), True, False),
            ("length_penalty", F32, (1,), True, False),
            ("repetition_penalty", F32, (1,), True, False),
            ("min_length", I32, (1,), True, False),
            ("presence_penalty", F32, (1,), True, False),
            ("frequency_penalty", F32, (1,), True, False),
            ("random_seed", U64, (1,), True, False),
            ("return_log_probs", B, (1,), True, False),
            ("return_context_logits", B, (1,), True, False),
            ("return_generation_logits", B, (1,), True, False),
            ("return_kv_cache_reuse_stats", B, (1,), True, False),
            ("beam_width", I32, (1,), True, False),
            ("stream", B, (1,), True, False),
            ("prompt_embedding_table", "TYPE_FP16", (-1, -1), True, False),
            ("prompt_table_extra_id", U64, (1,), True, False),
            ("prompt_vocab_size", I32, (1,), True, False),
            ("embedding_bias_words", S, (-1,), True, False),
            ("embedding_bias_weights", F32, (-1,), True, False),
            ("lora_task_id", U64, (1,), True, False),
            ("lora_weights", "TYPE_FP16", (-1, -1), True, True),
            ("lora_config", I32, (-1, 3), True, True),
        ],
        "out": [
            ("text_output", S, (-1,)),
            ("cum_log_probs", F32, (-1,)),
            ("output_log_probs", F32, (-1, -1)),
            ("context_logits", F32, (-1, -1)),
            ("generation_logits", F32, (-1, -1, -1)),
            ("batch_index", I32, (1,)),
            ("sequence_index", I32, (1,)),
            ("kv_cache_alloc_new_blocks", I32, (1,)),
            ("kv_cache_reused_blocks", I32, (1,)),
            ("kv_cache_alloc_total_blocks", I32, (1,)),
        ],
    },
}
BLS_IO: dict[str, dict[str, list[tuple]]] = {
    "latest": {
        "in": [
            ("text_input", S, (1,), False, False),
            ("decoder_text_input", S, (1,), True, False),
            ("image_input", "TYPE_FP16", (-1, 3, -1, -1), True, False),
            ("image_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), True, False),
            ("image_url_input", S, (1,), True, False),
            ("image_sizes_input", "TYPE_INT64", (-1, 2), True, False),
            ("video_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), True, False),
            ("max_tokens", I32, (1,), False, False),
            ("bad_words", S, (-1,), True, False),
            ("stop_words", S, (-1,), True, False),
            ("exclude_input_in_output", B, (1,), True, False),
            ("end_id", I32, (1,), True, False),
            ("pad_id", I32, (1,), True, False),
            ("top_k", I32, (1,), True, False),
            ("top_p", F32, (1,), True, False),
            ("temperature", F32, (1,), True, False),
            ("length_penalty", F32, (1,), True, False),
            ("repetition_penalty", F32, (1,), True, False),
            ("min_tokens", I32, (1,), True, False),
            ("presence_penalty", F32, (1,), True, False),
            ("frequency_penalty", F32, (1,), True, False),
            ("seed", U64, (1,), True, False),
            ("return_log_probs", B, (1,), True, False),
            ("return_context_logits", B, (1,), True, False),
            ("return_generation_logits", B, (1,), True, False),
            ("num_return_sequences", I32, (1,), True, False),
            ("beam_width", I32, (1,), True, False),
            ("stream", B, (1,), True, False),
            ("prompt_embedding_table", "${prompt_embedding_table_data_type}", (-1, -1), True, False),
            ("prompt_vocab_size", I32, (1,), True, False),
            ("prompt_table_extra_id", U64, (1,), True, False),
            ("embedding_bias_words", S, (-1,), True, False),
            ("embedding_bias_weights", F32, (-1,), True, False),
            ("num_draft_tokens", I32, (1,), True, False),
            ("use_draft_logits", B, (1,), True, False),
            ("lora_task_id", U64, (1,), True, False),
            ("lora_weights", "TYPE_FP16", (-1, -1), True, True),
            ("lora_config", I32, (-1, 3), True, True),
            ("return_perf_metrics", B, (1,), True, False),
            ("return_num_input_tokens", B, (1,), True, False),
            ("return_num_output_tokens", B, (1,), True, False),
            ("guided_decoding_guide_type", S, (1,), True, False),
            ("guided_decoding_guide", S, (1,), True, False),
        ],
        "out": [
            ("text_output", S, (-1,)),
            ("cum_log_probs", F32, (-1,)),
            ("output_log_probs", F32, (-1, -1)),
            ("context_logits", "${logits_datatype}", (-1, -1)),
            ("generation_logits", "${logits_datatype}", (-1, -1, -1)),
            ("batch_index", I32, (1,)),
            ("sequence_index", I32, (1,)),
            ("kv_cache_alloc_new_blocks", I32, (1,)),
            ("kv_cache_reused_blocks", I32, (1,)),
            ("kv_cache_alloc_total_blocks", I32, (1,)),
            ("arrival_time_ns", "TYPE_INT64", (1,)),
            ("first_scheduled_time_ns", "TYPE_INT64", (1,)),
            ("first_token_time_ns", "TYPE_INT64", (1,)),
            ("last_token_time_ns", "TYPE_INT64", (1,)),
            ("acceptance_rate", F32, (1,)),
            ("total_accepted_draft_tokens", I32, (1,)),
            ("total_draft_tokens", I32, (1,)),
            ("num_input_tokens", I32, (1,)),
            ("num_output_tokens", I32, (1,)),
        ],
    },
    "v0.16.0": {
        "in": [
            ("text_input", S, (1,), False, False),
            ("decoder_text_input", S, (1,), True, False),
            ("image_input", "TYPE_FP16", (-1, 3, -1, -1), True, False),
            ("image_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), True, False),
            ("image_url_input", S, (1,), True, False),
            ("video_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), True, False),
            ("max_tokens", I32, (1,), False, False),
            ("bad_words", S, (-1,), True, False),
            ("stop_words", S, (-1,), True, False),
            ("exclude_input_in_output", B, (1,), True, False),
            ("end_id", I32, (1,), True, False),
            ("pad_id", I32, (1,), True, False),
            ("top_k", I32, (1,), True, False),
            ("top_p", F32, (1,), True, False),
            ("temperature", F32, (1,), True, False),
            ("length_penalty", F32, (1,), True, False),
            ("repetition_penalty", F32, (1,), True, False),
            ("min_length", I32, (1,), True, False),
            ("presence_penalty", F32, (1,), True, False),
            ("frequency_penalty", F32, (1,), True, False),
            ("random_seed", U64, (1,), True, False),
            ("return_log_probs", B, (1,), True, False),
            ("return_context_logits", B, (1,), True, False),
            ("return_generation_logits", B, (1,), True, False),
            ("num_return_sequences", I32, (1,), True, False),
            ("beam_width", I32, (1,), True, False),
            ("stream", B, (1,), True, False),
            ("prompt_embedding_table", "TYPE_FP16", (-1, -1), True, False),
            ("prompt_vocab_size", I32, (1,), True, False),
            ("prompt_table_extra_id", U64, (1,), True, False),
            ("embedding_bias_words", S, (-1,), True, False),
            ("embedding_bias_weights", F32, (-1,), True, False),
            ("num_draft_tokens", I32, (1,), True, False),
            ("use_draft_logits", B, (1,), True, False),
            ("lora_task_id", U64, (1,), True, False),
            ("lora_weights", "TYPE_FP16", (-1, -1), True, True),
            ("lora_config", I32, (-1, 3), True, True),
            ("return_kv_cache_reuse_stats", B, (1,), True, False),
        ],
        "out": [
            ("text_output", S, (-1,)),
            ("cum_log_probs", F32, (-1,)),
            ("output_log_probs", F32, (-1, -1)),
            ("context_logits", F32, (-1, -1)),
            ("generation_logits", F32, (-1, -1, -1)),
            ("batch_index", I32, (1,)),
            ("sequence_index", I32, (1,)),
            ("kv_cache_alloc_new_blocks", I32, (1,)),
            ("kv_cache_reused_blocks", I32, (1,)),
            ("kv_cache_alloc_total_blocks", I32, (1,)),
        ],
    },
}

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


# The `tensorrt_llm` model of upstream's backend (engine target), per contract version: every input
# and output, as tests/contracts/tensorrtllm_backend_models.json lists them. `${var}` data types are
# template variables that pipeline/stages/repository/engine_repo.py fills. Rows: name, dtype, dims, optional,
# reshape, ragged. The two versions share most rows on purpose: each list is a transcription of that
# version's upstream config.pbtxt, in its order, kept whole so it can be checked against the contract
# line by line (a `duplicates` run lists the pair; deriving one from the other would hide the differences).
TRTLLM_IO: dict[str, dict[str, list[tuple]]] = {
    "latest": {
        "in": [
            ("input_ids", I32, (-1,), True, None, True),
            ("encoder_input_features", "${encoder_input_features_data_type}", (-1, -1), True, None, True),
            ("encoder_output_lengths", I32, (1,), True, (), False),
            ("input_lengths", I32, (1,), False, (), False),
            ("request_output_len", I32, (1,), False, (), False),
            ("num_return_sequences", I32, (1,), True, (), False),
            ("draft_input_ids", I32, (-1,), True, None, True),
            ("decoder_input_ids", I32, (-1,), True, None, True),
            ("decoder_input_lengths", I32, (1,), True, (), False),
            ("draft_logits", "${logits_datatype}", (-1, -1), True, None, True),
            ("draft_acceptance_threshold", F32, (1,), True, (), False),
            ("end_id", I32, (1,), True, (), False),
            ("pad_id", I32, (1,), True, (), False),
            ("stop_words_list", I32, (2, -1), True, None, True),
            ("bad_words_list", I32, (2, -1), True, None, True),
            ("embedding_bias", F32, (-1,), True, None, True),
            ("beam_width", I32, (1,), True, (), False),
            ("temperature", F32, (1,), True, (), False),
            ("runtime_top_k", I32, (1,), True, (), False),
            ("runtime_top_p", F32, (1,), True, (), False),
            ("runtime_top_p_min", F32, (1,), True, (), False),
            ("runtime_top_p_decay", F32, (1,), True, (), False),
            ("runtime_top_p_reset_ids", I32, (1,), True, (), False),
            ("len_penalty", F32, (1,), True, (), False),
            ("early_stopping", B, (1,), True, (), False),
            ("repetition_penalty", F32, (1,), True, (), False),
            ("min_tokens", I32, (1,), True, (), False),
            ("beam_search_diversity_rate", F32, (1,), True, (), False),
            ("presence_penalty", F32, (1,), True, (), False),
            ("frequency_penalty", F32, (1,), True, (), False),
            ("seed", U64, (1,), True, (), False),
            ("return_log_probs", B, (1,), True, (), False),
            ("return_context_logits", B, (1,), True, (), False),
            ("return_generation_logits", B, (1,), True, (), False),
            ("return_perf_metrics", B, (1,), True, (), False),
            ("return_num_input_tokens", B, (1,), True, (), False),
            ("return_num_output_tokens", B, (1,), True, (), False),
            ("exclude_input_in_output", B, (1,), True, (), False),
            ("stop", B, (1,), True, (), False),
            ("streaming", B, (1,), True, (), False),
            ("prompt_embedding_table", "${prompt_embedding_table_data_type}", (-1, -1), True, None, True),
            ("prompt_table_extra_ids", U64, (-1,), True, None, True),
            ("prompt_vocab_size", I32, (1,), True, (), False),
            ("cross_attention_mask", B, (-1, -1), True, None, True),
            ("mrope_rotary_cos_sin", F32, (-1,), True, None, False),
            ("mrope_position_deltas", "TYPE_INT64", (1,), True, None, False),
            ("lora_task_id", U64, (1,), True, (), False),
            ("lora_weights", "TYPE_FP16", (-1, -1), True, None, True),
            ("lora_config", I32, (-1, 3), True, None, True),
            ("context_phase_params", "TYPE_UINT8", (-1,), True, None, True),
            ("skip_cross_attn_blocks", B, (1,), True, None, True),
            ("retention_token_range_starts", I32, (-1,), True, None, True),
            ("retention_token_range_ends", I32, (-1,), True, None, True),
            ("retention_token_range_priorities", I32, (-1,), True, None, True),
            ("retention_token_range_durations_ms", I32, (-1,), True, None, True),
            ("retention_decode_priority", I32, (1,), True, None, True),
            ("retention_decode_duration_ms", I32, (1,), True, None, True),
            ("guided_decoding_guide_type", S, (1,), True, None, True),
            ("guided_decoding_guide", S, (1,), True, None, True),
            ("lookahead_window_size", I32, (1,), True, None, True),
            ("lookahead_ngram_size", I32, (1,), True, None, True),
            ("lookahead_verification_set_size", I32, (1,), True, None, True),
        ],
        "out": [
            ("output_ids", I32, (-1, -1), False, None, False),
            ("sequence_length", I32, (-1,), False, None, False),
            ("cum_log_probs", F32, (-1,), False, None, False),
            ("output_log_probs", F32, (-1, -1), False, None, False),
            ("context_logits", "${logits_datatype}", (-1, -1), False, None, False),
            ("generation_logits", "${logits_datatype}", (-1, -1, -1), False, None, False),
            ("batch_index", I32, (1,), False, None, False),
            ("sequence_index", I32, (1,), False, None, False),
            ("context_phase_params", "TYPE_UINT8", (-1,), False, None, False),
            ("kv_cache_alloc_new_blocks", I32, (1,), False, None, False),
            ("kv_cache_reused_blocks", I32, (1,), False, None, False),
            ("kv_cache_alloc_total_blocks", I32, (1,), False, None, False),
            ("arrival_time_ns", "TYPE_INT64", (1,), False, None, False),
            ("first_scheduled_time_ns", "TYPE_INT64", (1,), False, None, False),
            ("first_token_time_ns", "TYPE_INT64", (1,), False, None, False),
            ("last_token_time_ns", "TYPE_INT64", (1,), False, None, False),
            ("acceptance_rate", F32, (1,), False, None, False),
            ("total_accepted_draft_tokens", I32, (1,), False, None, False),
            ("total_draft_tokens", I32, (1,), False, None, False),
            ("num_input_tokens", I32, (1,), False, None, False),
            ("num_output_tokens", I32, (1,), False, None, False),
        ],
    },
    "v0.16.0": {
        "in": [
            ("input_ids", I32, (-1,), True, None, True),
            ("encoder_input_features", "${encoder_input_features_data_type}", (-1, -1), True, None, True),
            ("encoder_output_lengths", I32, (1,), True, (), False),
            ("input_lengths", I32, (1,), False, (), False),
            ("request_output_len", I32, (1,), False, (), False),
            ("num_return_sequences", I32, (1,), True, (), False),
            ("draft_input_ids", I32, (-1,), True, None, True),
            ("decoder_input_ids", I32, (-1,), True, None, True),
            ("decoder_input_lengths", I32, (1,), True, (), False),
            ("draft_logits", F32, (-1, -1), True, None, True),
            ("draft_acceptance_threshold", F32, (1,), True, (), False),
            ("end_id", I32, (1,), True, (), False),
            ("pad_id", I32, (1,), True, (), False),
            ("stop_words_list", I32, (2, -1), True, None, True),
            ("bad_words_list", I32, (2, -1), True, None, True),
            ("embedding_bias", F32, (-1,), True, None, True),
            ("beam_width", I32, (1,), True, (), False),
            ("temperature", F32, (1,), True, (), False),
            ("runtime_top_k", I32, (1,), True, (), False),
            ("runtime_top_p", F32, (1,), True, (), False),
            ("runtime_top_p_min", F32, (1,), True, (), False),
            ("runtime_top_p_decay", F32, (1,), True, (), False),
            ("runtime_top_p_reset_ids", I32, (1,), True, (), False),
            ("len_penalty", F32, (1,), True, (), False),
            ("early_stopping", B, (1,), True, (), False),
            ("repetition_penalty", F32, (1,), True, (), False),
            ("min_length", I32, (1,), True, (), False),
            ("beam_search_diversity_rate", F32, (1,), True, (), False),
            ("presence_penalty", F32, (1,), True, (), False),
            ("frequency_penalty", F32, (1,), True, (), False),
            ("random_seed", U64, (1,), True, (), False),
            ("return_log_probs", B, (1,), True, (), False),
            ("return_context_logits", B, (1,), True, (), False),
            ("return_generation_logits", B, (1,), True, (), False),
            ("return_kv_cache_reuse_stats", B, (1,), True, (), False),
            ("exclude_input_in_output", B, (1,), True, (), False),
            ("stop", B, (1,), True, (), False),
            ("streaming", B, (1,), True, (), False),
            ("prompt_embedding_table", "TYPE_FP16", (-1, -1), True, None, True),
            ("prompt_table_extra_ids", U64, (-1,), True, None, True),
            ("prompt_vocab_size", I32, (1,), True, (), False),
            ("cross_attention_mask", B, (-1, -1), True, None, True),
            ("lora_task_id", U64, (1,), True, (), False),
            ("lora_weights", "TYPE_FP16", (-1, -1), True, None, True),
            ("lora_config", I32, (-1, 3), True, None, True),
            ("context_phase_params", "TYPE_UINT8", (-1,), True, None, True),
            ("skip_cross_attn_blocks", B, (1,), True, None, True),
        ],
        "out": [
            ("output_ids", I32, (-1, -1), False, None, False),
            ("sequence_length", I32, (-1,), False, None, False),
            ("cum_log_probs", F32, (-1,), False, None, False),
            ("output_log_probs", F32, (-1, -1), False, None, False),
            ("context_logits", F32, (-1, -1), False, None, False),
            ("generation_logits", F32, (-1, -1, -1), False, None, False),
            ("batch_index", I32, (1,), False, None, False),
            ("sequence_index", I32, (1,), False, None, False),
            ("context_phase_params", "TYPE_UINT8", (-1,), False, None, False),
            ("kv_cache_alloc_new_blocks", I32, (1,), False, None, False),
            ("kv_cache_reused_blocks", I32, (1,), False, None, False),
            ("kv_cache_alloc_total_blocks", I32, (1,), False, None, False),
        ],
    },
}


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
