"""Every Triton tensor LPX's models declare, in one table: names, types and dims follow upstream's
TensorRT-LLM backend (shared/contracts/tensorrtllm_backend_models.json, `latest`), for the request
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
# name, dtype, dims, optional, reshape, ragged - upstream's values (tensorrtllm_backend_models.json)
TENSORS: list[Spec] = [
    *_specs("ensemble", "in", [
        ("text_input", S, ONE), ("max_tokens", I32, ONE),
        ("bad_words", S, (-1,), True), ("stop_words", S, (-1,), True),
        ("exclude_input_in_output", B, ONE, True), ("end_id", I32, ONE, True), ("pad_id", I32, ONE, True),
        ("top_k", I32, ONE, True), ("top_p", F32, ONE, True), ("temperature", F32, ONE, True),
        ("seed", U64, ONE, True), ("stream", B, ONE, True),
    ]),
    *_specs("ensemble", "out", [("text_output", S, (-1,))]),
    *_specs("preprocessing", "in", [
        ("QUERY", S, ONE), ("REQUEST_OUTPUT_LEN", I32, ONE),
        ("BAD_WORDS_DICT", S, (-1,), True), ("STOP_WORDS_DICT", S, (-1,), True),
        ("END_ID", I32, ONE, True), ("PAD_ID", I32, ONE, True),
    ]),
    *_specs("preprocessing", "out", [
        ("INPUT_ID", I32, (-1,)), ("REQUEST_INPUT_LEN", I32, ONE), ("BAD_WORDS_IDS", I32, (2, -1)),
        ("STOP_WORDS_IDS", I32, (2, -1)), ("REQUEST_OUTPUT_LEN", I32, (-1,)),
        ("OUT_END_ID", I32, ONE), ("OUT_PAD_ID", I32, ONE),
    ]),
    *_specs("tensorrt_llm", "in", [
        ("input_ids", I32, (-1,), False, None, True), ("input_lengths", I32, ONE, False, ()),
        ("request_output_len", I32, ONE, False, ()),
        ("end_id", I32, ONE, True, ()), ("pad_id", I32, ONE, True, ()),
        ("stop_words_list", I32, (2, -1), True, None, True), ("bad_words_list", I32, (2, -1), True, None, True),
        ("temperature", F32, ONE, True, ()), ("runtime_top_k", I32, ONE, True, ()),
        ("runtime_top_p", F32, ONE, True, ()), ("seed", U64, ONE, True, ()),
        ("exclude_input_in_output", B, ONE, True, ()), ("streaming", B, ONE, True, ()),
    ]),
    *_specs("tensorrt_llm", "out", [("output_ids", I32, (-1, -1)), ("sequence_length", I32, (-1,))]),
    *_specs("postprocessing", "in", [("TOKENS_BATCH", I32, (-1, -1)), ("SEQUENCE_LENGTH", I32, (-1,))]),
    *_specs("postprocessing", "out", [("OUTPUT", S, (-1,))]),
]


def specs(model: str, io: str) -> list[Spec]:
    return [s for s in TENSORS if s.model == model and s.io == io]


def triton_dtype(model: str, name: str) -> str | None:
    """The client-side datatype ("INT32", "BYTES", ...) of one input, or None if the model has no such input."""
    for s in specs(model, "in"):
        if s.name == name:
            return "BYTES" if s.dtype == "TYPE_STRING" else s.dtype[len("TYPE_"):]
    return None
