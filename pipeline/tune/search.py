"""The goodput search of one cell: rising load until the SLO breaks.

A level passes when at least `attainment` of its requests (failed ones count against it) met every SLO
bound. The search:
  1. closed loop at concurrency 1, 2, 4, ... until a level fails (or max_concurrency passes);
  2. bisection between the last passing and the first failing concurrency: the knee concurrency;
  3. Poisson arrivals: from the highest request rate the closed loop reached, up by half while levels
     pass, then bisection between the highest passing and the lowest failing rate (`rate_steps` levels
     in all), for the highest rate that passes. Random arrivals queue where a closed loop never does, so this
     is what a server meets under real traffic: the cell's goodput at the SLO is that rate times the
     share of its requests that met the SLO (requests/s meeting the SLO while arriving at that rate; a
     level's own good/wall would also count the drain of its last requests, which a short level
     overweights).
`measure(kind, load)` runs one level ("closed", concurrency) or ("poisson", rate) and returns
pipeline.bench.metrics.summarize's dict; the search itself is pure, so tests can drive it with any
function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Summary = dict[str, Any]
Measure = Callable[[str, float], Summary]


@dataclass
class SearchSettings:
    attainment: float = 0.9
    max_concurrency: int = 256
    rate_steps: int = 4
    bisect_steps: int = 3  # closed-loop bisection levels at most


@dataclass
class Level:
    kind: str  # "closed" | "poisson"
    load: float  # concurrency or requests/s
    passed: bool
    attainment: float
    summary: Summary

    @property
    def goodput_rps(self) -> float:
        """Requests/s that met the SLO: closed loop, good requests over the level's wall time; Poisson,
        the offered rate times the share that met it."""
        if self.kind == "poisson":
            return self.load * self.attainment
        return float(self.summary.get("goodput_rps") or 0.0)

    def brief(self) -> dict[str, Any]:
        s = self.summary
        return {
            "kind": self.kind,
            "load": self.load,
            "passed": self.passed,
            "attainment": round(self.attainment, 4),
            "goodput_rps": self.goodput_rps,
            "requests_per_s": s.get("requests_per_s"),
            "output_tokens_per_s": s.get("output_tokens_per_s"),
            "ttft_ms": s.get("ttft_ms"),
            "itl_ms": s.get("itl_ms"),
            "e2e_ms": s.get("e2e_ms"),
            "tokens_per_s_per_user": s.get("tokens_per_s_per_user"),
            "failed": s.get("failed"),
            "errors": s.get("errors"),
        }


@dataclass
class SearchResult:
    levels: list[Level] = field(default_factory=list)
    knee_concurrency: int | None = None  # highest passing concurrency
    knee: Level | None = None  # the closed-loop level at it
    best_rate: Level | None = None  # the highest passing Poisson level
    reason: str | None = None  # why nothing passed

    @property
    def goodput_rps(self) -> float:
        """Requests/s meeting the SLO at the highest Poisson rate that passed (the closed-loop knee's
        when no Poisson level ran); 0 when nothing passed."""
        ran_poisson = any(lv.kind == "poisson" for lv in self.levels)
        level = self.best_rate if ran_poisson else self.knee
        return level.goodput_rps if level else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "goodput_rps": self.goodput_rps,
            "knee_concurrency": self.knee_concurrency,
            "knee": self.knee.brief() if self.knee else None,
            "best_rate": self.best_rate.brief() if self.best_rate else None,
            "reason": self.reason,
            "levels": [lv.brief() for lv in self.levels],
        }


def attainment(summary: Summary) -> float:
    """Share of a level's requests that met the SLO; failed requests count as misses."""
    n = summary.get("requests") or 0
    good = summary.get("good_requests")
    if good is None:  # no SLO given: every successful request counts
        good = summary.get("succeeded") or 0
    return good / n if n else 0.0


def search(
    measure: Measure, settings: SearchSettings, say: Callable[[str], None] = lambda _m: None
) -> SearchResult:
    return _Search(measure, settings, say).run()


@dataclass
class _Search:
    measure: Measure
    settings: SearchSettings
    say: Callable[[str], None]
    out: SearchResult = field(default_factory=SearchResult)

    def level(self, kind: str, load: float) -> Level:
        s = self.measure(kind, load)
        a = attainment(s)
        lv = Level(kind, load, a >= self.settings.attainment and (s.get("succeeded") or 0) > 0, a, s)
        self.out.levels.append(lv)
        unit = "" if kind == "closed" else "/s"
        self.say(
            f"{kind} {load:g}{unit}: {a:.0%} met the SLO, goodput {lv.goodput_rps:.2f} req/s "
            f"- {'pass' if lv.passed else 'FAIL'}"
        )
        return lv

    def run(self) -> SearchResult:
        good, bad = self.doubling()
        if good is None:
            self.out.reason = self.no_level_passed()
            return self.out
        good, bad = self.bisection(good, bad)
        self.out.knee, self.out.knee_concurrency = good, int(good.load)
        if bad is None:
            self.out.reason = (
                f"the SLO still held at concurrency {self.out.knee_concurrency} (tune.max_concurrency): the "
                "knee is above it - raise tune.max_concurrency and the cell's max_batch_size to find it"
            )
        if self.settings.rate_steps > 0:
            self.rates(good, bad)
        return self.out

    def doubling(self) -> tuple[Level | None, Level | None]:
        """1. Concurrency 1, 2, 4, ... up to max_concurrency: (last passing, first failing) level."""
        good: Level | None = None
        c, top = 1, self.settings.max_concurrency
        while c <= top:
            lv = self.level("closed", c)
            if not lv.passed:
                return good, lv
            good = lv
            if c == top:
                break
            c = min(c * 2, top)
        return good, None

    def no_level_passed(self) -> str:
        first = self.out.levels[0].summary
        ttft = (first.get("ttft_ms") or {}).get("p50")
        itl = (first.get("itl_ms") or {}).get("p50")
        return (
            f"the SLO is not met even by one request at a time ({self.out.levels[0].attainment:.0%} met it; "
            f"TTFT p50 {ttft if ttft is None else round(ttft, 1)} ms, ITL p50 {itl if itl is None else round(itl, 1)} ms"
            + (f"; errors: {first.get('errors')[:1]}" if first.get("failed") else "")
            + ")"
        )

    def bisection(self, good: Level, bad: Level | None) -> tuple[Level, Level | None]:
        """2. Bisection between the last passing and the first failing concurrency."""
        steps = 0
        while bad is not None and bad.load - good.load > 1 and steps < self.settings.bisect_steps:
            lv = self.level("closed", int((good.load + bad.load) // 2))
            if lv.passed:
                good = lv
            else:
                bad = lv
            steps += 1
        return good, bad

    def rates(self, good: Level, bad: Level | None) -> None:
        """3. Poisson rates: from the closed loop's highest request rate, up while passing, then bisection."""
        out = self.out
        hi = float(good.summary.get("requests_per_s") or 0.0)
        if bad is not None:  # the failing level's rate bounds the knee from above too
            hi = max(hi, float(bad.summary.get("requests_per_s") or 0.0))
        if hi <= 0:
            return
        lo, top, rate = 0.0, None, hi  # top: the lowest failing rate seen
        for _ in range(self.settings.rate_steps):
            lv = self.level("poisson", round(rate, 4))
            if lv.passed:
                lo = rate
                if out.best_rate is None or rate > out.best_rate.load:
                    out.best_rate = lv
            else:
                top = rate
            if top is None:  # everything passed so far: the knee is higher
                rate *= 1.5
            else:
                rate = (lo + top) / 2 if lo > 0 else top / 2
        if top is None and out.best_rate is not None:
            out.reason = (
                f"every Poisson rate up to {out.best_rate.load:.3g}/s met the SLO: the knee is higher - raise "
                "tune.rate_steps to find it"
            )
        if out.best_rate is None:
            out.reason = (
                f"closed loop passed up to concurrency {out.knee_concurrency}, but no Poisson rate down to "
                f"{rate * 2:.3g}/s met the SLO: random arrivals queue - lower the load or relax the SLO"
            )
