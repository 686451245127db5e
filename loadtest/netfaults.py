"""Network faults of a load-test run through a real TCP proxy: Toxiproxy.

The harness runs one ``toxiproxy-server`` (a Go program, installed on first use into
the harness's own cache dir: :func:`toxiproxy_binary`) and puts a proxy in front of
every broker's client port; the workers connect to the proxies, never to the brokers.
With ``--log kafka`` every broker also reaches Kafka through a proxy of its own (a
Kafka listener per broker, advertised as that proxy's address, so the metadata
Kafka hands out keeps the broker behind its proxy).

What cannot be routed, and why (docs/loadtest.md "Network faults"): with the file log
there is no network link to the log; brokers reach each other only for the join
update, at the addresses their peers advertise in the log, which are their own client
ports, so peer links bypass the proxies (``--advertise`` names one address for peers and
clients alike, so pointing it at a client proxy would let a client-partition cut joins).

The proxies are driven through Toxiproxy's HTTP API (:class:`Toxiproxy`):

- a *cut* (``netsplit``, ``client-partition``) adds a ``timeout`` toxic both ways: data
  stops flowing, like a dropped route, and each connection is closed after a few
  seconds of silence, as a peer's keepalive would find out;
- ``slow-net`` adds ``latency`` toxics (latency and jitter) to every proxy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = [
    "TOXIPROXY_MODULE",
    "TOXIPROXY_VERSION",
    "Toxiproxy",
    "ToxiproxyError",
    "toxiproxy_binary",
]

#: The Go module of Toxiproxy's server and the version the harness installs.
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
TOXIPROXY_VERSION = "v2.5.0"


class ToxiproxyError(RuntimeError):
    """Toxiproxy could not be installed, started or told what to do."""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "baton" / f"toxiproxy-{TOXIPROXY_VERSION}"


def toxiproxy_binary(install: bool = True) -> Path:
    """The ``toxiproxy-server`` to run: ``$BATON_TOXIPROXY`` if set, else
    ``toxiproxy-server`` on PATH, else the harness's own copy, which is built with
    ``go install`` (pinned to :data:`TOXIPROXY_VERSION`) when missing.

    Raises:
        ToxiproxyError: none found and it cannot be installed (no ``go``, or it failed).
    """
    given = os.environ.get("BATON_TOXIPROXY")
    if given:
        return Path(given)
    on_path = shutil.which("toxiproxy-server")
    if on_path:
        return Path(on_path)
    gobin = _cache_dir() / "bin"
    binary = gobin / "server"  # go install names it after the package's folder
    if binary.exists() or not install:
        return binary
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    if go is None:
        raise ToxiproxyError(
            "network faults need Toxiproxy: install Go (to build it), or put toxiproxy-server "
            "on PATH, or set BATON_TOXIPROXY"
        )
    gobin.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [go, "install", f"{TOXIPROXY_MODULE}@{TOXIPROXY_VERSION}"],
        env={**os.environ, "GOBIN": str(gobin)}, capture_output=True, text=True, timeout=900,
    )
    if done.returncode != 0 or not binary.exists():
        raise ToxiproxyError(f"go install {TOXIPROXY_MODULE} failed: {done.stderr[-2000:]}")
    return binary


class Toxiproxy:
    """One ``toxiproxy-server`` process and its proxies.

    Args:
        port: the API port on 127.0.0.1.
        out: where the server's output goes.
    """

    def __init__(self, port: int, out: Path) -> None:
        self.port = port
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        #: proxy name -> its listen address.
        self.proxies: dict[str, str] = {}

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until its API answers.

        Raises:
            ToxiproxyError: it exited or did not answer in time.
        """
        binary = toxiproxy_binary()
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(
                [str(binary), "-host", "127.0.0.1", "-port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._call("GET", "/proxies")
                return
            except ToxiproxyError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise ToxiproxyError(
                        f"toxiproxy-server did not start ({self.out})"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (every proxy goes with it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                text = resp.read()
        except urllib.error.HTTPError as exc:
            raise ToxiproxyError(f"toxiproxy {method} {path}: {exc.code} {exc.read()[:300]!r}") from exc
        except OSError as exc:
            raise ToxiproxyError(f"toxiproxy {method} {path}: {exc}") from exc
        return json.loads(text) if text.strip() else None

    def add(self, name: str, upstream: str, listen: str = "127.0.0.1:0") -> str:
        """Create a proxy to ``upstream``; returns the address it listens on."""
        made = self._call("POST", "/proxies",
                          {"name": name, "listen": listen, "upstream": upstream, "enabled": True})
        self.proxies[name] = str(made["listen"])
        return self.proxies[name]

    def cut(self, name: str, close_after_ms: int = 3000) -> None:
        """Stop the data of a proxy's connections both ways (new ones connect, then
        hang too); each is closed after ``close_after_ms`` of silence."""
        for stream in ("upstream", "downstream"):
            self._call("POST", f"/proxies/{name}/toxics", {
                "name": f"cut-{stream}", "type": "timeout", "stream": stream,
                "attributes": {"timeout": close_after_ms},
            })

    def slow(self, name: str, latency_ms: int, jitter_ms: int) -> None:
        """Delay a proxy's data both ways by ``latency_ms`` +- ``jitter_ms``."""
        for stream in ("upstream", "downstream"):
            self._call("POST", f"/proxies/{name}/toxics", {
                "name": f"slow-{stream}", "type": "latency", "stream": stream,
                "attributes": {"latency": latency_ms, "jitter": jitter_ms},
            })

    def heal(self, name: str) -> None:
        """Remove every toxic of a proxy."""
        for toxic in self._call("GET", f"/proxies/{name}/toxics") or []:
            self._call("DELETE", f"/proxies/{name}/toxics/{toxic['name']}")
