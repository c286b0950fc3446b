"""What scrubbing every answer and report costs: the secret model (every encoding of every key, in windows)
against the scrubber it replaced (a regex over each key's raw, JSON, URL-quoted and base64 forms), measured
in the same run on the same texts.

    .venv/bin/python bench/scrub.py [--keys 4] [--repeat 5]

Prints, per text, the median time of each and the ratio new/old; the old one misses most of the forms, so
the ratio is the price of catching them.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import re
import statistics
import time
from collections.abc import Callable
from urllib.parse import quote

from prober.text.scrub import Scrubber


class LiteralScrubber:
    """The previous scrubber, for the baseline: one regex over a few literal forms of each secret."""

    def __init__(self, secrets: dict[str, str]) -> None:
        forms: dict[str, str] = {}
        for label, value in secrets.items():
            raw = value.encode()
            for form in (value, json.dumps(value)[1:-1], quote(value, safe=""), base64.b64encode(raw).decode(),
                         base64.urlsafe_b64encode(raw).decode()):
                form = form.rstrip("=")
                forms.setdefault(form, f"[redacted {label}]")
        self.forms = forms
        self.pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))

    def text(self, value: str) -> str:
        return self.pattern.sub(lambda m: self.forms[m.group(0)], value)


def prose(size: int, rng: random.Random) -> str:
    words = ("the quarterly ledger lists lumber, twine and lamp oil for the valley depot; invoice 4471 was paid "
             "on 12 March by Ada Lovelace (ref LPK-7Q2M) — see https://example.com/a?b=c&d=%20e").split()
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(words)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


def median_s(fn: Callable[[str], object], text: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn(text)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=4, help="tenant keys (plus the canary key)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(7)
    secrets = {f"key of tenant-{i}": f"sk-tenant-{i}-{rng.getrandbits(96):024x}" for i in range(args.keys)}
    secrets["canary key"] = "canary-" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(32))
    new, old = Scrubber(secrets), LiteralScrubber(secrets)
    first = next(iter(secrets.values()))
    echoes = " ".join([first, first.upper(), first[::-1], " ".join(first), first.encode().hex(),
                       base64.b64encode(f"Bearer {first}".encode()).decode(),
                       "".join(f"&#{ord(c)};" for c in first)])
    texts = {
        "answer 2 KiB": prose(2_048, rng),
        "report 200 KiB": json.dumps({"steps": [prose(400, rng) for _ in range(500)]}),
        "answer 1 MiB": prose(1 << 20, rng),
        "answer 16 MiB": prose(16 << 20, rng),
        "1 MiB, an echo per 2 KiB": "".join(prose(2_000, rng) + " " + echoes + " " for _ in range(512)),
    }
    print(f"{len(secrets)} secrets; median of {args.repeat}")
    print(f"{'text':28} {'old':>10} {'new':>10} {'new/old':>8} {'new MB/s':>9}")
    for name, text in texts.items():
        repeat = args.repeat if len(text) < (4 << 20) else max(1, args.repeat // 2)
        t_old, t_new = median_s(old.text, text, repeat), median_s(new.text, text, repeat)
        print(f"{name:28} {t_old * 1e3:8.2f}ms {t_new * 1e3:8.2f}ms {t_new / t_old:8.1f} "
              f"{len(text) / t_new / 1e6:9.1f}")
    data = texts["answer 16 MiB"]
    t_bytes = median_s(lambda text: new.bytes(text.encode()), data, max(1, args.repeat // 2))
    print(f"{'answer 16 MiB as bytes':28} {'':>10} {t_bytes * 1e3:8.2f}ms {'':>8} {len(data) / t_bytes / 1e6:9.1f}")


if __name__ == "__main__":
    main()
