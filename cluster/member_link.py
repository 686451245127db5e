"""A connection to another broker's client port as a cluster member (docs/design.md §8,
§16): what a joining broker's update link (cluster/update.py) and a peer link
(forwarding between brokers, broker/peers.py) share.

:meth:`MemberLink.open` connects (with the cluster's TLS, ``node.tls``), says ``Hello``
with the ``MEMBER`` mechanism naming this runtime, and takes the challenge (the nonce)
the member answers in ``HelloOk``; the link then proves its key by signing it
(cluster/member_proof.py) in whatever request it makes. Frames go through the shared
sans-IO codec (clients/wire.py).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TypeVar

from batonmq.clients import wire
from batonmq.cluster.errors import BatonError
from batonmq.cluster.member_proof import MECHANISM, NONCE_BYTES

__all__ = ["MemberLink"]

L = TypeVar("L", bound="MemberLink")


class MemberLink:
    """One connection to a member, greeted as a member.

    Attributes:
        address: the member's client address (``host:port``).
        node_id: the member's node id (from its HelloOk: what a proof signs).
        nonce: the member's challenge for this connection.
        hello: the member's HelloOk.
    """

    #: What the link is for, in its error messages ("update", "peer link").
    what = "member"
    #: The Hello's client name, before ``/node/runtime``.
    client = "baton-member"

    def __init__(
        self,
        address: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        member: str,
        max_frame: int,
        error: type[BatonError],
    ) -> None:
        self.address = address
        self.reader = reader
        self.writer = writer
        self.codec = wire.FrameCodec(max_frame)
        self.member = member
        self.error = error
        self.node_id = ""
        self.nonce = b""
        self.hello: wire.HelloOk | None = None

    @classmethod
    async def open(
        cls: type[L],
        address: str,
        member: str,
        tls: ssl.SSLContext | None,
        *,
        max_frame: int,
        error: type[BatonError],
        timeout: float = 5.0,
    ) -> L:
        """Connect to the member at ``address`` as runtime ``member`` and take its
        challenge (Hello MEMBER).

        Raises:
            error: no connection, or the member refused it or sent no challenge.
        """
        host, _, port = address.rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]"), int(port), limit=1 << 20, ssl=tls),
                timeout,
            )
        except (OSError, TimeoutError, ValueError) as exc:
            raise error(f"cannot connect to {address}: {exc}") from exc
        link = cls(address, reader, writer, member, max_frame, error)
        try:
            link.send(wire.Hello(
                1, wire.PROTOCOL_VERSION, f"{cls.client}/{member}",
                {"mechanism": MECHANISM, "member": member},
            ))
            frame = await link.next(timeout)
            if isinstance(frame, wire.Error):
                raise error(
                    f"{address} refused the {cls.what} connection: {frame.message}"
                    f" (code {frame.code})"
                )
            if not isinstance(frame, wire.HelloOk):
                raise error(f"{address} refused the {cls.what} connection: {frame}")
            nonce = frame.auth.get("nonce")
            if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
                raise error(
                    f"{address} sent no member challenge in HelloOk (a broker of an older"
                    " version?)"
                )
        except BaseException:
            link.close()
            raise
        link.hello, link.nonce, link.node_id = frame, nonce, frame.node_id
        return link

    def send(self, frame: wire.Frame) -> None:
        self.writer.write(self.codec.send(frame))

    async def next(self, timeout: float | None = None) -> wire.Frame:
        """The next frame from the member (an Error frame too).

        Raises:
            error: the connection broke off or was closed.
        """
        while True:
            frame = self.codec.next_frame()
            if isinstance(frame, wire.Frame):  # else NEED_DATA: read more
                return frame
            try:
                data = await asyncio.wait_for(self.reader.read(1 << 20), timeout)
            except (OSError, TimeoutError) as exc:
                raise self.error(f"{self.what} from {self.address} broke off: {exc!r}") from exc
            if not data:
                raise self.error(f"{self.address} closed the {self.what} connection")
            self.codec.receive_data(data)

    def close(self) -> None:
        self.writer.close()
