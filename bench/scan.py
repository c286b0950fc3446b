"""The forensic log scan at log scale: `leakprobe scan --workers` over millions of logged answers.

    python bench/scan.py                        # 10,000,000 answers, 100,000 canaries, 2 workers
    python bench/scan.py --answers 500000       # a quick look
    python bench/scan.py --keep DIR             # generate the logs once, reuse them next time
    python bench/scan.py --previous COMMIT      # time that commit's scanner beside today's

Answers have realistic lengths (log-normal, median 400 characters, 20 to 8,000) of English-like text; one in
100,000 carries a leaked canary token of another tenant -- verbatim, lower-cased, spaced out, or with two
characters changed (for the fuzzy detector).  Timed: the whole CLI (`--no-semantic`: exact, fuzzy, fragment) as a
subprocess, with the peak memory of its process tree (proportional set size) sampled every 0.2 s, and, as the baseline,
the same scan in one process over the first file; that file again with 1, 2 and 4 workers, whose peak memory
must not grow with them (they share one index).  Every planted leak must be found.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import string
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import Pool
from pathlib import Path

from previous import PREVIOUS  # bench/previous.py

from prober.canaries import tokens
from prober.canaries.filler import load_filler
from prober.canaries.keys import KEY_ENV

KEY = "bench-scan-key-bench-scan-key-!!"
TENANTS = [f"tenant-{i:02d}" for i in range(50)]
LEAK_EVERY = 100_000
FILES = 8


def canaries_for(folder: Path, count: int) -> Path:
    """`count` tokens of 50 tenants, kept (as JSON) beside the logs that leak some of them."""
    saved = folder / f"canaries-{count}.json"
    if not saved.exists():
        now = time.time()
        saved.write_text(json.dumps([
            {"id": f"cn_{i:08x}", "tenant": TENANTS[i % len(TENANTS)], "at": now,
             "text": tokens.display(tokens.mint_body(KEY.encode(), TENANTS[i % len(TENANTS)], f"p{i % 997}"))}
            for i in range(count)]))
    return saved


# Run by the package that scans (today's, or the previous one's), so the ledger has the schema it understands.
LEDGER_WRITER = """
import json, sys
from prober.ledger import open_ledger
from prober.domain.types import Canary, CanaryKind
path, saved, key = sys.argv[1:]
ledger = open_ledger(path)
ledger.set_meta_if_absent("canary_key", key)
canaries = [Canary(id=c["id"], tenant=c["tenant"], kind=CanaryKind.TOKEN, text=c["text"], created_at=c["at"],
                   expires_at=c["at"] + 365 * 86_400) for c in json.loads(open(saved).read())]
for at in range(0, len(canaries), 10_000):
    ledger.add_canaries(canaries[at : at + 10_000])
ledger.close()
"""


def ledger_with(path: Path, saved: Path, code: Path | None = None) -> Path:
    """A fresh SQLite ledger holding the canaries, written in bulk (minting is not what is timed) by the package
    in `code` (today's where None)."""
    subprocess.run([sys.executable, "-c", LEDGER_WRITER, str(path), str(saved), KEY], check=True, cwd=code,
                   env={**os.environ, **({"PYTHONPATH": str(code)} if code else {})})
    return path


def render(token: str, rng: random.Random) -> str:
    """How a leaked token may look in a logged answer."""
    choice = rng.randrange(4)
    if choice == 0:
        return token
    if choice == 1:
        return token.lower()
    if choice == 2:
        return " ".join(token.replace("-", "")[i : i + 4] for i in range(0, 35, 4))
    chars = list(token)
    for i in rng.sample(range(4, len(chars)), 2):
        if chars[i] != "-":
            chars[i] = rng.choice(tokens.ALPHABET.replace(chars[i], ""))
    return "".join(chars)


def write_file(job: tuple[Path, int, int, int, list[str]]) -> list[str]:
    """One JSONL file of `count` answers starting at `first`; returns the ids that carry a leak."""
    path, first, count, seed, leaked = job
    rng = random.Random(seed)
    filler = load_filler("en").sentences(seed)
    pool = [next(filler).capitalize() for _ in range(20_000)]
    pool += [f"Order {rng.randrange(10**6)} ships on {rng.randrange(1, 29)} May to {w}." for w in
             ("Lisbon", "Denver", "Osaka", "Lagos") for _ in range(500)]
    pool += ["".join(rng.choice(string.ascii_letters + string.digits) for _ in range(12)) for _ in range(2_000)]
    planted = []
    with path.open("w", encoding="utf-8") as out:
        for n in range(first, first + count):
            length = min(8_000, max(20, int(math.exp(rng.gauss(math.log(400), 0.9)))))
            parts: list[str] = []
            size = 0
            while size < length:
                part = rng.choice(pool)
                parts.append(part)
                size += len(part) + 1
            text = " ".join(parts)[:length]
            if n % LEAK_EVERY == LEAK_EVERY // 2:
                cut = rng.randrange(len(text) + 1)
                text = f"{text[:cut]} {render(leaked[n // LEAK_EVERY % len(leaked)], rng)} {text[cut:]}"
                planted.append(f"a{n}")
            out.write(json.dumps({"id": f"a{n}", "tenant": "observer", "text": text}) + "\n")
    return planted


def generate(folder: Path, answers: int, leaked: list[str]) -> tuple[list[Path], set[str]]:
    manifest = folder / "manifest.json"
    if manifest.exists():
        saved = json.loads(manifest.read_text())
        if saved["answers"] == answers:
            print(f"reusing {answers:,} answers in {folder}")
            return [folder / p for p in saved["files"]], set(saved["planted"])
    per = math.ceil(answers / FILES)
    jobs = [(folder / f"answers-{i}.jsonl", i * per, min(per, answers - i * per), 1000 + i, leaked)
            for i in range(FILES) if i * per < answers]
    started = time.monotonic()
    with Pool(os.cpu_count() or 1) as pool:
        planted = {rid for ids in pool.map(write_file, jobs) for rid in ids}
    files = [job[0] for job in jobs]
    size = sum(p.stat().st_size for p in files)
    print(f"generated {answers:,} answers ({size / 2**30:.2f} GiB in {len(files)} files, {len(planted)} leaks) "
          f"in {time.monotonic() - started:.0f} s")
    manifest.write_text(json.dumps({"answers": answers, "files": [p.name for p in files], "planted": sorted(planted)}))
    return files, planted


def tree_pss(pid: int) -> int:
    """Proportional set size of a process and all its descendants, in bytes: a page that n processes share counts
    1/n in each, so the sum is what the tree holds (summed RSS would count shared pages once per process)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            rollup = Path(f"/proc/{current}/smaps_rollup").read_text()
            total += next(int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss:"))
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total


def previous_checkout(scratch: Path, commit: str) -> Path | None:
    """The package as of `commit`, unpacked from git, to time the previous scanner's CLI."""
    folder = scratch / "previous"
    folder.mkdir()
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(root), "archive", commit, "prober", "canaries"], capture_output=True)
    if archive.returncode != 0:
        print(f"(no previous implementation to time: git archive {commit} failed)")
        return None
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def timed_scan(ledger: Path, files: list[Path], workers: int,
               code: Path | None = None) -> tuple[float, int, dict[str, object]]:
    """Wall seconds, peak memory of the process tree (PSS) and the JSON report of `leakprobe scan` (of the
    package in `code`, where given)."""
    command = [sys.executable, "-m", "prober", "scan", "--ledger", str(ledger), "--format", "json",
               "--no-semantic", "--workers", str(workers), *map(str, files)]
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, KEY_ENV: KEY, **({"PYTHONPATH": str(code)} if code else {})},
                            cwd=code)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.2):
            peak = max(peak, tree_pss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    elapsed = time.monotonic() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"scan failed ({proc.returncode}): {err[-2000:]}")
    return elapsed, peak, json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--answers", type=int, default=10_000_000)
    parser.add_argument("--canaries", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", type=Path, help="a folder to keep the generated logs in, and reuse")
    parser.add_argument("--previous", default=PREVIOUS, help="the commit to time beside today's (default: the "
                        "last with gram-hash detectors)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="leakprobe-scan-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        saved = canaries_for(folder, args.canaries)
        texts = [c["text"] for c in json.loads(saved.read_text())]
        leaked = texts[:: max(1, len(texts) // 997)]
        files, planted = generate(folder, args.answers, leaked)

        baseline = ledger_with(Path(scratch) / "baseline.sqlite", saved)
        base_s, base_rss, base = timed_scan(baseline, files[:1], 1)
        base_rate = int(base["scanned"]) / base_s  # type: ignore[call-overload]
        print(f"baseline, one process: {base['scanned']:,} answers in {base_s:.0f} s = {base_rate:,.0f} answers/s, "
              f"peak PSS {base_rss / 2**20:.0f} MiB")
        previous = previous_checkout(Path(scratch), args.previous)
        if previous is not None:
            theirs = ledger_with(Path(scratch) / "previous.sqlite", saved, previous)
            was_s, was_pss, was = timed_scan(theirs, files[:1], 1, previous)
            was_rate = int(was["scanned"]) / was_s  # type: ignore[call-overload]
            print(f"previous implementation ({args.previous}), one process: {was_rate:,.0f} answers/s, peak PSS "
                  f"{was_pss / 2**20:.0f} MiB; now {base_rate / was_rate:.2f}x")
        for workers in (1, 2, 4):  # workers share the parent's index: memory must not grow with them
            ledger = ledger_with(Path(scratch) / f"ledger-{workers}.sqlite", saved)
            part_s, part_rss, part = timed_scan(ledger, files[:1], workers)
            print(f"  {workers} worker(s) over the first file: {int(part['scanned']) / part_s:,.0f} answers/s, "  # type: ignore[call-overload]
                  f"peak memory of the process tree (PSS) {part_rss / 2**20:.0f} MiB")
        ledger = ledger_with(Path(scratch) / "ledger.sqlite", saved)
        elapsed, peak, report = timed_scan(ledger, files, args.workers)
        found = {f["record_id"] for f in report["findings"]}  # type: ignore[attr-defined]
        rate = int(report["scanned"]) / elapsed  # type: ignore[call-overload]
        print(f"{args.workers} workers: {report['scanned']:,} answers, {args.canaries:,} canaries, exact + fuzzy + "
              f"fragment, in {elapsed / 60:.1f} min = {rate:,.0f} answers/s ({rate / base_rate:.2f}x the baseline), "
              f"peak memory of the process tree (PSS) {peak / 2**20:.0f} MiB")
        print(f"planted leaks found: {len(found & planted)}/{len(planted)}; findings on other answers: "
              f"{len(found - planted)}; invalid lines {report['invalid']}")


if __name__ == "__main__":
    main()
