"""The sealed log: every record authenticated and encrypted, around any backend.

:class:`SealedLog` wraps a :class:`~batonmq.cluster.log.base.Log`: it seals each record
on :meth:`~SealedLog.append` and opens it on :meth:`~SealedLog.read`. The backend sees
only sealed bytes, so a process without the key can neither read message bodies from
the log (its files, its Kafka topic) nor append a record the keyed brokers apply
(docs/log-sealing.md has the threat model).

A sealed record (all integers big-endian)::

    b"\\xc1S" | version (1 byte, 1) | key id length (1 byte) | key id (UTF-8)
          | nonce (12 bytes, random) | AES-256-GCM ciphertext + 16-byte tag

``\\xc1`` is the one byte msgpack never uses, so a sealed record is never mistaken for
an event by a broker without sealing (it counts it malformed). The key of id ``K`` is
HKDF-SHA256 of the secret (salt ``baton-log-seal-v1``, info ``K``); the associated data
binds the record to the log's context (its topic or directory name, or the key file's
``context``) and to the key id, so a record cannot be moved to another cluster's log;
for physical partition K >= 1 of a log set it also binds K (``\x00partition=K`` after the
key id), so a record cannot be replayed into another partition either. Partition 0's
associated data is what it was before log sets, so records written then still open.
:class:`SealedLogSet` seals every partition of a :class:`~batonmq.cluster.log.base.LogSet`.

A record that does not open (unknown or retired key, bad tag, not sealed at all) is
read as :data:`~batonmq.cluster.log.base.UNOPENED` at its offset: the applier counts
it ignored (reason ``unopened``) and goes on, the same way on every replica.

The key file (TOML) and its rotation are in :class:`KeyFile`. Crypto is the
``cryptography`` package's AESGCM and HKDF (a well-kept implementation, not ours).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
import os
import time
import tomllib
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from batonmq.cluster.errors import InvalidArgument, LogUnavailable
from batonmq.cluster.log.base import UNOPENED, Log, LogSet, Record, partition_url

__all__ = ["SealKey", "KeyRing", "KeyFile", "SealedLog", "SealedLogSet", "log_context", "MAGIC"]

log = logging.getLogger(__name__)

MAGIC: Final = b"\xc1S"
_VERSION: Final = 1
_NONCE: Final = 12
_TAG: Final = 16
_SALT: Final = b"baton-log-seal-v1"
#: Bytes a sealed record adds at most: magic, version, id length, id (<= 64), nonce, tag.
OVERHEAD: Final = 2 + 1 + 1 + 64 + _NONCE + _TAG
#: Least seconds between two looks at the key file's mtime.
POLL_SECONDS: Final = 1.0
#: Unknown key ids remembered (each looked for once until the file changes).
MAX_MISSING: Final = 1024


@dataclass(frozen=True, slots=True)
class SealKey:
    """One key of the key file.

    Attributes:
        id: short name written into every record it seals (1..64 bytes of UTF-8).
        secret: the shared secret (at least 16 bytes); the AES key is derived from it.
        not_before: seals only from then on (it opens at once); None: at once.
        not_after: retired from then on: neither seals nor opens; None: never.
    """

    id: str
    secret: bytes
    not_before: float | None = None
    not_after: float | None = None

    def retired(self, now: float) -> bool:
        return self.not_after is not None and now >= self.not_after

    def seals(self, now: float) -> bool:
        return not self.retired(now) and (self.not_before is None or now >= self.not_before)


class KeyRing:
    """The keys of one key file, with their derived AES-GCM ciphers.

    Args:
        keys: in file order; the last one that may seal now seals.
        context: bound into every record's associated data; None: the log's own.
    """

    def __init__(self, keys: Sequence[SealKey], context: str | None = None) -> None:
        if not keys:
            raise InvalidArgument("a log key file needs at least one [[key]]")
        self.keys = tuple(keys)
        self.context = context
        self._ciphers: dict[str, AESGCM] = {}
        self._by_id = {key.id: key for key in self.keys}
        for key in self.keys:
            if key.id in self._ciphers:
                raise InvalidArgument(f"log key id {key.id!r} appears twice")
            derived = HKDF(
                algorithm=hashes.SHA256(), length=32, salt=_SALT, info=key.id.encode()
            ).derive(key.secret)
            self._ciphers[key.id] = AESGCM(derived)

    def sealing(self, now: float) -> tuple[bytes, AESGCM] | None:
        """The key id and cipher to seal with now (the last eligible), or None."""
        for key in reversed(self.keys):
            if key.seals(now):
                return key.id.encode(), self._ciphers[key.id]
        return None

    def opening(self, key_id: str, now: float) -> AESGCM | None:
        """The cipher of a key that may open now, or None (unknown or retired)."""
        key = self._by_id.get(key_id)
        if key is None or key.retired(now):
            return None
        return self._ciphers[key_id]

    def knows(self, key_id: str) -> bool:
        return key_id in self._ciphers

    @classmethod
    def parse(cls, text: str, where: str = "log key file") -> "KeyRing":
        """Read a key file's TOML text.

        Raises:
            InvalidArgument: not TOML, or a key entry is malformed (says which and why).
        """
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgument(f"{where} is not valid TOML: {exc}") from exc
        unknown = set(doc) - {"key", "context"}
        if unknown:
            raise InvalidArgument(f"{where}: unknown key(s) {sorted(unknown)} (known: context, key)")
        context = doc.get("context")
        if context is not None and not isinstance(context, str):
            raise InvalidArgument(f"{where}: context must be a string")
        entries = doc.get("key", [])
        if not isinstance(entries, list):
            raise InvalidArgument(f"{where}: key must be an array of tables ([[key]])")
        return cls([_entry(e, i, where) for i, e in enumerate(entries)], context)


def _when(value: Any, name: str, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.timestamp()
    if type(value) in (int, float):
        return float(value)
    raise InvalidArgument(
        f"{where}: {name} must be a date-time with a zone (2026-11-24T00:00:00Z) or epoch seconds"
    )


def _entry(raw: Any, index: int, where: str) -> SealKey:
    place = f"{where}: key #{index + 1}"
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{place} is not a table")
    unknown = set(raw) - {"id", "secret", "not_before", "not_after"}
    if unknown:
        raise InvalidArgument(f"{place}: unknown field(s) {sorted(unknown)}")
    key_id, secret = raw.get("id"), raw.get("secret")
    if not isinstance(key_id, str) or not 1 <= len(key_id.encode()) <= 64 or not key_id.isprintable():
        raise InvalidArgument(f"{place}: id must be 1..64 bytes of printable text")
    if not isinstance(secret, str):
        raise InvalidArgument(f"{place} ({key_id}): secret must be a base64 string")
    try:
        decoded = base64.b64decode(secret, validate=True)
    except binascii.Error as exc:
        raise InvalidArgument(f"{place} ({key_id}): secret is not base64: {exc}") from exc
    if len(decoded) < 16:
        raise InvalidArgument(f"{place} ({key_id}): secret must be at least 16 bytes (32 advised)")
    return SealKey(
        key_id,
        decoded,
        _when(raw.get("not_before"), "not_before", place),
        _when(raw.get("not_after"), "not_after", place),
    )


class KeyFile:
    """A key file on disk, read again when its mtime changes (looked at most once a
    second) or when :meth:`reload` is called (SIGHUP).

    A file that goes bad while the broker runs (a typo in an edit) keeps the keys read
    last, with an error in the log: a broker never loses its keys to an edit.

    Args:
        path: the TOML key file.
        clock: wall-clock seconds (injected by tests).

    Raises:
        InvalidArgument: the file cannot be read or is malformed (at open only).
    """

    def __init__(self, path: str, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self._mtime = -1
        self._polled = 0.0
        self._missing: set[str] = set()
        self.ring = self._read()

    def _read(self) -> KeyRing:
        try:
            with open(self.path, encoding="utf-8") as f:
                stat = os.fstat(f.fileno())
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"cannot read log key file {self.path}: {exc}") from exc
        ring = KeyRing.parse(text, f"log key file {self.path}")
        if stat.st_mtime_ns != self._mtime:
            self._missing = set()  # a changed file: unknown ids are worth a look again
        self._mtime = stat.st_mtime_ns
        return ring

    def reload(self) -> bool:
        """Read the file again now. Returns whether the keys were replaced."""
        try:
            self.ring = self._read()
        except InvalidArgument as exc:
            log.error("log key file not reloaded, keeping the keys read before: %s", exc)
            return False
        log.info("log key file %s read: keys %s", self.path, [k.id for k in self.ring.keys])
        return True

    def look_for(self, key_id: str) -> None:
        """Read the file again if ``key_id`` is unknown and the file changed since it was
        read: another broker's key file may have got a new key first
        (docs/log-sealing.md: add keys before they seal). An unknown id is looked for
        once until the file changes (the first :data:`MAX_MISSING` of them are
        remembered; past them each look is one ``stat``), so records naming ever new
        foreign ids make a broker neither read the file nor log a line per record: it
        is read again, with its one INFO line, only when it changed."""
        if self.ring.knows(key_id) or key_id in self._missing:
            return
        if len(self._missing) < MAX_MISSING:
            self._missing.add(key_id)
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            return  # gone for now: the keys read before stay
        if mtime != self._mtime:
            self.reload()

    def poll(self) -> None:
        """Reload if the file's mtime changed (at most one look per POLL_SECONDS)."""
        now = time.monotonic()
        if now - self._polled < POLL_SECONDS:
            return
        self._polled = now
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            return
        if mtime != self._mtime:
            self.reload()


def log_context(url: str) -> str:
    """The default sealing context of a log URL: its last path part (the Kafka topic,
    the file log's directory name, the memory log's name), without options."""
    _, _, rest = url.partition(":")
    rest = rest.partition("?")[0].rstrip("/")
    return rest.rsplit("/", 1)[-1]


class SealedLog(Log):
    """A :class:`Log` whose records are sealed on append and opened on read.

    Args:
        inner: the backend holding the sealed records (closed with this log). Its
            :attr:`~batonmq.cluster.log.base.Log.partition` goes into the associated data
            (partition 0: nothing, as before log sets).
        keys: the key file (polled for changes on every append and read batch).
    """

    def __init__(self, inner: Log, keys: KeyFile) -> None:
        self.inner = inner
        self.keys = keys
        self.url = inner.url
        self.partition = inner.partition
        # The context comes from the set's URL, the same for every partition.
        self._context_url = partition_url(inner.url, 0) if inner.partition == 0 else (
            inner.url.removesuffix(f"#partition={inner.partition}")
        )
        self.max_record = inner.max_record - OVERHEAD
        self.max_append_bytes = inner.max_append_bytes
        self.unopened = 0  # records this process could not open (not replicated)
        self._aad_ring: KeyRing | None = None
        self._aads: dict[bytes, bytes] = {}

    @property
    def sync_observer(self) -> Callable[[float], None] | None:
        return self.inner.sync_observer

    @sync_observer.setter
    def sync_observer(self, value: Callable[[float], None] | None) -> None:
        self.inner.sync_observer = value

    def _aad(self, key_id: bytes) -> bytes:
        ring = self.keys.ring
        if ring is not self._aad_ring:  # a reloaded file may name another context
            self._aad_ring, self._aads = ring, {}
        aad = self._aads.get(key_id)
        if aad is None:
            context = ring.context if ring.context is not None else log_context(self._context_url)
            aad = _SALT + b"\x00" + context.encode() + b"\x00" + key_id
            if self.partition:
                # A key id is printable (no NUL), so no partition's data equals another's.
                aad += b"\x00partition=" + str(self.partition).encode()
            self._aads[key_id] = aad
        return aad

    def seal(self, records: Sequence[bytes]) -> list[bytes]:
        """Seal records with the current sealing key (no I/O but the key file poll).

        Raises:
            LogUnavailable: no key may seal now (all retired, or none yet valid).
            InvalidArgument: a record is larger than :attr:`max_record`.
        """
        self.keys.poll()
        chosen = self.keys.ring.sealing(self.keys.clock())
        if chosen is None:
            raise LogUnavailable(f"no key in {self.keys.path} may seal now (retired or not yet valid)")
        key_id, cipher = chosen
        head = MAGIC + bytes((_VERSION, len(key_id))) + key_id
        aad = self._aad(key_id)
        nonces = os.urandom(_NONCE * len(records))  # one syscall per batch, not per record
        out = []
        for i, record in enumerate(records):
            if len(record) > self.max_record:
                raise InvalidArgument(
                    f"record of {len(record)} bytes is over the log's limit of {self.max_record}"
                )
            nonce = nonces[i * _NONCE : (i + 1) * _NONCE]
            out.append(head + nonce + cipher.encrypt(nonce, bytes(record), aad))
        return out

    def open(self, record: bytes, now: float | None = None) -> bytes:
        """Open one sealed record; :data:`UNOPENED` if it does not open.

        Args:
            now: the wall-clock time retirement is judged at (default: the key file's
                clock now).
        """
        ok = (
            len(record) >= 4 + _NONCE + _TAG
            and record[:2] == MAGIC
            and record[2] == _VERSION
        )
        if ok:
            n = record[3]
            start = 4 + n
            try:
                key_id = record[4:start].decode()
            except UnicodeDecodeError:
                key_id, ok = "", False
        if ok:
            self.keys.look_for(key_id)
            cipher = self.keys.ring.opening(key_id, self.keys.clock() if now is None else now)
            if cipher is not None and len(record) >= start + _NONCE + _TAG:
                nonce = record[start : start + _NONCE]
                try:
                    return cipher.decrypt(nonce, record[start + _NONCE :], self._aad(record[4:start]))
                except InvalidTag:
                    pass
        self.unopened += 1
        return UNOPENED

    async def append(self, records: Sequence[bytes]) -> int:
        if not records:
            raise InvalidArgument("append needs at least one record")
        return await self.inner.append(self.seal(records))

    async def read(self, start: int, *, max_batch: int = 1024) -> AsyncGenerator[list[Record], None]:
        reader = self.inner.read(start, max_batch=max_batch)
        try:
            async for batch in reader:
                self.keys.poll()
                now = self.keys.clock()
                yield [(offset, self.open(record, now)) for offset, record in batch]
        finally:
            await reader.aclose()

    async def start_offset(self) -> int:
        return await self.inner.start_offset()

    async def end_offset(self) -> int:
        return await self.inner.end_offset()

    async def truncate_before(self, offset: int) -> None:
        await self.inner.truncate_before(offset)

    async def close(self) -> None:
        await self.inner.close()


class SealedLogSet(LogSet):
    """Every partition of a :class:`LogSet` sealed (a :class:`SealedLog` each, with the
    same keys; partition K bound into its records' associated data).

    Args:
        inner: the set holding the sealed records (closed with this one).
        keys: the key file.
    """

    def __init__(self, inner: LogSet, keys: KeyFile) -> None:
        super().__init__(inner.url)
        self.inner = inner
        self.keys = keys

    @classmethod
    async def wrap(cls, inner: LogSet, keys: KeyFile) -> "SealedLogSet":
        """Seal the open set ``inner``'s partitions."""
        sealed = cls(inner, keys)
        await sealed.refresh()
        return sealed

    async def _existing(self) -> int:
        return await self.inner.refresh()

    async def _create(self, count: int) -> None:
        await self.inner.grow(count)

    async def _open_partition(self, k: int) -> Log:
        return SealedLog(self.inner.partition(k), self.keys)

    async def _close_backend(self) -> None:
        await self.inner.close()
