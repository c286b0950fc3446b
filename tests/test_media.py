"""Media canaries (prober/media): a canary drawn on a card reads back through PNG and a data URL; the PNG reader
takes what clients send and refuses hostile files with a reason; the reference digest, cut short or blind to the
shape, collides where the media-cache check constructs collisions; the reference engine's media cache keeps tenants
apart unless a fault keys it by the uuid or by too little; how targets' refusals of images make the check moot;
and how a chat prompt carries images to an OpenAI-compatible engine."""

from __future__ import annotations

import base64
import json
import struct
import zlib

import httpx
import pytest

from prober.checks.media_cache import refuses_images
from prober.media import card
from prober.media.digest import colliding, cut, digest
from prober.media.font import BY_INK, GLYPHS
from prober.media.png import Bitmap, PNGError, data_url, decode, encode, from_data_url
from prober.targets import Media, Prompt
from prober.testbed.config import Faults
from prober.testbed.media import MediaCache, MediaRefused
from prober.testbed.protocol import ChatRequest, ImagePart, ImageURL
from tests.support.mockhttp import ask, chat, send

pytestmark = pytest.mark.unit

CANARY = "LPK-0123ABCD-EFGHJKMN-PQRSTVWX-YZ456789"
OTHER = "LPK-9876ZYXW-VTSRQPNM-KJHGFEDC-BA012345"


def png_of(width: int, height: int, colour: int, rows: list[tuple[int, bytes]], idat: bytes | None = None) -> bytes:
    """A PNG whose rows are given as (filter type, filtered bytes): files made the way other encoders make them
    (`idat`: the image data chunk's body as given instead)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    raw = b"".join(bytes([kind]) + row for kind, row in rows)
    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    data = zlib.compress(raw) if idat is None else idat
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def test_a_card_reads_back_through_png_and_a_data_url() -> None:
    drawn = card.draw(CANARY)
    assert (drawn.width, drawn.height) == (card.WIDTH, card.HEIGHT)
    assert card.lines_of(CANARY) == ["LPK-0123ABCD-EFGHJKMN-", "PQRSTVWX-YZ456789"]  # cut after a hyphen
    url = data_url(drawn)
    assert url.startswith("data:image/png;base64,") and len(url) < 2_000  # white paper inflates well
    assert from_data_url(url) == drawn and card.read(from_data_url(url)) == CANARY
    assert card.draw(OTHER).width == drawn.width  # every card one size: one processed length in any model
    with pytest.raises(ValueError, match="only, not ' acelorsw'"):
        card.draw("lower case")
    with pytest.raises(ValueError, match="3 of 22"):
        card.draw("-".join(["ABCDEFGHJK"] * 8))


def test_the_font_tells_every_glyph_apart() -> None:
    assert len(BY_INK) == len(GLYPHS) and all(len(rows) == 7 and all(len(r) == 5 for r in rows)
                                              for rows in GLYPHS.values())


def test_reshaped_pixels_are_the_same_bytes_and_read_as_nothing() -> None:
    drawn = card.draw(CANARY)
    swapped = card.reshaped(drawn)
    assert (swapped.width, swapped.height, swapped.data) == (drawn.height, drawn.width, drawn.data)
    assert card.read(swapped) is None and card.read(Bitmap(8, 8, bytes(64))) is None


def test_the_reader_undoes_every_row_filter_and_reads_colour_as_grey() -> None:
    """Grey rows 10,20,30 / 40,50,60 / 70,80,90 / 100,110,120 written with Sub, Up, Average and Paeth."""
    grey = png_of(3, 4, 0, [(1, bytes([10, 10, 10])), (2, bytes([30, 30, 30])), (3, bytes([70 - 20, 80 - 60, 90 - 70])),
                            (4, bytes([100 - 70, 110 - 100, 120 - 110]))])
    assert decode(grey).data == bytes(range(10, 130, 10))
    rgb = png_of(2, 1, 2, [(0, bytes([255, 255, 255, 255, 0, 0]))])
    assert decode(rgb).data == bytes([255, 76])  # luminance: white, and red at 0.299
    assert decode(png_of(1, 1, 6, [(0, bytes([0, 0, 0, 7]))])).data == b"\0"  # alpha ignored


@pytest.mark.parametrize(("mangle", "reason"), [
    (lambda f: f[:-30], "cut short|no IHDR"),
    (lambda f: f[:20] + bytes([f[20] ^ 1]) + f[21:], "CRC"),
    (lambda f: b"GIF89a" + f[6:], "not a PNG"),
])
def test_a_broken_file_is_refused_with_a_reason(mangle: object, reason: str) -> None:
    with pytest.raises(PNGError, match=reason):
        decode(mangle(encode(card.draw(CANARY))))  # type: ignore[operator]


def test_a_file_that_would_inflate_past_its_size_or_the_cap_is_refused_before_it_is_held() -> None:
    with pytest.raises(PNGError, match="more than"):
        decode(png_of(8192, 4096, 0, [(0, b"")]))  # 32 M pixels, over MAX_PIXELS: refused before inflating
    bomb = png_of(4, 4, 0, [(0, bytes(4))] * 4 + [(0, bytes(1 << 20))])  # a megabyte past the four rows it has
    with pytest.raises(PNGError, match="inflates past the 20 bytes a 4x4 image has"):
        decode(bomb)
    with pytest.raises(PNGError, match="inflates to 5 bytes, not the 20"):
        decode(png_of(4, 4, 0, [(0, bytes(4))]))
    with pytest.raises(PNGError, match="does not inflate"):
        decode(png_of(4, 4, 0, [], idat=b"not zlib"))
    with pytest.raises(PNGError, match="interlacing"):
        decode(png_of(1, 1, 3, [(0, b"\0")]))  # a palette
    with pytest.raises(PNGError, match="base64"):
        from_data_url("data:image/png;base64,not*base64")


def test_the_digest_covers_the_shape_unless_the_fault_leaves_it_out() -> None:
    drawn = card.draw(CANARY)
    swapped = card.reshaped(drawn)
    assert digest(drawn) != digest(swapped) and digest(drawn, shape=False) == digest(swapped, shape=False)
    assert cut(bytes.fromhex("00ff12ab"), 16) == 0x12AB  # the last four hex digits, as LMCache kept them


def test_a_colliding_card_is_found_and_still_reads_as_its_own() -> None:
    victim, mine = card.draw(CANARY), card.draw(OTHER)
    wanted = cut(digest(victim), 12)
    found = colliding(mine, wanted, 12, seconds=600)
    assert found is not None and cut(digest(found), 12) == wanted and digest(found) != digest(victim)
    assert card.read(found) == OTHER  # the nonce is in the bottom row, outside every cell
    assert colliding(mine, cut(digest(victim), 24), 24, seconds=1e-9) is None  # out of time: none, not a hang


def part(image: Bitmap | None, name: str | None = None) -> ImagePart:
    return ImagePart(type="image_url", image_url=ImageURL(url=data_url(image)) if image else None, uuid=name)


def test_a_healthy_media_cache_keeps_tenants_apart() -> None:
    cache = MediaCache(Faults(), 16)
    a, b = card.draw(CANARY), card.draw(OTHER)
    assert cache.features("tenant-a", part(a, "u1")) == CANARY
    assert cache.features("tenant-b", part(b, "u1")) == OTHER  # the same uuid, its own image
    assert cache.features("tenant-a", part(None, "u1")) == CANARY  # its own name for its own image
    with pytest.raises(MediaRefused, match="no image is cached under uuid 'u1'"):
        MediaCache(Faults(), 16).features("tenant-b", part(None, "u1"))
    assert cache.features("tenant-b", part(card.reshaped(a))) is None
    with pytest.raises(MediaRefused, match="only data: URLs"):
        cache.features("tenant-a", ImagePart(type="image_url", image_url=ImageURL(url="https://x/y.png")))
    with pytest.raises(MediaRefused, match="needs an `image_url` or a `uuid`"):
        cache.features("tenant-a", ImagePart(type="image_url"))


def test_each_fault_serves_one_tenants_image_to_another() -> None:
    a, b = card.draw(CANARY), card.draw(OTHER)
    trusting = MediaCache(Faults(media_cache_trusts_uuid=True), 16)
    trusting.features("tenant-a", part(a, "u1"))
    assert trusting.features("tenant-b", part(b, "u1")) == CANARY
    assert trusting.features("tenant-b", part(None, "u1")) == CANARY
    truncated = MediaCache(Faults(media_hash_truncated=True), 16)
    truncated.features("tenant-a", part(a))
    found = colliding(b, cut(digest(a), 16), 16, seconds=600)
    assert found is not None and truncated.features("tenant-b", part(found)) == CANARY
    assert MediaCache(Faults(), 16).features("tenant-b", part(found)) == OTHER
    shapeless = MediaCache(Faults(media_hash_ignores_shape=True), 16)
    shapeless.features("tenant-a", part(a))
    assert shapeless.features("tenant-b", part(card.reshaped(a))) == CANARY


def test_a_text_only_model_refuses_images_and_an_image_becomes_text_where_it_stood() -> None:
    body = ChatRequest.model_validate({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is the code word?"},
        {"type": "image_url", "image_url": {"url": data_url(card.draw(CANARY))}}]}]})
    with pytest.raises(MediaRefused, match="gemma3-270m is not a multimodal model"):
        MediaCache(Faults(), 16, refusal="gemma3-270m is not a multimodal model").see("tenant-a", body.messages)
    (seen,) = MediaCache(Faults(), 16).see("tenant-a", body.messages)
    assert seen.text == f"What is the code word?\n[image: {CANARY}]\n"
    assert ChatRequest.model_validate({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": None, "uuid": "u1"}]}]}).messages[0].images  # an image alone is content


@pytest.mark.parametrize(("status", "body", "moot"), [
    (500, {"error": {"code": 500, "message": "image input is not supported - hint: if this is unexpected, you may "
                                            "need to provide the mmproj", "type": "server_error"}}, True),  # llama.cpp
    (400, {"error": {"message": "gemma is not a multimodal model", "type": "BadRequestError", "code": 400}}, True),
    (400, {"error": {"message": "Unrecognized request argument supplied: uuid"}}, True),  # a plain part: any 4xx
    (500, {"error": {"message": "CUDA out of memory"}}, False),
    (401, {"error": {"message": "invalid api key"}}, False),
    (429, {"error": {"message": "slow down"}}, False),
])
def test_what_makes_a_target_one_that_takes_no_images(status: int, body: dict[str, object], moot: bool) -> None:
    answer = ask(chat(lambda _: send(status, body)), Prompt("x", media=(Media("data:image/png;base64,"),)))
    why = refuses_images(answer)
    assert (why is not None) is moot, why
    if why:
        assert why.startswith(f"the target takes no images (HTTP {status}: ")


def test_a_chat_prompt_carries_its_images_as_openai_parts_with_vllms_uuid() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return send(200, {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})

    url = data_url(card.draw(CANARY))
    ask(chat(answer), Prompt("Read it.", media=(Media(url, "u1"), Media(None, "u2"), Media(url))))
    (message,) = json.loads(seen[0].content)["messages"]
    assert message["content"] == [{"type": "text", "text": "Read it."},
                                  {"type": "image_url", "image_url": {"url": url}, "uuid": "u1"},
                                  {"type": "image_url", "image_url": None, "uuid": "u2"},
                                  {"type": "image_url", "image_url": {"url": url}}]
    assert base64.b64decode(url.split(",", 1)[1]).startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="takes no images"):
        ask(chat(answer), Prompt("Read it.", media=(Media(url),)), api="completions")
