"""What an audit costs a target, per check: prompt tokens sent, the part a correct engine prefills (served: what
it computes and usually bills; a prompt over the limit is refused before prefill), and requests, from the plans
themselves for each capacity of bench/planning.py.  The baseline of the token work (issue 54): an incident-size
audit's plan, sent against served, beside the daemon's default budget.

    python bench/cost.py [--json]
"""

from __future__ import annotations

import argparse
import json

from planning import CAPACITIES, default_config, planning, run_for  # bench/planning.py

from prober.checks import REGISTRY
from prober.probing.plan import Planned


def served(planned: Planned) -> int:
    """Prompt tokens a correct engine prefills: a plan's steps it must serve; a check without a plan sends only
    prompts that fit, so all of them."""
    if planned.plan is None:
        return planned.tokens
    return sum(s.length for e in planned.plan.exchanges for s in e.steps if s.expect_served)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = parser.parse_args()
    config = default_config()
    checks = REGISTRY.selected(config)
    doc: dict[str, dict[str, dict[str, int]]] = {}
    with planning(config) as context:
        for label, capacity in CAPACITIES.items():
            run = run_for(context, config, capacity)
            rows = {}
            for check in checks:
                planned = check.planned(run)
                rows[check.name] = {"sent": planned.tokens, "served": served(planned), "requests": planned.requests}
            rows["audit"] = {k: sum(r[k] for r in rows.values()) for k in ("sent", "served", "requests")}
            doc[label] = rows
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    for label, rows in doc.items():
        print(f"\n{label}\n{'check':<14} {'sent':>14} {'served':>14} {'requests':>9}")
        for name, r in rows.items():
            print(f"{name:<14} {r['sent']:>14,} {r['served']:>14,} {r['requests']:>9,}")


if __name__ == "__main__":
    main()
