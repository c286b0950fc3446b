"""A non-editable install carries the canary packs and filler corpora inside the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_canaries_and_a_plain_install_finds_them(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("leakprobe-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for data in ("packs/en.yaml", "packs/ko.yaml", "filler/en.yaml", "filler/ko.yaml"):
        assert f"prober/_data/canaries/{data}" in names

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    probe = ("from prober.system.resources import canaries_dir; from prober.canaries.packs import load_pack; "
             "load_pack('ko'); print(canaries_dir())")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(target)},
                         capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).is_relative_to(target)


def test_every_bench_script_imports() -> None:
    """The benchmarks are run by hand, so nothing else notices when a rename leaves one importing what is gone: each
    `bench/*.py` is loaded (not run) in a fresh interpreter, with bench/ on the path as `python bench/x.py` has."""
    loader = ("import importlib.util, pathlib, sys\n"
              "sys.path[:0] = ['bench', '.']\n"
              "for path in sorted(pathlib.Path('bench').glob('*.py')):\n"
              "    spec = importlib.util.spec_from_file_location('bench_' + path.stem, path)\n"
              "    module = importlib.util.module_from_spec(spec)\n"
              "    sys.modules[spec.name] = module\n"
              "    spec.loader.exec_module(module)\n")
    done = subprocess.run([sys.executable, "-c", loader], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
