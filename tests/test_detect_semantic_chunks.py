"""The semantic detector's chunk windows count words by where each run of whitespace starts: one table lookup of
the code points, which must find exactly the runs `\\s+` does, in every script and beyond the Basic Plane."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prober.detect.semantic import _space_runs

pytestmark = pytest.mark.unit

SPACES = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2007\u200a\u2028\u2029\u202f\u205f\u3000"
WORDS = st.text(alphabet=st.sampled_from([*"ab한국어.,!", *SPACES, "\u200b", "😀", "\ufeff"]), max_size=80)


@settings(max_examples=400, deadline=None)
@given(WORDS | st.text(max_size=60))
@example("")
@example("   ")
@example("소포 번호\u3000이름 씨 — 보관 장소 😀 here")
def test_the_runs_are_where_a_regular_expression_finds_them(text: str) -> None:
    assert _space_runs(text).tolist() == [m.start() for m in re.finditer(r"\s+", text)]
