"""/api/nodes marks the members the replicated membership suspects (the console's badge)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from aiohttp.test_utils import make_mocked_request

from batonmq.broker.admin import AdminServer
from batonmq.cluster.membership import Membership


class _Broker:
    """The two things AdminServer.nodes reads: the topology and the membership."""

    def __init__(self, ms: Membership) -> None:
        self.node = SimpleNamespace(state=SimpleNamespace(membership=ms))
        self.ms = ms

    def topology(self) -> dict[str, Any]:
        return {
            "view": self.ms.view_seq,
            "instances": [
                {"node_id": key.split("/")[0], "runtime": key.split("/")[1]}
                for key in self.ms.members
            ],
        }


async def test_a_silent_member_is_suspected_and_a_beating_one_is_not() -> None:
    ms = Membership(suspect_beats=6)
    ms.members = ["a/r1", "b/r2", "c/r3"]
    ms.silence = {
        "b/r2": {"a/r1": 6, "c/r3": 2},  # a beat 6 times since b's last beat: suspected
        "c/r3": {"a/r1": 5},  # not yet
    }
    ms.left = set()
    server = AdminServer(_Broker(ms), metrics=None)  # type: ignore[arg-type]
    response = await server.nodes(make_mocked_request("GET", "/api/nodes"))
    body = json.loads(response.text or "")
    assert [(i["node_id"], i["suspected"]) for i in body["instances"]] == [
        ("a", False), ("b", True), ("c", False)
    ]
    ms.left = {"c/r3"}  # a member that said it leaves is suspected at once
    response = await server.nodes(make_mocked_request("GET", "/api/nodes"))
    assert [i["suspected"] for i in json.loads(response.text or "")["instances"]] == [
        False, True, True
    ]
