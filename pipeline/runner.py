"""The runner: orders the stages for each variant, reuses what is cached and reports why anything runs.

What a stage's key holds, what it checks and what it writes are the stage's own (pipeline/stages/);
the runner hashes the stage's inputs into the key, looks the key up in the artifact store, explains a
miss by naming what changed since the slot's newest artifact (pipeline/cache_keys.py), and otherwise runs the
stage in a staging folder that is renamed into place when complete (pipeline/artifacts.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import toolchain
from .artifacts import MANIFEST, Artifact, Store, link_tree
from .cache_keys import explain, make_key
from .config import Config, Variant
from .errors import LpxError, StageFailed
from .progress import Reporter, quiet_libraries
from .stages import STAGES, build, evaluate, quantize, repository
from .stages.context import ANY_ARCH, Context

MAX_REASONS = 4  # changes named in a "running" line
# stages whose output depends on nothing of the variant but its quantization: shared between variants by key
SHARED_STAGES = ("quantize", "eval")


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
        self.ctx = Context(cfg, report or Reporter(), store or Store())
        self.dry_run = dry_run
        self.skip_gate = skip_gate
        self.force = force or set()
        self.gate_failures: list[str] = []

    @property
    def cfg(self) -> Config:
        return self.ctx.cfg

    @property
    def report(self) -> Reporter:
        return self.ctx.report

    @property
    def store(self) -> Store:
        return self.ctx.store

    # --- the generic cached step -------------------------------------------------------------
    def step(
        self, stage: str, variant: str, arch: str, inputs: dict, produce: Callable[[Path], dict]
    ) -> Artifact:
        model = self.cfg.model.name
        key = make_key(inputs)
        label = f"{variant}/{arch}" if arch != ANY_ARCH or stage != "quantize" else variant
        slot = self.store.slot(stage, model, variant, arch)
        with self.store.lock(slot):
            self.store.sweep(slot)  # staging folders of killed runs, whether or not this run is cached
            hit = self.store.lookup(stage, model, variant, arch, key)
            if hit and stage not in self.force:
                self.report.stage(stage, label, f"[green]cached[/green] {key}")
                return hit
            shared = self._shared(stage, model, variant, arch, key, slot, label)
            if shared is not None:
                return shared
            self.report.stage(
                stage, label, f"[cyan]running[/cyan] {key} ({self._why(stage, model, variant, arch, inputs)})"
            )
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

    def _shared(
        self, stage: str, model: str, variant: str, arch: str, key: str, slot: Path, label: str
    ) -> Artifact | None:
        """The same key already made for another variant of the model (variants that differ only by build
        target share their quantize and eval inputs): hard-linked into this slot, so the work is done once,
        the bytes are on disk once, and every slot still holds its own complete artifact."""
        if stage not in SHARED_STAGES or stage in self.force:
            return None
        source = next(
            (
                a
                for other in sorted(p.name for p in slot.parent.parent.iterdir() if p.name != variant)
                if (a := self.store.lookup(stage, model, other, arch, key)) is not None
            ),
            None,
        )
        if source is None:
            return None
        t0 = time.perf_counter()
        with self.store.staging(slot, key) as tmp:
            link_tree(source.path, tmp)
            (tmp / MANIFEST).unlink()  # linked: commit must write a file of its own, not the source's
            art = self.store.commit(
                tmp,
                slot / key,
                {
                    **source.manifest,
                    "variant": variant,
                    "created": time.time(),
                    "duration_s": round(time.perf_counter() - t0, 3),  # the links; the work is the source's
                    "shared_from": str(source.path),
                },
            )
        self.report.stage(
            stage, label, f"[green]shared[/green] {key} (variant '{source.manifest['variant']}')"
        )
        return art

    def _why(self, stage: str, model: str, variant: str, arch: str, inputs: dict) -> str:
        if stage in self.force:
            return "forced"
        previous = self.store.entries(stage, model, variant, arch)
        if not previous:
            return "no cached result"
        changes = explain(previous[0].manifest.get("inputs", {}), inputs)
        more = f" (+{len(changes) - MAX_REASONS} more)" if len(changes) > MAX_REASONS else ""
        return "changed: " + "; ".join(changes[:MAX_REASONS]) + more

    @contextlib.contextmanager
    def variant_config(self, variant: Variant) -> Iterator[None]:
        """The stages see the config as `variant` builds it (its build.target override), sharing what
        the run read once (checkpoint, texts)."""
        base = self.ctx
        self.ctx = Context(base.cfg.for_variant(variant), base.report, base.store, base._cache)
        try:
            yield
        finally:
            self.ctx = base

    # --- the stages, in order ----------------------------------------------------------------
    def check(self, variant: Variant) -> None:
        """Everything the stages can refuse before any work (format vs GPU archs and TensorRT-LLM line,
        tp vs heads, lengths, memory fit)."""
        build.check(self.ctx, variant)
        quantize.check(self.ctx, variant)

    def quantize(self, variant: Variant) -> Artifact:
        self.check(variant)
        return self.step(
            "quantize",
            variant.name,
            ANY_ARCH,
            quantize.inputs(self.ctx, variant),
            lambda out: quantize.run(self.ctx, variant, out),
        )

    def evaluate(self, variant: Variant, checkpoint: Artifact) -> Artifact:
        return self.step(
            "eval",
            variant.name,
            ANY_ARCH,
            evaluate.inputs(self.ctx, variant, checkpoint),
            lambda out: evaluate.run(self.ctx, variant, checkpoint, out),
        )

    def gate(self, variant: Variant, evaluation: Artifact) -> str | None:
        """The reason a variant must not be built (quality gate failed), or None."""
        results = evaluation.manifest["results"]
        for warning in evaluate.gate_warnings(results, self.cfg.quality_gate):
            self.report.warn(f"variant '{variant.name}': {warning}")
        failures = evaluate.gate_failures(results, self.cfg.quality_gate)
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
        return build.archs(self.ctx)

    def build(self, variant: Variant, checkpoint: Artifact, arch: str) -> Artifact | None:
        inputs = build.inputs(self.ctx, variant, checkpoint, arch)
        if self.dry_run:
            out = self.store.slot("build", self.cfg.model.name, variant.name, arch) / make_key(inputs)
            first, *rest = build.dry_run(self.ctx, variant, checkpoint, arch, out)
            self.report.stage("build", f"{variant.name}/{arch}", first)
            for line in rest:
                self.report.info(line)
            return None
        return self.step(
            "build",
            variant.name,
            arch,
            inputs,
            lambda out: build.run(self.ctx, variant, checkpoint, arch, out),
        )

    def repo(
        self, variant: Variant, engine: Artifact, arch: str, checkpoint: Artifact | None = None
    ) -> Artifact:
        return self.step(
            "repo",
            variant.name,
            arch,
            repository.inputs(self.ctx, variant, engine, checkpoint),
            lambda out: repository.run(self.ctx, variant, engine, checkpoint, out),
        )

    def run(self, variants: list[Variant], until: str = "repo") -> list[Outcome]:
        """Run every stage up to `until` (at most `repo`; serving is the caller's) for each variant."""
        last = min(stage_index(until), stage_index("repo"))
        outcomes = []
        self.gate_failures = []
        for v in variants:
            with self.variant_config(v):
                self.check(v)
        self.ctx.texts("calibration")
        if last >= stage_index("eval"):
            self.ctx.texts("evaluation")
        for v in variants:
            o = Outcome(v.name)
            outcomes.append(o)
            with self.variant_config(v):
                self._run_variant(v, o, last)
        return outcomes

    def _run_variant(self, v: Variant, o: Outcome, last: int) -> None:
        o.artifacts["quantize"] = ck = self.quantize(v)
        if last >= stage_index("eval"):
            o.artifacts["eval"] = ev = self.evaluate(v, ck)
            failure = self.gate(v, ev)
            if failure:
                self.gate_failures.append(failure)
                return
        if last >= stage_index("build"):
            for arch in self.archs():
                eng = self.build(v, ck, arch)
                if eng is None:  # dry run
                    continue
                o.artifacts[f"build:{arch}"] = eng
                if last >= stage_index("repo"):
                    o.artifacts[f"repo:{arch}"] = self.repo(v, eng, arch, ck)

    def raise_gate_failures(self) -> None:
        if self.gate_failures:
            raise StageFailed(
                "\n".join(self.gate_failures)
                + "\nfix: choose another format, keep sensitive layers in high precision "
                "with quantization.exclude, relax quality_gate, or pass --skip-gate"
            )

    # --- what the config references (for `lpx artifacts gc`) ---------------------------------
    def referenced(self) -> dict[Path, str | None]:
        """slot folder -> the key this config gives it now, without running anything; None where the key
        cannot be known yet (the repository of an engine that does not exist: it reads the engine)."""
        model = self.cfg.model.name
        refs: dict[Path, str | None] = {}

        def planned(stage: str, variant: str, arch: str, key: str) -> Artifact:
            slot = self.store.slot(stage, model, variant, arch)
            refs[slot] = key
            return self.store.lookup(stage, model, variant, arch, key) or Artifact(slot / key, {"key": key})

        for v in self.cfg.variants:
            with self.variant_config(v):
                self._plan_variant(v, planned, refs)
        return refs

    def _plan_variant(self, v: Variant, planned: Callable, refs: dict) -> None:
        model = self.cfg.model.name
        ck = planned("quantize", v.name, ANY_ARCH, make_key(quantize.inputs(self.ctx, v)))
        planned("eval", v.name, ANY_ARCH, make_key(evaluate.inputs(self.ctx, v, ck)))
        for arch in self.archs():
            eng = planned("build", v.name, arch, make_key(build.inputs(self.ctx, v, ck, arch)))
            repo_slot = self.store.slot("repo", model, v.name, arch)
            try:
                refs[repo_slot] = make_key(repository.inputs(self.ctx, v, eng, ck))
            except LpxError:  # no such engine (yet), or one this config would refuse: cannot tell
                refs[repo_slot] = None
