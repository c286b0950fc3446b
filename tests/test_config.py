"""Settings the config switches off as the docs write it: a bare `off` (YAML reads it as false), `false` or a
quoted "off" turns a job off, a job's jitter to none and the audit's deadlines to none; `on` is no duration and
says so in one line.  (Every config the docs show, loaded: tests/test_docs.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from prober.checks import REGISTRY
from prober.config.schema import assemble_config
from prober.daemon.schedule import Timetable
from prober.domain.errors import ConfigError

pytestmark = pytest.mark.unit

TARGET = "targets: [{name: t, url: 'http://engine.example:8000/v1'}]\n"


def loaded(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "leakprobe.yaml"
    path.write_text(TARGET + text, encoding="utf-8")
    return path


@pytest.mark.parametrize("off", ["off", "Off", "false", "no", "'off'"])
def test_off_as_yaml_writes_it_switches_a_job_its_jitter_and_the_deadlines_off(tmp_path: Path, off: str) -> None:
    config = assemble_config(loaded(tmp_path, f"daemon: {{schedule: {{idle-slots: {off}, campaign: 6h}}, "
                                              f"jitter: {{campaign: {off}}}}}\n"
                                              f"audit: {{deadline: {off}, target_deadline: {off}}}\n"), environ={})
    assert config.daemon.schedule == {"idle-slots": None, "campaign": 21_600.0}
    assert config.daemon.jitter == {"campaign": 0.0}
    assert config.audit.deadline is None and config.audit.target_deadline is None
    timetable = Timetable(config.daemon, REGISTRY)
    assert "idle-slots" not in timetable.jobs and "campaign" in timetable.jobs
    assert timetable.jitter("campaign", 60.0) == 0


def test_a_duration_still_reads_as_before_and_on_is_none(tmp_path: Path) -> None:
    config = assemble_config(loaded(tmp_path, "daemon: {schedule: {sentinel: 1m30s}, jitter: {sentinel: 0}}\n"
                                              "audit: {deadline: 30m}\n"), environ={})
    assert config.daemon.schedule == {"sentinel": 90.0} and config.daemon.jitter == {"sentinel": 0.0}
    assert config.audit.deadline == 1_800.0
    for wrong, said in (("daemon: {schedule: {sentinel: on}}", "daemon.schedule.sentinel: expected a duration"),
                        ("daemon: {schedule: {sentinel: 0}}", "a duration must be positive"),
                        ("audit: {deadline: yes}", "audit.deadline: expected a duration"),
                        ("daemon: {jitter: {sentinel: soon}}", "daemon.jitter.sentinel: expected a duration")):
        with pytest.raises(ConfigError, match=said):
            assemble_config(loaded(tmp_path, wrong + "\n"), environ={})
