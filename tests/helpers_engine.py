"""Build a torch-target engine dir from the tiny demo checkpoint, once per test session.

What LPX's build stage writes for `target: torch`, reproduced here so the engine, repository and
Triton tests do not depend on the build stage: the HF config and tokenizer files, the ModelOpt
state of the FP8-quantized model (`mto.save`), and `lpx_engine.json`.

The `torch_engine_dir` fixture (tests/conftest.py) calls `session_engine_dir`, whose result is cached
here, so every module shares one checkpoint and one engine dir.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

ENGINE_META = {
    "target": "torch",
    "format": "fp8",
    "dtype": "bfloat16",
    "max_batch_size": 8,
    "max_input_len": 512,
    "max_seq_len": 1024,
    "max_num_tokens": 4096,
    "tokens_per_block": 32,
    "state_file": "modelopt_state.pth",
}
COPY = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
_CACHE: dict[str, Path] = {}


def calibration_texts(n: int = 4) -> list[str]:
    from pipeline.demo import corpus_text, paragraphs

    return paragraphs(corpus_text())[:n]


def build_torch_engine(checkpoint: Path, dest: Path, fmt: str = "fp8") -> Path:
    """Quantize `checkpoint` with ModelOpt (fp8 or none) and write a torch engine dir at `dest`."""
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    if fmt == "fp8":
        tok = AutoTokenizer.from_pretrained(checkpoint)
        batches = [tok(t, return_tensors="pt")["input_ids"][:, :64] for t in calibration_texts()]

        def forward_loop(m) -> None:
            with torch.no_grad():
                for ids in batches:
                    m(input_ids=ids)

        mtq.quantize(model, mtq.FP8_DEFAULT_CFG, forward_loop)
    elif fmt != "none":
        raise ValueError(f"test helper supports fp8 and none, not {fmt}")
    mto.save(model, dest / ENGINE_META["state_file"])
    for name in COPY:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, dest / name)
    (dest / "lpx_engine.json").write_text(json.dumps({**ENGINE_META, "format": fmt}, indent=2) + "\n")
    return dest


def session_engine_dir(factory: pytest.TempPathFactory) -> Path:
    if "engine" not in _CACHE:
        from pipeline.demo import write_checkpoint

        root = factory.mktemp("torch_engine")
        ckpt = write_checkpoint(root / "checkpoint")
        _CACHE["checkpoint"] = ckpt
        _CACHE["engine"] = build_torch_engine(ckpt, root / "engine")
    return _CACHE["engine"]


def reference_greedy(engine_dir: Path, prompt_ids: list[int], max_new_tokens: int, eos_id: int) -> list[int]:
    """Greedy tokens from `model.generate` on the same restored model, cut after the first EOS."""
    import torch

    from pipeline.runtime.engines.torch_engine import load_model

    model = load_model(engine_dir)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos_id,
            pad_token_id=eos_id,
        )[0, len(prompt_ids) :].tolist()
    return out[: out.index(eos_id) + 1] if eos_id in out else out


def running_server(repo: Path, root: Path, **env: str):
    """Generator for a module fixture: tritonserver on `repo` (skip without a tritonserver), with
    LPX_HOME under `root` and the extra environment `env`; yields the started server, stops it after.
    A restart after the known lock abort while loading (TritonServer.start) shows as a pytest warning."""
    from pipeline.errors import LpxError
    from pipeline.servers.tritonserver import TritonServer, find_tritonserver

    try:
        find_tritonserver()
    except LpxError as exc:
        pytest.skip(exc.message)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"LPX_HOME": str(root / "home"), **env}.items():
            mp.setenv(key, value)
        srv = TritonServer(
            repo,
            log_path=root / "triton.log",
            ready_timeout_s=240,
            notify=lambda m: warnings.warn(m, stacklevel=2),
        )
        try:
            srv.start()
        except LpxError as exc:
            pytest.fail(f"{exc.message}\n{exc.detail}")
        try:
            yield srv
        finally:
            srv.stop()


# A repetition penalty that changes greedy text whenever the text repeats a token it has seen: the repeated
# token's logit is divided (positive) or multiplied (negative) by 10, far below the unseen tokens' on a
# random model's near-flat logits. Whether a mild penalty like 1.3 flips a token is a near-tie on one CPU.
STRONG_PENALTY = 10.0


def assert_penalty_bites(prompt: list[int], plain: list[int], penalised: list[int]) -> None:
    """The penalised text differs from the plain one at or before the plain text's first repeated token
    (a token of the prompt or of its own earlier output); the plain text must have one."""
    seen = set(prompt)
    for k, token in enumerate(plain):
        if token in seen:
            assert penalised[: k + 1] != plain[: k + 1], (k, plain, penalised)
            return
        seen.add(token)
    raise AssertionError(f"the plain text repeats no token, so no penalty can change it: {plain}")


def session_gateway(triton, root: Path, model: str, **settings: object):
    """Generator for a module fixture: LPX's gateway process (an open one: no keys) in front of the session's
    tritonserver `triton`, its files under `root`; yields the started process, stops it after and fails if
    its log holds a traceback. `settings` are further GatewaySettings fields."""
    from pipeline.gateway.process import GatewayProcess
    from pipeline.gateway.settings import GatewaySettings

    gateway = GatewaySettings(
        triton_url=triton.grpc_url,
        tokenizer=triton.repo / "preprocessing" / "1" / "tokenizer",
        model_name=model,
        port=0,
        api_keys_file=root / "keys.json",  # no keys in it: open, as a local gateway is
        access_log=str(root / "access.log"),
        **settings,
    )
    proc = GatewayProcess(gateway, root, root / "gateway.log").start()
    try:
        yield proc
    finally:
        proc.stop()
        log = (root / "gateway.log").read_text() if (root / "gateway.log").exists() else ""
        assert "Traceback" not in log, log[-3000:]
