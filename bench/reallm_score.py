"""Score the detectors on a corpus of real-model answers over stale pages (made by `bench/reallm.py generate`).

    python bench/reallm_score.py                       # the corpus in $LEAKPROBE_CACHE/reallm-corpus
    python bench/reallm_score.py --corpus DIR --no-semantic --show-misses

Every answer is scanned as `leakprobe scan` scans it (the corpus ledger's canaries and key, the default
embedder, foreign content on), and judged against the ground truth recorded at generation, which knows
nothing of the detectors (`truth.jsonl`; `material()` of bench/reallm.py: an 8-character group of a stale
victim token, a distinctive value of a stale victim fact, a run of words of the stale text).  Prints, per
condition:

    carrying   answers whose text holds the victim's canary material (token or fact), by the truth; of them,
               the name-only ones (a fact's made-up one-word name, a place or a pet, and nothing else)
    caught     of those, answers with a cross-tenant finding that names the victim
    runs       answers that hold only a run of the victim's prompt text (no canary material), and caught
    extra      answers without canary material that drew a cross-tenant finding anyway (read them: a leak the
               truth cannot see -- an edited token -- or a false positive)
    warned     answers with a foreign-content warning

and, over everything: cross-tenant findings on the controls (zeroed pages, the observer's own pages), findings
that name the wrong victim, canary or probe, and the findings by detector.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prober.canaries.keys import resolve_key
from prober.detect import CanarySet, Scanner
from prober.domain.types import Finding, FindingKind, Record
from prober.embeddings import make_embedder
from prober.ledger import open_ledger
from prober.text.shingles import PromptShingles, Shingler

sys.path.insert(0, str(Path(__file__).parent))
from reallm import material  # the generator's oracle: one definition of "victim material"

from prober.system.resources import cache_root


@dataclass
class Tally:
    answers: int = 0
    carrying: int = 0
    caught: int = 0
    names: int = 0  # of those carrying, a fact's made-up name alone
    names_caught: int = 0
    runs: int = 0
    runs_caught: int = 0
    extra: int = 0
    warned: int = 0
    misses: list[str] = field(default_factory=list)


def victim_named(finding: Finding, truth: dict[str, Any]) -> bool:
    return finding.kind is FindingKind.CROSS_TENANT_ECHO and finding.victim_tenant == truth["victim"]


def attribution_errors(findings: list[Finding], truth: dict[str, Any], probes: dict[str, str]) -> list[str]:
    """Cross-tenant findings that name someone else than the victim whose pages were attended, a canary that
    was not in those pages, or a probe of a canary that was not there."""
    stale = {c["id"] for c in truth["stale"]}
    stale_probes = {probes[c] for c in stale if c in probes}
    errors = []
    for f in findings:
        if f.kind is not FindingKind.CROSS_TENANT_ECHO:
            continue
        if f.victim_tenant != truth["victim"]:
            errors.append(f"victim {f.victim_tenant} (was {truth['victim']})")
        elif f.canary_id is not None and f.canary_id not in stale:
            errors.append(f"canary {f.canary_id} not in the stale pages")
        elif f.canary_id is None and f.probe_id not in stale_probes:
            errors.append(f"probe {f.probe_id} not in the stale pages")
    return errors


def sent_prompts(answers: list[dict[str, Any]], truths: dict[str, dict[str, Any]], probes: dict[str, str],
                 key: bytes) -> list[PromptShingles]:
    """What the ledger would hold of every prompt sent (the runner records each one's shingles): the observers'
    prompts, and the victims' -- their whole prompt where the truth has it, else every stale text of it that
    some condition attended (a part of it: enough for every run an answer can copy)."""
    shingler = Shingler(key)
    texts: dict[tuple[str, str], set[str]] = defaultdict(set)
    for row in answers:
        truth = truths.get(row["id"])
        if truth is None:
            continue
        texts[(truth["observer"], f"observer:{row['prompt'][:64]}")].add(row["prompt"])
        probe = next((probes[c["id"]] for c in truth["stale"] if c["id"] in probes), "")
        if probe:
            texts[(truth["victim"], probe)].add(truth.get("victim_prompt") or truth["stale_text"])
    return [shingler.record("\n".join(sorted(parts)), tenant, probe, 0.0, 2e9)
            for (tenant, probe), parts in texts.items()]


def main() -> None:
    parser = argparse.ArgumentParser()
    default = cache_root() / "reallm-corpus"
    parser.add_argument("--corpus", type=Path, default=default)
    parser.add_argument("--no-semantic", action="store_true", help="exact, fuzzy, fragment and foreign only")
    parser.add_argument("--show-misses", action="store_true", help="print the answers with material not caught")
    args = parser.parse_args()
    answers = [json.loads(line) for line in (args.corpus / "answers.jsonl").read_text(encoding="utf-8").splitlines()]
    truths = {t["id"]: t for t in map(json.loads, (args.corpus / "truth.jsonl").read_text("utf-8").splitlines())}
    ledger = open_ledger(args.corpus / "ledger.sqlite")
    canaries = ledger.active_canaries(now=0.0)
    probes = {c.id: c.probe_id for c in canaries}
    key = resolve_key(ledger)
    scanner = Scanner(CanarySet(canaries, key=key, tenants=sorted({c.tenant for c in canaries})),
                      prompts=sent_prompts(answers, truths, probes, key),
                      embedder=None if args.no_semantic else make_embedder(), foreign=True)
    tallies: dict[str, Tally] = defaultdict(Tally)
    detectors: Counter[str] = Counter()
    control_findings, wrong = [], []
    for row in answers:
        truth = truths.get(row["id"])
        if truth is None:
            continue  # the generator is still writing it
        condition = truth["label"]
        tally = tallies[condition]
        tally.answers += 1
        findings = scanner.scan(Record(row["id"], row["tenant"], row["text"], row.get("prompt"))).findings
        echoes = [f for f in findings if f.kind is FindingKind.CROSS_TENANT_ECHO]
        detectors.update(f"{f.detector}/{f.severity.label}" for f in echoes)
        tally.warned += any(f.kind is FindingKind.FOREIGN_CONTENT for f in findings)
        wrong += [f"{row['id']}: {e}" for e in attribution_errors(echoes, truth, probes)]
        if truth["condition"]["control"]:
            control_findings += [f"{row['id']}: {f.detector} {f.excerpt!r}" for f in echoes]
            continue
        found = material(row["text"], truth, row.get("prompt") or "")
        caught = any(victim_named(f, truth) for f in echoes)
        if found["token_group"] or found["fact_value"]:
            tally.carrying += 1
            tally.caught += caught
            tally.names += found["name_only"]
            tally.names_caught += found["name_only"] and caught
            if not caught:
                tally.misses.append(f"{row['id']} {sorted(k for k, v in found.items() if v)}: {row['text'][:300]!r}")
        elif found["verbatim_run"]:
            tally.runs += 1
            tally.runs_caught += caught
            if not caught:
                tally.misses.append(f"{row['id']} ['verbatim_run']: {row['text'][:300]!r}")
        elif echoes:
            tally.extra += 1
    print(f"{len(answers)} answers, {len(canaries)} canaries in {args.corpus}")
    print(f"\n{'condition':<36} {'answers':>7} {'carrying':>8} {'caught':>6} {'recall':>6} {'runs':>9} {'extra':>5}"
          f" {'warned':>6}")
    total = Tally()
    for condition in sorted(tallies):
        t = tallies[condition]
        recall = f"{t.caught / t.carrying:.2f}" if t.carrying else "-"
        print(f"{condition:<36} {t.answers:>7} {t.carrying:>8} {t.caught:>6} {recall:>6} "
              f"{t.runs_caught:>4}/{t.runs:<4} {t.extra:>5} {t.warned:>6}")
        for name in ("answers", "carrying", "caught", "names", "names_caught", "runs", "runs_caught", "extra",
                     "warned"):
            setattr(total, name, getattr(total, name) + getattr(t, name))
    controls = sum(t.answers for c, t in tallies.items() if not c.startswith("stale"))
    control_warned = sum(t.warned for c, t in tallies.items() if not c.startswith("stale"))
    print(f"\nrecall on answers carrying canary material: {total.caught}/{total.carrying}"
          f" ({total.caught / max(1, total.carrying):.3f}); of them a fact's made-up name alone: "
          f"{total.names_caught}/{total.names}; prompt runs only: {total.runs_caught}/{total.runs}")
    print(f"cross-tenant findings on {controls} control answers: {len(control_findings)}")
    print(f"foreign-content warnings on control answers: {control_warned}/{controls}"
          f" ({control_warned / max(1, controls):.1%})")
    print(f"attribution errors: {len(wrong)}")
    print("cross-tenant findings by detector:", dict(detectors))
    for line in control_findings + wrong:
        print("  ", line)
    if args.show_misses:
        for condition in sorted(tallies):
            for miss in tallies[condition].misses:
                print("MISS", miss)


if __name__ == "__main__":
    main()
