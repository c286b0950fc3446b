"""The reference engine's media path: images in chat messages read by a stand-in for a vision encoder, their
processed features kept in a media cache, and the faults that key that cache by what the client says or by too
little of the image.

A vision model turns an image into features that take the image's place in the prompt.  The quoting model reads
text, so the stand-in's features are the text the card reader (prober/media/card.py) finds in the image, put where
the image was (`[image: LPK-…]`).  Healthy, the cache is keyed by the image's whole digest, pixels and shape (as
vLLM keys processed media): equal images share features, which tells nobody anything they did not send; a `uuid`
is the sending tenant's own name for a digest, so a uuid-only part (`image_url: null`) finds what that tenant
sent under it and nothing else.  The faults (config.Faults) key it by the uuid alone, by 16 bits of the digest, or
by a digest without the shape.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, TypeVar

from prober.media import card
from prober.media.digest import cut, digest
from prober.media.png import Bitmap, PNGError, from_data_url
from prober.testbed.config import Faults
from prober.testbed.protocol import ImagePart, Message, TextPart

TRUNCATED_BITS = 16  # LMCache's hex_hash_to_int16
NOTHING_LEGIBLE = "no legible text"

K = TypeVar("K")
V = TypeVar("V")


class MediaRefused(ValueError):
    """An image part the engine refuses (HTTP 400): the message says why."""


class _Recent(Generic[K, V]):
    """The `capacity` most recently used entries."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> tuple[V] | None:
        """(value,) where the key is held (a value may be None), else None."""
        if key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return (self._entries[key],)

    def put(self, key: K, value: V) -> None:
        if not self.capacity:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


class MediaCache:
    """Processed media by key (thread-safe): what the stand-in read from each image (None: nothing legible)."""

    def __init__(self, faults: Faults, capacity: int, *, refusal: str | None = None) -> None:
        """`refusal`: why the model takes no images at all (every image part is refused with it)."""
        self.faults = faults
        self.refusal = refusal
        self._features: _Recent[str, str | None] = _Recent(capacity)
        self._names: _Recent[tuple[str, str], str] = _Recent(capacity)  # (tenant, uuid) -> its digest key
        self._lock = threading.Lock()

    def _key(self, image: Bitmap) -> str:
        value = digest(image, shape=not self.faults.media_hash_ignores_shape)
        return f"digest:{cut(value, TRUNCATED_BITS):04x}" if self.faults.media_hash_truncated else value.hex()

    def features(self, tenant: str, part: ImagePart) -> str | None:
        """What the part's image reads as, from the cache where its key is held (raises MediaRefused)."""
        trusted = f"uuid:{part.uuid}" if part.uuid is not None and self.faults.media_cache_trusts_uuid else None
        with self._lock:
            hit = self._features.get(trusted) if trusted else None
            if hit is not None:
                return hit[0]
            if part.image_url is None:
                return self._named(tenant, part.uuid)
        image = _image(part.image_url.url)
        key = self._key(image)
        with self._lock:
            hit = self._features.get(key)
        read = hit[0] if hit is not None else card.read(image)
        with self._lock:
            self._features.put(key, read)
            if trusted:
                self._features.put(trusted, read)
            elif part.uuid is not None:
                self._names.put((tenant, part.uuid), key)
        return read

    def _named(self, tenant: str, uuid: str | None) -> str | None:
        """A uuid-only part: the features its tenant cached under that name (the caller holds the lock)."""
        if uuid is None:
            raise MediaRefused("an image part needs an `image_url` or a `uuid`")
        key = self._names.get((tenant, uuid))
        hit = self._features.get(key[0]) if key is not None else None
        if hit is None:
            raise MediaRefused(f"no image is cached under uuid {uuid!r}: send it with its image_url")
        return hit[0]

    def see(self, tenant: str, messages: Sequence[Message]) -> list[Message]:
        """Chat messages with each image replaced by the text of its features (raises MediaRefused)."""
        if self.refusal is not None and any(m.images for m in messages):
            raise MediaRefused(self.refusal)
        return [self._seen(tenant, m) for m in messages]

    def _seen(self, tenant: str, message: Message) -> Message:
        """The message with each image part replaced by the text of its features."""
        if isinstance(message.content, str) or not message.images:
            return message
        parts = [part if isinstance(part, TextPart) else
                 TextPart(type="text", text=f"\n[image: {self.features(tenant, part) or NOTHING_LEGIBLE}]\n")
                 for part in message.content]
        return message.model_copy(update={"content": parts})


def _image(url: str) -> Bitmap:
    if not url.startswith("data:"):
        raise MediaRefused("only data: URLs are read (the reference engine fetches nothing)")
    try:
        return from_data_url(url)
    except PNGError as exc:
        raise MediaRefused(f"the image cannot be read: {exc}") from None
