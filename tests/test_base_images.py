"""The images LPX builds on, held to tests/contracts/base_images.json (upstream's own figures, each with
its source): every base image LPX names is in the contract; each Dockerfile's users fit its base's (no
`useradd --uid 1000` where the base already has uid 1000: Triton's images have triton-server there, the
engine image did not build); its Python fits pyproject.toml and the constraints it installs; the facts
LPX decides with (pipeline/facts/images.py, trtllm.py Line) match the contract; and the defaults meet:
the engine target's default TensorRT-LLM line is the line of the Dockerfile's default base, so an engine
built by default loads in the image deployed by default. Pure file reading, well under a second."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tomllib

from pipeline.config import Deploy, parse_config
from pipeline.deploy import dynamo, k8s
from pipeline.facts import images as facts
from pipeline.facts import trtllm

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = json.loads((ROOT / "tests" / "contracts" / "base_images.json").read_text())
IMAGES = CONTRACT["images"]
DOCKERFILES = ("Dockerfile", "Dockerfile.slim", "Dockerfile.vllm")
FIGURES = ("tensorrt_llm", "vllm", "triton", "python", "cuda", "users")


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = (ROOT / name).read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^(\w+)\s+(.*)$", joined, re.M)]


def arg_default(name: str) -> str:
    """The image the Dockerfile's first FROM names: its ARG's default."""
    steps = instructions(name)
    args = dict(a.split("=", 1) for i, a in steps if i == "ARG" and "=" in a)
    frm = next(a for i, a in steps if i == "FROM")
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], frm.split()[0])


def env(name: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for i, a in instructions(name):
        if i == "ENV":
            found.update(re.findall(r"(\w+)=(\S+)", a))
    return found


def users_after(name: str, base_users: list[dict]) -> dict[int, str]:
    """uid -> name after the Dockerfile's RUN steps, as useradd would leave them: an unguarded useradd of
    a uid the image has fails the build (useradd: UID N is not unique); `getent passwd N || useradd ...`
    skips it."""
    users = {u["uid"]: u["name"] for u in base_users}
    for i, run in instructions(name):
        if i != "RUN":
            continue
        for m in re.finditer(r"useradd\b([^&|;]*)", run):
            uid = int(re.search(r"(?:--uid|-u)\s+(\d+)", m.group(1)).group(1))
            user = m.group(1).split()[-1]
            guarded = re.search(rf"(getent passwd|id -u) {uid}\b[^&|;]*\|\|\s*$", run[: m.start()])
            if uid in users and guarded:
                continue
            assert uid not in users, (
                f"{name}: useradd --uid {uid} {user} fails on its base, which has {users[uid]} with uid {uid}"
            )
            users[uid] = user
    return users


def _defaults() -> dict[str, str]:
    """Every base image LPX names by default -> where."""
    named = {arg_default(d): d for d in DOCKERFILES}
    named.update({line.container: f"trtllm.LINES[{n!r}].container" for n, line in trtllm.LINES.items()})
    named.update({image: f"dynamo.IMAGES[{t!r}]" for t, image in dynamo.IMAGES.items()})
    return named


def test_the_contract_names_a_source_and_a_status_for_every_figure() -> None:
    for image, figures in IMAGES.items():
        for key in FIGURES:
            assert key in figures, (image, key)
            fig = figures[key]
            assert fig["status"] in ("verified", "lead", "unconfirmed"), (image, key)
            assert fig["source"].split()[0] in CONTRACT["sources"], (image, key, fig["source"])


@pytest.mark.parametrize("image", sorted(_defaults()))
def test_every_base_image_lpx_names_is_in_the_contract(image: str) -> None:
    where = _defaults()[image]
    assert image in IMAGES or image in CONTRACT["unconfirmed"], (
        f"{where} names {image}, which tests/contracts/base_images.json does not describe: add its TensorRT-LLM, "
        "vLLM, Triton, Python, CUDA and users with their upstream sources"
    )


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_runs_as_uid_1000_that_its_base_can_have(name: str) -> None:
    base = arg_default(name)
    users = users_after(name, IMAGES[base]["users"]["value"])
    (user,) = [a for i, a in instructions(name) if i == "USER"]
    assert user == str(k8s.USER_ID) and k8s.USER_ID in users  # runAsUser 1000 in every manifest
    home = env(name)
    assert home["LPX_HOME"] == k8s.LPX_HOME  # the emptyDir the manifests mount
    volumes = next(a for i, a in instructions(name) if i == "VOLUME")
    assert json.loads(volumes) == ["/models", k8s.LPX_HOME]


def test_engine_dockerfile_owns_its_home_whatever_uid_1000_is_called() -> None:
    """The Triton base's uid 1000 is triton-server (no /home/lpx): the image makes HOME and LPX_HOME
    itself, owned by 1000, and says HOME so nothing falls back to triton-server's."""
    runs = " ".join(a for i, a in instructions("Dockerfile") if i == "RUN")
    assert env("Dockerfile")["HOME"] == str(Path(k8s.LPX_HOME).parent)
    assert re.search(rf"install -d -o 1000 -g 1000 [^&]*/home/lpx {re.escape(k8s.LPX_HOME)}", runs)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_python_fits_pyproject_and_its_constraints(name: str) -> None:
    python = IMAGES[arg_default(name)]["python"]["value"]
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    have = tuple(int(p) for p in python.split(".")[:2])
    assert have >= tuple(int(p) for p in floor.removeprefix(">=").split(".")), (name, python, floor)
    for constraints in re.findall(r"-c /opt/lpx/(constraints/\S+)", str(instructions(name))):
        tested = re.search(r"Python (\d+\.\d+)", (ROOT / constraints).read_text().splitlines()[0]).group(1)
        assert ".".join(python.split(".")[:2]) == tested, f"{name}: {constraints} was tested on {tested}"


def test_facts_match_the_contract() -> None:
    assert facts.TRITON_TRTLLM == CONTRACT["triton_trtllm_matrix"]["value"]
    assert all(facts.release_line(r) for r in facts.TRITON_TRTLLM.values())
    for image, figures in IMAGES.items():
        release = figures["tensorrt_llm"]["value"]
        if image.startswith(facts.TRITON_REPO + ":"):
            assert facts.triton_release(image) == release, image
        elif "/ai-dynamo/" in image:
            assert facts.dynamo_release(image) == (release or figures["vllm"]["value"]), image
    assert facts.PYTHON_BASE == arg_default("Dockerfile.slim") == arg_default("Dockerfile.vllm")


@pytest.mark.parametrize("name", [n for n, line in trtllm.LINES.items() if line.container in IMAGES])
def test_line_table_matches_its_container(name: str) -> None:
    line = trtllm.LINES[name]
    figures = IMAGES[line.container]
    assert line.release == figures["tensorrt_llm"]["value"] and facts.release_line(line.release) == name
    assert figures["cuda"]["value"].startswith(line.cuda)
    assert line.min_driver == figures["driver"]["min_major"]


def test_an_engine_built_by_default_loads_in_the_image_deployed_by_default() -> None:
    """build.target engine's default line == the TensorRT-LLM line of the Dockerfile's default base, and
    the image LPX deploys (deploy.image_base's default) is that base."""
    engine = trtllm.default_line("engine")
    base = arg_default("Dockerfile")
    shipped = IMAGES[base]["tensorrt_llm"]["value"]  # upstream's figure, not LPX's table
    assert shipped.split(".")[:2] == engine.split("."), (
        f"the engine target builds for TensorRT-LLM {engine} by default but the Dockerfile's default base "
        f"{base} ships {shipped}"
    )
    assert base == trtllm.LINES[engine].container == facts.DOCKERFILE_BASE == Deploy().image_base
    engine_cfg = parse_config(
        {
            "model": {"name": "m", "checkpoint": "/x"},
            "variants": [{"name": "v"}],
            "build": {"target": "engine"},
        }
    )
    assert engine_cfg.build.trtllm_version == engine  # what `lpx config show` prints


def test_the_llmapi_default_line_is_the_one_dynamos_runtime_ships() -> None:
    shipped = IMAGES[dynamo.IMAGES["llmapi"]]["tensorrt_llm"]["value"]
    assert facts.release_line(shipped) == trtllm.default_line("llmapi"), shipped


def test_the_example_ci_workflow_builds_on_the_default_base() -> None:
    """examples/ci/build-engines.yml's default LPX_IMAGE (quantize, build and the engine image's BASE_IMAGE)
    is the Dockerfile's default base: its engines are built by the TensorRT-LLM the image deployed carries
    (on 2eeb7c6 it built 1.2-line engines in 25.12, TensorRT-LLM 1.1.0)."""
    text = (ROOT / "examples" / "ci" / "build-engines.yml").read_text()
    named = set(re.findall(r"nvcr\.io/nvidia/tritonserver:[\w.-]+", text))
    assert named == {arg_default("Dockerfile")}, named


@pytest.mark.parametrize("target", sorted(dynamo.IMAGES))
def test_the_docs_quote_the_engine_of_the_runtime_the_pods_name(target: str) -> None:
    """docs/deploy.md's image table gives, for each Dynamo runtime image the graphs name, the engine release
    the contract pins (on 2eeb7c6 the docs quoted Dynamo 1.4's vLLM, v0.26.0, for the 1.5.0 image)."""
    image = dynamo.IMAGES[target]
    engine = "vllm" if target == "vllm" else "tensorrt_llm"
    pinned = IMAGES[image][engine]["value"]
    rows = [r for r in (ROOT / "docs" / "deploy.md").read_text().splitlines() if r.startswith(f"| `{image}`")]
    assert rows and all(pinned in r for r in rows), (image, pinned, rows)
