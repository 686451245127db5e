"""/api/nodes marks the members the replicated membership suspects (the console's badge)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from aiohttp.test_utils import make_mocked_request

from batonmq.broker.access import Rights
from batonmq.broker.admin import AdminServer
from batonmq.broker.admin_login import ACTOR, Actor
from batonmq.broker.config import BrokerConfig
from batonmq.cluster.membership import Membership
from batonmq.cluster.users import Users


class _Broker:
    """The two things AdminServer.nodes reads: the topology and the membership."""

    def __init__(self, ms: Membership) -> None:
        self.users = Users()  # the default guest, an admin
        self.node = SimpleNamespace(state=SimpleNamespace(membership=ms, users=self.users))
        self.ms = ms
        self.config = BrokerConfig(data_dir="unused")

    def refused(self, what: str) -> None:
        pass

    async def current_topology(self) -> dict[str, Any]:
        return {
            "view": self.ms.view_seq,
            "instances": [
                {"node_id": key.split("/")[0], "runtime": key.split("/")[1]}
                for key in self.ms.members
            ],
        }


def _as_guest(broker: _Broker) -> Any:
    """A GET /api/nodes that logged in as the default guest (an admin)."""
    request = make_mocked_request("GET", "/api/nodes")
    request[ACTOR] = Actor(Rights(lambda: broker.users, "guest", broker.refused))
    return request


async def test_a_silent_member_is_suspected_and_a_beating_one_is_not() -> None:
    ms = Membership(suspect_beats=6)
    ms.members = ["a/r1", "b/r2", "c/r3"]
    ms.silence = {
        "b/r2": {"a/r1": 6, "c/r3": 2},  # a beat 6 times since b's last beat: suspected
        "c/r3": {"a/r1": 5},  # not yet
    }
    ms.left = set()
    broker = _Broker(ms)
    server = AdminServer(broker, metrics=None)  # type: ignore[arg-type]
    response = await server.nodes(_as_guest(broker))
    body = json.loads(response.text or "")
    assert [(i["node_id"], i["suspected"]) for i in body["instances"]] == [
        ("a", False), ("b", True), ("c", False)
    ]
    ms.left = {"c/r3"}  # a member that said it leaves is suspected at once
    response = await server.nodes(_as_guest(broker))
    assert [i["suspected"] for i in json.loads(response.text or "")["instances"]] == [
        False, True, True
    ]
