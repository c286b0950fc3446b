"""The secret model: every credential, in every encoding a server may echo, is replaced wherever it lands —
whatever the key, whatever surrounds it, wherever a window boundary falls.  Keys and encodings come from
hypothesis; the encoders are the hostile engine's own (tests/support/hostile.py), written without the scrubber."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from prober.probing.secrets import scrubber_for
from prober.targets.credentials import Secret
from prober.text.scrub import STEP, Scrubber
from tests.support.hostile import ENCODERS, assert_no_key, key_traces

pytestmark = pytest.mark.unit

KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."
# Keys as providers mint them: random-looking (a run of zeros is no key, and any text around it would hold it).
keys = st.builds(lambda prefix, body: prefix + body, st.sampled_from(["", "sk-", "sk-proj-", "hf_", "key."]),
                 st.text(KEY_ALPHABET, min_size=16, max_size=64).filter(lambda k: len(set(k)) >= 10))
surroundings = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=200)
encodings = st.sampled_from(sorted(ENCODERS))


@settings(max_examples=300, deadline=None)
@given(keys, encodings, surroundings, surroundings)
# Text that reads as an escape with the key's first characters: `%00`, `\\xab` decoded had swallowed them.
@example("0000000123456789", "raw", "%", "")
@example("ab0123456789cdefgh", "raw", "\\x", "")
def test_every_encoding_of_any_key_is_replaced(key: str, encoding: str, before: str, after: str) -> None:
    assume(not key_traces(before, [key]) and not key_traces(after, [key]))  # text that holds it already
    scrubber = Scrubber({"key of tenant-a": key})
    echoed = before + ENCODERS[encoding](key) + after
    scrubbed = scrubber.text(echoed)
    assert_no_key(encoding, scrubbed, [key])
    assert "[redacted key of tenant-a" in scrubbed


@settings(max_examples=200, deadline=None)
@given(keys, st.text(KEY_ALPHABET + ": ", max_size=12), st.sampled_from([base64.b64encode,
                                                                        base64.urlsafe_b64encode]))
def test_a_key_anywhere_inside_base64_is_replaced(key: str, prefix: str, encode: object) -> None:
    """`user:KEY`, `Bearer KEY`, `Authorization: Bearer KEY` — any prefix, so every byte alignment."""
    assert callable(encode)
    echoed = encode((prefix + key + "\r\n").encode()).decode()
    scrubbed = Scrubber({"key": key}).text(f"header={echoed};")
    assert_no_key("base64", scrubbed, [key])


@settings(max_examples=100, deadline=None)
@given(keys, encodings, st.integers(0, 3 * STEP))
def test_a_window_boundary_never_splits_an_echo(key: str, encoding: str, offset: int) -> None:
    filler = "lumber and lamp oil for the valley depot " * (4 * STEP // 40)
    echoed = filler[:offset] + ENCODERS[encoding](key) + filler[offset:]
    assert_no_key(encoding, Scrubber({"key": key}).text(echoed), [key])
    assert_no_key(encoding, Scrubber({"key": key}).bytes(echoed.encode()), [key])


@settings(max_examples=200, deadline=None)
@given(keys, keys, surroundings)
def test_text_without_a_key_is_left_as_it_was(key: str, other: str, text: str) -> None:
    """No false positives on ordinary text, nor on another key's encodings."""
    scrubber = Scrubber({"key": key})
    for candidate in (text, f"{text} {other} " + base64.b64encode(other.encode()).decode()):
        if key.lower() in candidate.lower() or other.lower() == key.lower():
            continue
        assert scrubber.text(candidate) == candidate


@given(st.binary(max_size=600), keys)
def test_bytes_that_are_not_utf8_keep_every_byte_but_the_key(data: bytes, key: str) -> None:
    scrubber = Scrubber({"key": key})
    assert scrubber.bytes(data) == data or key.encode() in data
    mixed = data + f"Bearer {key}".encode() + data
    scrubbed = scrubber.bytes(mixed)
    assert key.encode() not in scrubbed and scrubbed.startswith(data[: max(0, len(data) - 1)])


def test_every_credential_of_a_run_registers_the_same_forms() -> None:
    """Tenant keys, the canary key and a shared ledger's password: one model, every encoding."""
    tenant, canary, password = "sk-tenant-alpha-7f3a9c21d0", "canary-key-0123456789abcdef", "pg-pass-Zq81xw!"
    scrubber = scrubber_for({"tenant-a": Secret(tenant)}, {"LEAKPROBE_CANARY_KEY": canary},
                            ledger=f"postgresql://probe:{password.replace('!', '%21')}@db:5432/leakprobe")
    for name, encode in ENCODERS.items():
        for secret in (tenant, canary, password):
            assert_no_key(name, scrubber.text(json.dumps({"echo": encode(secret)})), [secret])
    labels = scrubber.text(f"{tenant} {canary} {password}")
    assert labels == "[redacted key of tenant-a] [redacted canary key] [redacted ledger password]"


def test_a_replacement_keeps_json_valid() -> None:
    """Bodies are scrubbed before they are parsed: a label never breaks the JSON around it."""
    key = "sk-tenant-alpha-7f3a9c21d0"
    body = json.dumps({"error": {name: encode(key) for name, encode in ENCODERS.items()}}).encode()
    parsed = json.loads(Scrubber({"key": key}).bytes(body))
    assert all(value.startswith(("[redacted", "QmVh", "dGVu", "b3Bz", "dTp", "QXV0")) or "[redacted" in value
               for value in parsed["error"].values()), parsed
