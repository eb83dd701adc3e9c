"""One runner for every stage: hash the inputs, reuse what is cached, say why anything runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from . import toolchain
from .artifacts import Artifact, Store, diff_inputs, file_fingerprint, make_key
from .config import STAGES, Config, Variant
from .errors import PipelineError
from .inspection.checkpoint import inspect_checkpoint
from .progress import Reporter, quiet_libraries
from .stages.quantize.calibration import load_texts
from .stages.quantize.recipes import check_archs, check_shapes, check_trtllm

ANY_ARCH = "any"  # the torch target runs on any device


@dataclass
class Outcome:
    variant: str
    artifacts: dict[str, Artifact] = field(default_factory=dict)


def stage_index(stage: str) -> int:
    return STAGES.index(stage)


class Runner:
    def __init__(
        self,
        cfg: Config,
        report: Reporter | None = None,
        force: set[str] | None = None,
        store: Store | None = None,
        skip_gate: bool = False,
        dry_run: bool = False,
    ):
        quiet_libraries()
        self.cfg = cfg
        self.dry_run = dry_run
        self.skip_gate = skip_gate
        self.report = report or Reporter()
        self.force = force or set()
        self.store = store or Store()
        self._ckpt = None
        self._gpus: list | None = None

    # --- the generic cached step -------------------------------------------------------------
    def step(
        self, stage: str, variant: str, arch: str, inputs: dict, produce: Callable[[Path], dict]
    ) -> Artifact:
        model = self.cfg.model.name
        key = make_key(inputs)
        label = f"{variant}/{arch}" if arch != ANY_ARCH or stage != "quantize" else variant
        slot = self.store.slot(stage, model, variant, arch)
        with self.store.lock(slot):
            hit = self.store.lookup(stage, model, variant, arch, key)
            if hit and stage not in self.force:
                self.report.stage(stage, label, f"[green]cached[/green] {key}")
                return hit
            self.store.sweep(slot)
            previous = self.store.entries(stage, model, variant, arch)
            if stage in self.force:
                why = "forced"
            elif previous:
                changes = diff_inputs(previous[0].manifest.get("inputs", {}), inputs)
                why = (
                    "changed: "
                    + "; ".join(changes[:4])
                    + (f" (+{len(changes) - 4} more)" if len(changes) > 4 else "")
                )
            else:
                why = "no cached result"
            self.report.stage(stage, label, f"[cyan]running[/cyan] {key} ({why})")
            started = time.time()
            t0 = time.perf_counter()
            with self.store.staging(slot, key) as tmp:
                results = produce(tmp)
                art = self.store.commit(
                    tmp,
                    slot / key,
                    {
                        "stage": stage,
                        "model": model,
                        "variant": variant,
                        "arch": arch,
                        "created": started,
                        "duration_s": round(time.perf_counter() - t0, 3),
                        "inputs": inputs,
                        "versions": toolchain.versions(),
                        "environment": toolchain.environment(),
                        "results": results,
                    },
                )
            self.report.stage(stage, label, f"[green]done[/green] {key} in {art.manifest['duration_s']:.1f}s")
            return art

    # --- stages ------------------------------------------------------------------------------
    def checkpoint(self):
        if self._ckpt is None:
            info = inspect_checkpoint(self.cfg.model.checkpoint, self.cfg.model.allow_pickle)
            fp = file_fingerprint(info.path)
            if self.cfg.model.tokenizer:
                fp = {"checkpoint": fp, "tokenizer": file_fingerprint(self.cfg.model.tokenizer)}
            self._ckpt = (info, fp)
        return self._ckpt

    def check(self, variant: Variant) -> None:
        """Everything that can be refused before any work: format vs GPU archs and TensorRT-LLM line, tp vs heads."""
        where = f"variant '{variant.name}'"
        check_archs(variant.quantization, self.cfg.build.archs, where)
        check_trtllm(variant.quantization, self.cfg.build.trtllm_version, where)
        info, _ = self.checkpoint()
        b = self.cfg.build
        check_shapes(variant.quantization, info.config, b.tp_size, where)
        if info.max_positions and b.max_seq_len > info.max_positions:
            raise PipelineError(
                f"build.max_seq_len {b.max_seq_len} exceeds the model's max_position_embeddings "
                f"{info.max_positions} - lower build.max_seq_len",
                exit_code=2,
            )
        from .stages.quantize.export_check import check_sliding_window

        check_sliding_window(info.config, b.max_seq_len, where)
        for gpu in self.target_gpus():
            from .inspection.plan import check_fit

            kv = {"none": "bf16"}.get(variant.quantization.kv_cache, variant.quantization.kv_cache)
            check_fit(
                info.config, variant.quantization.format, kv, b.max_seq_len, b.tp_size * b.pp_size, gpu, where
            )

    def target_gpus(self) -> list:
        """GPUs to check memory against: build.gpu, else the GPU present when its arch is a build target."""
        from .facts.gpu import lookup_gpu

        if self._gpus is None:
            self._gpus = []
            if self.cfg.build.gpu:
                try:
                    self._gpus = [lookup_gpu(self.cfg.build.gpu)]
                except PipelineError as exc:
                    raise PipelineError(f"build.gpu: {exc.message}", exit_code=2) from None
            elif self.cfg.build.target == "engine":
                from .stages.serve.selection import detect_gpu

                present = detect_gpu()
                if present and present.sm in self.cfg.build.archs:
                    try:
                        self._gpus = [lookup_gpu(present.name)]
                    except PipelineError:
                        self.report.warn(f"{present.name} is not in LPX's GPU table: memory fit not checked")
        return self._gpus

    def quantize(self, variant: Variant) -> Artifact:
        from .stages import quantize

        self.check(variant)
        info, fingerprint = self.checkpoint()
        calset = load_texts(self.cfg.calibration)
        b = self.cfg.build
        exports = quantize.needed_exports(self.cfg, variant)
        inputs = {
            "checkpoint": fingerprint,
            "quantization": variant.quantization.model_dump(mode="json"),
            "calibration": {
                **self.cfg.calibration.model_dump(mode="json", exclude={"data"}),
                "data_sha256": calset.sha256,
            },
            "export": {
                "dtype": b.dtype,
                "tp_size": b.tp_size,
                "pp_size": b.pp_size,
                "exports": list(exports),
            },
            "versions": toolchain.versions("torch", "transformers", "modelopt"),
        }
        return self.step(
            "quantize",
            variant.name,
            ANY_ARCH,
            inputs,
            lambda out: quantize.run(self.cfg, variant, info, calset, out, self.report, exports),
        )

    def evaluate(self, variant: Variant, checkpoint: Artifact) -> Artifact:
        from .stages import evaluate

        info, fingerprint = self.checkpoint()
        texts = load_texts(self.cfg.evaluation, key="evaluation")
        inputs = {
            "checkpoint": fingerprint,
            "checkpoint_key": checkpoint.key,
            "evaluation": {
                **self.cfg.evaluation.model_dump(mode="json", exclude={"data"}),
                "data_sha256": texts.sha256,
            },
            "versions": toolchain.versions("torch", "transformers", "modelopt"),
        }
        return self.step(
            "eval",
            variant.name,
            ANY_ARCH,
            inputs,
            lambda out: evaluate.run(self.cfg, variant, info, checkpoint.path, texts, self.report),
        )

    def gate(self, variant: Variant, evaluation: Artifact) -> str | None:
        """The reason a variant must not be built (quality gate failed), or None."""
        from .stages.evaluate import gate_failures

        failures = gate_failures(evaluation.manifest["results"], self.cfg.quality_gate)
        if not failures:
            return None
        text = "; ".join(failures)
        if self.skip_gate:
            self.report.warn(
                f"variant '{variant.name}' fails the quality gate ({text}); building it anyway (--skip-gate)"
            )
            return None
        self.report.stage("gate", variant.name, f"[red]FAIL[/red] {text} - not built")
        return f"variant '{variant.name}' fails the quality gate: {text}"

    def archs(self) -> list[str]:
        # only trtllm-build compiles per GPU arch; torch and llmapi artifacts run on any of the configured archs
        return [ANY_ARCH] if self.cfg.build.target in ("torch", "llmapi") else list(self.cfg.build.archs)

    def build(self, variant: Variant, checkpoint: Artifact, arch: str) -> Artifact | None:
        from .stages import build

        inputs = {
            "checkpoint_key": checkpoint.key,
            "build": self.cfg.build.model_dump(mode="json", exclude={"archs"}),
            "arch": arch,
            "versions": toolchain.versions("torch", "transformers", "modelopt", "tensorrt_llm"),
        }
        if self.dry_run:
            return self._dry_run(variant, checkpoint, arch, make_key(inputs))
        return self.step(
            "build",
            variant.name,
            arch,
            inputs,
            lambda out: build.run(self.cfg, variant, checkpoint.path, arch, out, self.report),
        )

    def _dry_run(self, variant: Variant, checkpoint: Artifact, arch: str, key: str) -> None:
        from .stages import build

        out = self.store.slot("build", self.cfg.model.name, variant.name, arch) / key
        if self.cfg.build.target != "engine":
            self.report.stage(
                "build",
                f"{variant.name}/{arch}",
                f"dry run: target {self.cfg.build.target} runs no build tool",
            )
            return None
        argv, reasons = build.engine_command(self.cfg, variant, checkpoint.path, arch, out)
        self.report.stage("build", f"{variant.name}/{arch}", "dry run (nothing is built):")
        self.report.info("  " + " ".join(argv))
        for flag, why in reasons.items():
            self.report.info(f"    {flag:<28} {why}")
        return None

    def repo(
        self, variant: Variant, engine: Artifact, arch: str, checkpoint: Artifact | None = None
    ) -> Artifact:
        from .stages import repository

        models = Path(str(resources.files("model_repo")))
        inputs = {
            "engine_key": engine.key,
            "serving": {"max_tokens_cap": self.cfg.serving.max_tokens_cap},
            "build": self.cfg.build.model_dump(mode="json", exclude={"archs"}),
            "model_repo": file_fingerprint(models) if models.is_dir() else {},
            "versions": toolchain.versions(),
        }
        # an engine folder holds no tokenizer: the quantize artifact's tokenizer/ (or, before it had one, state/) has it
        tokenizer = None
        if checkpoint is not None and self.cfg.build.target == "engine":
            tokenizer = checkpoint.path / "tokenizer"
            if not tokenizer.is_dir():
                tokenizer = checkpoint.path / "state"
        return self.step(
            "repo",
            variant.name,
            arch,
            inputs,
            lambda out: repository.write_repository(out, engine.path, self.cfg, tokenizer_dir=tokenizer),
        )

    def run(self, variants: list[Variant], until: str = "repo") -> list[Outcome]:
        """Run every stage up to `until` (at most `repo`; serving is the caller's) for each variant."""
        last = min(stage_index(until), stage_index("repo"))
        outcomes = []
        self.gate_failures: list[str] = []
        for v in variants:
            self.check(v)
        load_texts(self.cfg.calibration)
        if last >= stage_index("eval"):
            load_texts(self.cfg.evaluation, key="evaluation")
        for v in variants:
            o = Outcome(v.name)
            outcomes.append(o)
            o.artifacts["quantize"] = ck = self.quantize(v)
            if last >= stage_index("eval"):
                o.artifacts["eval"] = ev = self.evaluate(v, ck)
                failure = self.gate(v, ev)
                if failure:
                    self.gate_failures.append(failure)
                    continue
            if last >= stage_index("build"):
                for arch in self.archs():
                    eng = self.build(v, ck, arch)
                    if eng is None:  # dry run
                        continue
                    o.artifacts[f"build:{arch}"] = eng
                    if last >= stage_index("repo"):
                        o.artifacts[f"repo:{arch}"] = self.repo(v, eng, arch, ck)
        return outcomes

    def raise_gate_failures(self) -> None:
        if self.gate_failures:
            raise PipelineError(
                "\n".join(self.gate_failures)
                + "\nfix: choose another format, keep sensitive layers in high precision "
                "with quantization.exclude, relax quality_gate, or pass --skip-gate"
            )
