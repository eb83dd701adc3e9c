"""NVIDIA Dynamo's own runtime (ai-dynamo / ai-dynamo-runtime 1.6.1 from PyPI, .venv-dynamo: `make dynamo`,
which `make test` runs) on what `lpx deploy dynamo` writes (issue 42):

- every flag LPX gives a component, in every graph (llmapi and vllm, aggregated and disaggregated, v1beta1
  and v1alpha1) and in the two local commands it prints, is taken by that component's own parser
  (dynamo.frontend, dynamo.trtllm; dynamo.vllm on .venv-vllm's vLLM 0.32), and LPX's values are what it took;
- an OpenAI chat request goes through Dynamo's own frontend, started with LPX's local command line, to a
  worker started from LPX's worker command line, with file discovery (DYN_FILE_KV) and the TCP request plane:
  no etcd, no NATS. The worker is Dynamo's mocker (`python -m dynamo.mocker`: a vLLM-like scheduler on the
  model's real tokenizer and chat template), a STAND-IN for the TensorRT-LLM / vLLM worker, which needs a
  GPU; it takes LPX's model, served name, discovery and request-plane flags and the engine flags it shares
  with vLLM (tests/test_dynamo_vllm.py runs Dynamo's real vLLM worker, opt-in);
- the runtime's Kubernetes discovery cannot start without the pod's service account token
  (tests/contracts/dynamo_operator.json, tests/test_dynamo_operator.py).

TensorRT-LLM cannot be installed here; dynamo.trtllm's parser only reads four defaults from it, which a
stand-in package written by the test supplies (STAND-IN, defaults only). ~20 s without the vLLM parser."""

from __future__ import annotations

import json
import mmap
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers_dynamo import DYNAMO_PY, ROOT, VLLM_PY, dynamo_env, run_script
from test_pods_upstream import config, fake_repo

from pipeline.deploy import dynamo

pytestmark = [pytest.mark.triton, pytest.mark.slow]
CONTRACT = json.loads((Path(__file__).parent / "contracts" / "dynamo_operator.json").read_text())
# The mocker's flags that mean what vLLM's engine flags of the same name mean (its --help), and the renamed two
MOCKER_SHARED = {
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--block-size",
    "--enable-prefix-caching",
    "--enable-chunked-prefill",
    "--gpu-memory-utilization",
    "--disaggregation-mode",
    "--discovery-backend",
    "--request-plane",
}
MOCKER_RENAMED = {
    "--model-path": "--model-path",
    "--model": "--model-path",
    "--served-model-name": "--model-name",
}


@pytest.fixture(scope="module", autouse=True)
def dynamo_installed():
    if not (DYNAMO_PY.parent.parent / ".lpx-installed").exists():
        pytest.skip("no .venv-dynamo: run 'make dynamo' (make test does)")


def site_packages(python: Path) -> str:
    return str(next((python.parent.parent / "lib").glob("python3*/site-packages")))


def trtllm_standin(folder: Path) -> Path:
    """A STAND-IN tensorrt_llm with only what dynamo.trtllm's parser reads: BuildConfig.model_fields'
    defaults for four flags (None: the parser's values come from LPX's flags or stay unset)."""
    (folder / "tensorrt_llm").mkdir(parents=True)
    (folder / "tensorrt_llm" / "__init__.py").write_text(
        '"""STAND-IN for tests: BuildConfig defaults only."""\n'
    )
    (folder / "tensorrt_llm" / "llmapi.py").write_text(
        "from types import SimpleNamespace as _N\n\n\nclass BuildConfig:\n"
        "    model_fields = {k: _N(default=None) for k in "
        "('max_batch_size', 'max_num_tokens', 'max_seq_len', 'max_beam_width')}\n"
    )
    return folder


def lpx_command_lines(tmp_path: Path, monkeypatch, target: str) -> list[list[str]]:
    """Every `python3 -m dynamo.<component> ARGS` LPX writes for the target: each worker container of each
    graph, and the two local commands (whose checkpoint is a placeholder path here)."""
    monkeypatch.setenv("LPX_HOME", str(tmp_path / target))
    cfg = config(target)
    fake_repo(tmp_path / target, cfg)
    variant = cfg.variants[0].name
    out = []
    for api_version in ("v1beta1", "v1alpha1"):
        for disagg in (False, True):
            for doc in dynamo.dynamo_objects(cfg, variant, disagg=disagg, api_version=api_version):
                if doc["kind"] != "DynamoGraphDeployment":
                    continue
                specs = doc["spec"].get("components") or doc["spec"]["services"].values()
                for s in specs:
                    main = (
                        s["podTemplate"]["spec"]["containers"][0] if "podTemplate" in s else s["extraPodSpec"]
                    )
                    main = main.get("mainContainer", main)
                    if main.get("command"):
                        out.append(main["command"] + main["args"])
    out += [shlex.split(c) for c in dynamo.local_commands(cfg, variant, tmp_path / "engine", "/ckpt")]
    return out


def parse(python: Path, lines: list[list[str]], env: dict, timeout: float = 120) -> list[dict]:
    cases = [{"module": argv[2], "args": argv[3:]} for argv in lines]
    results = run_script(python, "parse", cases, env, timeout)
    assert len(results) == len(cases), results
    return results


def assert_taken(lines: list[list[str]], results: list[dict]) -> None:
    """Each command line parsed, and the values LPX gave are the ones the component took."""
    for argv, res in zip(lines, results, strict=False):
        assert res["ok"], (argv, res)
        v, args = res["values"], argv[3:]
        if argv[2] == "dynamo.frontend":
            assert v["http_port"] == int(args[args.index("--http-port") + 1])
            continue
        assert v["served_model_name"] == args[args.index("--served-model-name") + 1]
        assert v["model"] == args[args.index("--model-path" if "--model-path" in args else "--model") + 1]
        if "--disaggregation-mode" in args:
            assert v["disaggregation_mode"].lower().endswith(args[args.index("--disaggregation-mode") + 1])
        if "--discovery-backend" in args:
            assert (v["discovery_backend"], v["request_plane"]) == ("file", "tcp")


def test_every_llmapi_flag_is_taken_by_the_components_own_parsers(tmp_path, monkeypatch) -> None:
    lines = lpx_command_lines(tmp_path, monkeypatch, "llmapi")
    assert {argv[2] for argv in lines} == {"dynamo.frontend", "dynamo.trtllm"} and len(lines) == 8
    env = {**dynamo_env(tmp_path / "kv", tmp_path), "PYTHONPATH": str(trtllm_standin(tmp_path / "standin"))}
    results = parse(DYNAMO_PY, lines, env)
    assert_taken(lines, results)
    for argv, res in zip(lines, results, strict=False):
        if argv[2] == "dynamo.trtllm":
            assert res["values"]["extra_engine_args"] == argv[argv.index("--extra-engine-args") + 1]
    # the parsers refuse what they do not know: --store-kv (which earlier LPX wrote) and a made-up flag
    wrong = [lines[-2] + ["--store-kv", "file"], lines[-1] + ["--no-such-flag", "1"]]
    assert [r["ok"] for r in parse(DYNAMO_PY, wrong, env)] == [False, False]


def test_every_vllm_flag_is_taken_by_dynamos_vllm_parser_on_vllm(
    tmp_path, monkeypatch, tiny_checkpoint
) -> None:
    """dynamo.vllm's parser (Dynamo's groups plus vLLM's AsyncEngineArgs) from Dynamo 1.6.1 on .venv-vllm's
    vLLM 0.32.0 (Dynamo 1.6 is built for vLLM 0.31.0; the parser runs on 0.32): every engine flag too. vLLM
    reads the model folder's config while parsing, so `--model` names a real one (the volume's content)."""
    if not (VLLM_PY.parent.parent / ".lpx-installed").exists():
        pytest.skip("no .venv-vllm: run 'make vllm' (make test does)")
    lines = [argv for argv in lpx_command_lines(tmp_path, monkeypatch, "vllm") if argv[2] == "dynamo.vllm"]
    assert len(lines) == 7
    for argv in lines:
        argv[argv.index("--model") + 1] = str(tiny_checkpoint)
    env = {**dynamo_env(tmp_path / "kv", tmp_path), "LPX_DYNAMO_PATH": site_packages(DYNAMO_PY)}
    env["VLLM_TARGET_DEVICE"] = "cpu"
    results = parse(VLLM_PY, lines + [lines[0] + ["--no-such-flag", "1"]], env, timeout=300)
    assert not results[-1]["ok"]
    assert_taken(lines, results[:-1])
    for argv, res in zip(lines, results, strict=False):
        engine = res["values"]["engine"]
        assert engine["max_model_len"] == int(argv[argv.index("--max-model-len") + 1])
        assert engine["tensor_parallel_size"] == int(argv[argv.index("--tensor-parallel-size") + 1])
        assert engine["enable_prefix_caching"] is True and engine["quantization"] == "modelopt"


def mocker_argv(worker: list[str]) -> tuple[list[str], list[str]]:
    """The STAND-IN for LPX's worker command line: Dynamo's mocker with the worker's model, served name,
    runtime flags and the engine flags it shares with vLLM. Returns (argv, the flags left out)."""
    out, left, args, i = [str(DYNAMO_PY), "-m", "dynamo.mocker"], [], worker[3:], 0
    while i < len(args):
        flag, has_value = args[i], i + 1 < len(args) and not args[i + 1].startswith("--")
        value = [args[i + 1]] if has_value else []
        if flag in MOCKER_RENAMED:
            out += [MOCKER_RENAMED[flag], *value]
        elif flag in MOCKER_SHARED:
            out += [flag, *value]
        else:
            left.append(flag)
        i += 1 + len(value)
    return out, left


@pytest.mark.parametrize("target", ["llmapi", "vllm"])
def test_a_chat_request_through_dynamos_frontend_reaches_the_worker_lpx_starts(
    tmp_path, monkeypatch, tiny_checkpoint, target
) -> None:
    monkeypatch.setenv("LPX_HOME", str(tmp_path / "home"))
    cfg = config(target)
    fake_repo(tmp_path / "home", cfg)
    front, worker = (
        shlex.split(c)
        for c in dynamo.local_commands(cfg, cfg.variants[0].name, tmp_path / "engine", str(tiny_checkpoint))
    )
    assert (
        front[:3] == ["python3", "-m", "dynamo.frontend"] and worker[2] == f"dynamo.{dynamo.BACKENDS[target]}"
    )
    stand_in, left_out = mocker_argv(worker)
    # left to the real worker's parser (tests above): the LLM-API YAML, or vLLM's other engine flags
    assert set(left_out) == {"--extra-engine-args"} if target == "llmapi" else "--dtype" in left_out
    (tmp_path / "logs").mkdir()
    spec = {
        "processes": [[str(DYNAMO_PY), *front[1:]], stand_in],
        "logs": str(tmp_path / "logs"),
        "port": int(front[front.index("--http-port") + 1]),  # LPX's port, in a network namespace of its own
        "model": cfg.model.name,
        "timeout": 90,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 5,
    }
    env = dynamo_env(tmp_path / "kv", tmp_path)
    (out,) = run_script(DYNAMO_PY, "serve", spec, env, timeout=180, netns=True)
    chat = out["chat"]
    assert chat["object"] == "chat.completion" and chat["model"] == cfg.model.name, chat
    assert chat["usage"]["completion_tokens"] == 5 and chat["choices"][0]["finish_reason"] == "length"
    # the frontend rendered the model's chat template and tokenized it with the model's tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    want = tok.apply_chat_template(spec["messages"], add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert chat["usage"]["prompt_tokens"] == len(want), (chat["usage"], out["ready_s"])


def test_kubernetes_discovery_cannot_start_without_the_service_account_token(
    tmp_path, tiny_checkpoint
) -> None:
    """What a pod with automountServiceAccountToken: false meets (issue 42): the runtime's Kubernetes client
    finds no in-cluster configuration and the process ends; the pinned runtime reads the token's path."""
    if Path("/var/run/secrets/kubernetes.io/serviceaccount").exists():
        pytest.skip("this machine is a Kubernetes pod with a service account token")
    with (
        open(site_packages(DYNAMO_PY) + "/dynamo/_core.abi3.so", "rb") as f,
        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as core,
    ):
        assert [s for s in CONTRACT["wheel"]["core_strings"] if core.find(s.encode()) < 0] == []
    env = {
        **dynamo_env(tmp_path / "kv", tmp_path),
        "POD_NAME": "w-0",
        "POD_UID": "u-0",
        "POD_NAMESPACE": "lpx",
    }
    env.pop("KUBECONFIG", None)  # and HOME is the test's: no ~/.kube/config either
    argv = [str(DYNAMO_PY), "-m", "dynamo.mocker", "--model-path", str(tiny_checkpoint)]
    res = subprocess.run(
        [*argv, "--model-name", "m", "--discovery-backend", "kubernetes"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode != 0 and "Failed to create Kubernetes client" in res.stderr, res.stderr[-2000:]
    assert "in-cluster" in res.stderr
