"""The `engine` target's `tensorrt_llm` model: upstream's C++ `tensorrtllm` backend serving a
trtllm-build engine folder (config.json + rank*.engine), hard-linked into `tensorrt_llm/1/engine`.

Everything here follows tests/contracts/tensorrtllm_backend_models.json (the contract version is
picked from build.trtllm_version): backend `tensorrtllm`, decoupled (streaming), every input and
output of upstream's `tensorrt_llm` model (pipeline/runtime/tensors.py TRTLLM_IO), and only `parameters`
keys the contract lists for that version. Keys LPX does not set are left out (the backend falls back
to its defaults); the contract's required ones (gpt_model_type, gpt_model_path) are always set.

gpt_model_path is the ABSOLUTE path of the repository's copy of the engine: the contract does not
say the C++ backend resolves a relative path against the model folder (it is used as given, i.e.
relative to tritonserver's working directory), so moving the repository means rerunning 'lpx repo'.

Guided decoding: where the contract version's backend reads them (`latest`; the v0.16.0 backend has no
such parameters), `guided_decoding_backend: xgrammar` and `xgrammar_tokenizer_info_path`, the ABSOLUTE
path (as gpt_model_path) of the tokenizer info LPX writes beside the engine (xgrammar_info.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from ...config import Config
from ...errors import LpxError
from ...facts import trtllm
from ...runtime.tensors import TRTLLM_IO, trtllm_specs
from .pbtxt import declare
from .proto import mc

# Knobs (module constants for now; to move into lpx.yaml's config later).
KV_CACHE_FREE_GPU_MEM_FRACTION = 0.9
ENABLE_CHUNKED_CONTEXT = False  # True needs an engine built with use_paged_context_fmha
ENABLE_KV_CACHE_REUSE = False  # the v0.19 C++ backend defaults to true when unset: LPX says so explicitly
BATCH_SCHEDULER_POLICY = "guaranteed_no_evict"  # or "max_utilization" (needs use_paged_context_fmha)
EXCLUDE_INPUT_IN_OUTPUT = True  # as LPX's torch engine: outputs hold the generated tokens only
MAX_BEAM_WIDTH = 1
DECODING_MODE = "top_k_top_p"  # the backend's default for max_beam_width 1, written out
DECOUPLED = True  # model_transaction_policy.decoupled: one response per generated-token delta
STREAMING = True  # clients may send stream=true; the contract requires decoupled for it
MAX_QUEUE_DELAY_MICROSECONDS = 0  # fill_template.py's implicit default
MAX_QUEUE_SIZE = 0  # fill_template.py's implicit default
GUIDED_DECODING_BACKEND = "xgrammar"  # the only value the C++ backend accepts (any other throws)
# Structural data-type template variables (Triton enum names).
DATA_TYPES = {
    "logits_datatype": "TYPE_FP32",
    "encoder_input_features_data_type": "TYPE_FP16",
    "prompt_embedding_table_data_type": "TYPE_FP16",
}  # FP16: the ensemble's prompt_embedding_table type
BATCH_SCHEDULER_POLICIES = ("max_utilization", "guaranteed_no_evict")

# Every `parameters` key of upstream's tensorrt_llm/config.pbtxt, per contract version.
_COMMON_KEYS = (
    "max_beam_width",
    "FORCE_CPU_ONLY_INPUT_TENSORS",
    "gpt_model_type",
    "gpt_model_path",
    "encoder_model_path",
    "max_tokens_in_paged_kv_cache",
    "max_attention_window_size",
    "sink_token_length",
    "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction",
    "cross_kv_cache_fraction",
    "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks",
    "exclude_input_in_output",
    "cancellation_check_period_ms",
    "stats_check_period_ms",
    "iter_stats_max_iterations",
    "request_stats_max_iterations",
    "enable_kv_cache_reuse",
    "normalize_log_probs",
    "enable_chunked_context",
    "gpu_device_ids",
    "participant_ids",
    "lora_cache_optimal_adapter_size",
    "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes",
    "decoding_mode",
    "executor_worker_path",
    "medusa_choices",
    "eagle_choices",
    "gpu_weights_percent",
    "enable_context_fmha_fp32_acc",
    "multi_block_mode",
    "cuda_graph_mode",
    "cuda_graph_cache_size",
    "speculative_decoding_fast_logits",
)
PARAMETER_KEYS: dict[str, frozenset[str]] = {
    "v0.16.0": frozenset(_COMMON_KEYS),
    "latest": frozenset(_COMMON_KEYS)
    | {
        "num_nodes",
        "lora_prefetch_dir",
        "lookahead_window_size",
        "lookahead_ngram_size",
        "lookahead_verification_set_size",
        "tokenizer_dir",
        "guided_decoding_backend",
        "xgrammar_tokenizer_info_path",
    },
}
# Fixed values of upstream's template (no template variable).
FIXED = {
    "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
    "executor_worker_path": "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker",
}


def check_batch_fits(cfg: Config, built: object, what: str) -> None:
    """Triton's max_batch_size (build.max_batch_size) must not exceed what the build was made for (`what`
    names that value in the build, e.g. "the engine's build_config.max_batch_size")."""
    if built is not None and cfg.build.max_batch_size > int(built):
        raise LpxError(
            f"Triton max_batch_size {cfg.build.max_batch_size} (build.max_batch_size) exceeds {what} "
            f"{built} - lower build.max_batch_size to {built} or rebuild with 'lpx build'"
        )


def counts_tokens(cfg: Config) -> bool:
    """Whether the targeted backend's tensorrt_llm model has return_num_output_tokens/num_output_tokens."""
    version = trtllm.contract_version(cfg.build.trtllm_version)
    return any(row[0] == "num_output_tokens" for row in TRTLLM_IO[version]["out"])


def _bool(value: bool) -> str:
    return "true" if value else "false"


def takes_guides(cfg: Config) -> bool:
    """Whether the targeted backend's tensorrt_llm model reads the guided-decoding parameters."""
    return "guided_decoding_backend" in PARAMETER_KEYS[trtllm.contract_version(cfg.build.trtllm_version)]


def parameters(cfg: Config, engine_path: Path, tokenizer_info: Path | None = None) -> dict[str, str]:
    """The tensorrt_llm model's parameters for cfg's contract version (only keys that version lists);
    engine_path: the absolute path of the repository's copy of the engine; tokenizer_info: the absolute
    path of the xgrammar tokenizer info (None: guided decoding stays off)."""
    version = trtllm.contract_version(cfg.build.trtllm_version)
    if BATCH_SCHEDULER_POLICY not in BATCH_SCHEDULER_POLICIES:
        raise LpxError(
            f"batch_scheduler_policy '{BATCH_SCHEDULER_POLICY}' is not one of "
            f"{', '.join(BATCH_SCHEDULER_POLICIES)}"
        )
    if not 0 < KV_CACHE_FREE_GPU_MEM_FRACTION <= 1:
        raise LpxError(f"kv_cache_free_gpu_mem_fraction {KV_CACHE_FREE_GPU_MEM_FRACTION} must be in (0, 1]")
    params = {
        **FIXED,
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str(engine_path),
        "max_beam_width": str(MAX_BEAM_WIDTH),
        "decoding_mode": DECODING_MODE,
        "batch_scheduler_policy": BATCH_SCHEDULER_POLICY,
        "kv_cache_free_gpu_mem_fraction": str(KV_CACHE_FREE_GPU_MEM_FRACTION),
        "enable_chunked_context": _bool(ENABLE_CHUNKED_CONTEXT),
        "enable_kv_cache_reuse": _bool(ENABLE_KV_CACHE_REUSE),
        "exclude_input_in_output": _bool(EXCLUDE_INPUT_IN_OUTPUT),
    }
    if tokenizer_info is not None:
        params["guided_decoding_backend"] = GUIDED_DECODING_BACKEND
        params["xgrammar_tokenizer_info_path"] = str(tokenizer_info)
    unknown = set(params) - PARAMETER_KEYS[version]
    if unknown:  # a programming error: never write a key the targeted backend does not read
        raise LpxError(f"tensorrt_llm parameters {sorted(unknown)} are not in backend {version}")
    return params


def read_engine_config(engine_dir: Path) -> dict:
    """The trtllm-build engine folder's config.json (and a check that it has rank*.engine files)."""
    engine_dir = Path(engine_dir)
    try:
        engine = json.loads((engine_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise LpxError(
            f"{engine_dir} is not a TensorRT-LLM engine folder (no readable config.json: {exc}) - "
            "rebuild it with 'lpx build' (build.target: engine)"
        ) from None
    if (
        not isinstance(engine, dict)
        or not isinstance(engine.get("build_config"), dict)
        or not list(engine_dir.glob("rank*.engine"))
    ):
        raise LpxError(
            f"{engine_dir} is not a TensorRT-LLM engine folder (needs config.json with "
            "build_config and rank*.engine) - rebuild it with 'lpx build' (build.target: engine)"
        )
    return engine


def _enabled(value) -> bool:
    return value is True or (isinstance(value, str) and value.lower() in ("enable", "true", "1"))


def check_engine(
    engine: dict,
    cfg: Config,
    *,
    decoupled: bool = DECOUPLED,
    streaming: bool = STREAMING,
    chunked_context: bool = ENABLE_CHUNKED_CONTEXT,
    policy: str = BATCH_SCHEDULER_POLICY,
) -> None:
    """Cross-checks of the Triton config against the engine's config.json; raises LpxError naming both."""
    build = engine.get("build_config", {})
    built_version = str(engine.get("version", ""))
    want = cfg.build.trtllm_version
    if built_version and built_version != want and not built_version.startswith(want + "."):
        raise LpxError(
            f"The engine was built by TensorRT-LLM {built_version} but build.trtllm_version is "
            f"{want} - rebuild the engine with 'lpx build' or set build.trtllm_version to match"
        )
    engine_mbs = build.get("max_batch_size")
    if engine_mbs is None:
        raise LpxError(
            "The engine's config.json has no build_config.max_batch_size - rebuild it with 'lpx build'"
        )
    check_batch_fits(cfg, engine_mbs, "the engine's build_config.max_batch_size")
    paged = build.get("plugin_config", {}).get("use_paged_context_fmha")
    for wanted, name in (
        (chunked_context, "enable_chunked_context true"),
        (policy == "max_utilization", "batch_scheduler_policy max_utilization"),
    ):
        if wanted and not _enabled(paged):
            raise LpxError(
                f"{name} needs an engine built with use_paged_context_fmha, but the engine's "
                f"plugin_config.use_paged_context_fmha is {paged!r} - rebuild with "
                "--use_paged_context_fmha enable, or turn it off"
            )
    if streaming and not decoupled:
        raise LpxError(
            f"streaming {streaming} needs the tensorrt_llm model decoupled, but decoupled is "
            f"{decoupled} - set decoupled true or turn streaming off"
        )


def model_config(cfg: Config, engine_path: Path, tokenizer_info: Path | None = None) -> mc.ModelConfig:
    """The `tensorrt_llm` ModelConfig of the engine target (tokenizer_info: see parameters)."""
    version = trtllm.contract_version(cfg.build.trtllm_version)
    mbs = cfg.build.max_batch_size
    conf = declare(
        mc.ModelConfig(name="tensorrt_llm", backend="tensorrtllm", max_batch_size=mbs),
        trtllm_specs(version, "in", DATA_TYPES),
        trtllm_specs(version, "out", DATA_TYPES),
    )
    conf.model_transaction_policy.decoupled = DECOUPLED
    conf.dynamic_batching.preferred_batch_size.append(mbs)
    conf.dynamic_batching.max_queue_delay_microseconds = MAX_QUEUE_DELAY_MICROSECONDS
    conf.dynamic_batching.default_queue_policy.max_queue_size = MAX_QUEUE_SIZE
    conf.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    for key, value in parameters(cfg, engine_path, tokenizer_info).items():
        conf.parameters[key].string_value = value
    return conf
