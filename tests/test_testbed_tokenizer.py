import numpy as np
import pytest

from prober.testbed import tokenizer

pytestmark = pytest.mark.unit


def test_round_trip_ascii_and_unicode() -> None:
    for text in ["The vault code is ZEBRA-7Q4X.\n\tIndented  text!!", "한국어 문장, ß é — 東京", ""]:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_counts_differ_from_characters_and_words() -> None:
    text = "The quarterly reconciliation of account 4471-2209 is overdue."
    n = tokenizer.count(text)
    assert n not in (len(text), len(text.split()))
    assert n == len(tokenizer.encode(text))
    # Documented rules: " the" is one token, "vault" is two ("vaul" + "t"), "4471" is two.
    assert tokenizer.pieces(" the vault 4471") == [" the", " vau", "lt", " ", "447", "1"]


def test_ids_are_int32_stateless_and_deterministic() -> None:
    a = tokenizer.encode("same text, same ids")
    b = tokenizer.encode("same text, same ids")
    assert a.dtype == np.int32
    assert np.array_equal(a, b)


def test_placeholder_decodes_to_nothing_and_nul_is_dropped() -> None:
    ids = np.array([tokenizer.PLACEHOLDER_TOKEN, *tokenizer.encode("ok")], dtype=np.int32)
    assert tokenizer.decode(ids) == "ok"
    assert tokenizer.decode(tokenizer.encode("a\x00b")) == "ab"
