"""The HTML report of one or several runs: tables and matplotlib PNG plots.

``write_report(results, out_dir)`` writes ``report.html`` and, next to it:

- ``throughput.png``: confirmed publishes/s and accepted/s over time, one panel per system;
- ``latency.png``: confirm and end-to-end latency p50 / p99 per second (log scale);
- ``servers.png``: each server process's CPU (cores) and RSS (MiB) over time;
- ``comparison.png``: the systems side by side (when more than one ran).

Fault starts are dashed vertical lines labelled with the fault, and a fault's duration
is shaded. Times are seconds from the first publish of each run.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batonmq.loadtest.checker import LOST_CLASSES, VIOLATIONS
from batonmq.loadtest.runner import RunResult, comparison_rows

__all__ = ["write_report"]

_FAULT_COLOURS = {
    "kill9": "tab:red",
    "sigstop": "tab:purple",
    "join": "tab:green",
    "stop": "tab:gray",
    "kafka-restart": "tab:brown",
    "diskfull": "tab:orange",
}


def _spans(faults: list[list[Any]]) -> list[tuple[float, float | None, str, str]]:
    """(start, end or None, kind, node) of each fault of a timeline."""
    out: list[tuple[float, float | None, str, str]] = []
    open_: dict[str, int] = {}
    for t, kind, phase, info in faults:
        node = info.split()[0][5:] if info.startswith("node=") else ""
        if phase == "start":
            open_[kind] = len(out)
            out.append((t, None, kind, node))
        elif kind in open_:
            i = open_.pop(kind)
            s, _, k, n = out[i]
            out[i] = (s, t, k, n or node)
    return out


def _mark_faults(ax: Any, faults: list[list[Any]], label: bool) -> None:
    for start, end, kind, node in _spans(faults):
        colour = _FAULT_COLOURS.get(kind, "black")
        ax.axvline(start, color=colour, linestyle="--", linewidth=1)
        if end is not None and end > start:
            ax.axvspan(start, end, color=colour, alpha=0.12)
        if label and kind != "stop":  # a join's stop of the previous joiner: same time
            ax.annotate(
                f"{kind} {node}".strip(), (start, 1.0), xycoords=("data", "axes fraction"),
                rotation=90, va="top", ha="right", fontsize=7, color=colour,
            )


def _plots(results: Sequence[RunResult], out: Path) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images: list[tuple[str, str]] = []
    n = len(results)
    names = [r.config.get("system", "baton") for r in results]

    fig, axes = plt.subplots(n, 1, figsize=(11, 3.2 * n), sharex=True, squeeze=False)
    for ax, r, name in zip(axes[:, 0], results, names):
        tl = r.metrics["timeline"]
        ax.plot(tl["t"], tl["confirmed"], label="confirmed publishes/s", linewidth=1.2)
        ax.plot(tl["t"], tl["accepted"], label="accepted/s", linewidth=1.2)
        _mark_faults(ax, tl["faults"], label=True)
        ax.set_ylabel("msg/s")
        ax.set_title(name, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    axes[-1, 0].set_xlabel("seconds since the first publish")
    fig.suptitle("Throughput over time")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)
    images.append(("throughput.png", "Throughput over time (dashed lines: faults)"))

    fig, axes = plt.subplots(n, 1, figsize=(11, 3.2 * n), sharex=True, squeeze=False)
    for ax, r, name in zip(axes[:, 0], results, names):
        tl = r.metrics["timeline"]
        for key, label, style in (
            ("confirm_p50", "confirm p50", "-"),
            ("confirm_p99", "confirm p99", ":"),
            ("e2e_p50", "end-to-end p50", "-"),
            ("e2e_p99", "end-to-end p99", ":"),
        ):
            ts = [t for t, v in zip(tl["t"], tl[key]) if v > 0]
            vs = [v for v in tl[key] if v > 0]
            if ts:
                ax.plot(ts, vs, style, label=label, linewidth=1.1)
        _mark_faults(ax, tl["faults"], label=True)
        ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax.set_title(name, fontsize=10, loc="left")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="upper left", ncol=2)
    axes[-1, 0].set_xlabel("seconds since the first publish")
    fig.suptitle("Latency per second")
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
    images.append(("latency.png", "Latency percentiles per second (log scale)"))

    if any(r.metrics.get("servers") for r in results):
        fig, axes = plt.subplots(n, 2, figsize=(11, 3.0 * n), squeeze=False)
        for row, r, name in zip(axes, results, names):
            samples = r.metrics.get("servers", {}).get("samples", [])
            labels = sorted({s["label"] for s in samples})
            for label in labels:
                pts = [s for s in samples if s["label"] == label]
                row[0].plot([s["t"] for s in pts], [s["cpu"] for s in pts], label=label,
                            linewidth=1)
                row[1].plot([s["t"] for s in pts], [s["rss_mib"] for s in pts], label=label,
                            linewidth=1)
            for ax, what in ((row[0], "CPU (cores)"), (row[1], "RSS (MiB)")):
                _mark_faults(ax, r.metrics["timeline"]["faults"], label=False)
                ax.set_title(f"{name}: {what}", fontsize=10, loc="left")
                ax.grid(alpha=0.3)
                if labels:
                    ax.legend(fontsize=7)
        for ax in axes[-1]:
            ax.set_xlabel("seconds since the first publish")
        fig.tight_layout()
        fig.savefig(out / "servers.png", dpi=110)
        plt.close(fig)
        images.append(("servers.png", "Server CPU and memory (from /proc, per process tree)"))

    if n > 1:
        comp = comparison_rows(results)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
        xs = range(len(comp))
        w = 0.38
        a1.bar([x - w / 2 for x in xs], [c["confirmed_msgs_per_s"] for c in comp], w,
               label="confirmed publishes/s")
        a1.bar([x + w / 2 for x in xs], [c["consume_msgs_per_s"] for c in comp], w,
               label="accepted/s")
        a1.set_xticks(list(xs), [c["system"] for c in comp], fontsize=8)
        a1.set_title("msg/s", fontsize=10)
        a1.legend(fontsize=8)
        keys = ("p50", "p90", "p99", "p99.9")
        step = 1.0 / (len(comp) + 1)
        for i, c in enumerate(comp):
            a2.bar([k + i * step for k in range(len(keys))], [c["e2e"][k] for k in keys], step,
                   label=c["system"])
        a2.set_xticks([k + step * (len(comp) - 1) / 2 for k in range(len(keys))], list(keys))
        a2.set_yscale("log")
        a2.set_title("end-to-end latency (ms)", fontsize=10)
        a2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "comparison.png", dpi=110)
        plt.close(fig)
        images.insert(0, ("comparison.png", "Side by side: rates and end-to-end latency"))
    return images


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def write_report(results: Sequence[RunResult], out_dir: str | Path, title: str = "") -> Path:
    """Write ``report.html`` and its PNG plots into ``out_dir``; returns the HTML path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images = _plots(results, out)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title or 'Baton load test')}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:right}th{background:#eee}td:first-child{text-align:left}"
        ".bad{color:#b00;font-weight:bold}.ok{color:#070}</style></head><body>",
        f"<h1>{html.escape(title or 'Baton load test')}</h1>",
    ]
    cfg = results[0].config if results else {}
    wl = cfg.get("workload", {})
    parts.append(
        "<p>"
        + html.escape(
            f"preset {cfg.get('preset')}, {cfg.get('duration')} s, {wl.get('queues')} queue(s), "
            f"{wl.get('size')} B messages, {wl.get('producers')} producer and "
            f"{wl.get('consumers')} consumer processes, window {wl.get('window')}, "
            f"prefetch {wl.get('prefetch')}, acks by {wl.get('ack_batch')}"
            + (f", target {wl.get('rate'):,.0f} msg/s" if wl.get("rate") else ", open loop")
            + (f"; faults {cfg.get('faults')}" if cfg.get("faults") else "")
            + (f"; {cfg['partitions']} data partitions" if (cfg.get("partitions") or 1) > 1
               else "")
            + (f", replica groups of {cfg['replicas']}" if cfg.get("replicas") else "")
        )
        + "</p>"
    )
    rows = []
    for row in comparison_rows(results):
        c, e = row["confirm"], row["e2e"]
        rows.append([
            row["system"], f"{row['confirmed_msgs_per_s']:,.0f}", f"{row['consume_msgs_per_s']:,.0f}",
            *(f"{c[k]:.2f}" for k in ("p50", "p90", "p99", "p99.9", "max")),
            *(f"{e[k]:.2f}" for k in ("p50", "p90", "p99", "p99.9", "max")),
            "-" if row["cpu"] is None else f"{row['cpu']:.2f}",
            "-" if row["rss"] is None else f"{row['rss']:.0f}",
            "-" if row["generator_cpu"] is None else f"{row['generator_cpu']:.2f}"
            + (" SATURATED" if row["generator_saturated"] else ""),
            row["checker"],
        ])
    parts.append("<h2>Figures</h2>")
    parts.append(_table(
        ["system", "confirmed/s", "accepted/s",
         "confirm p50", "p90", "p99", "p99.9", "max",
         "e2e p50", "p90", "p99", "p99.9", "max", "server cores", "peak RSS MiB",
         "generator cores", "checker"],
        rows,
    ))
    loads = ", ".join(
        f"{r.config.get('system')} {r.config['loadavg_1m'][0]:.1f} -> {r.config['loadavg_1m'][1]:.1f}"
        for r in results if r.config.get("loadavg_1m")
    )
    parts.append("<p>Latencies in ms. Nodes: the servers each system ran (Baton brokers; "
                 "RabbitMQ and NATS nodes, every queue replicated on each). Generator cores: "
                 "the busiest load-generator process (mean over the load phase); SATURATED "
                 "when one used 90 % of a core or more, so that run may measure the "
                 "generator. Definitions: docs/loadtest.md."
                 + (html.escape(f" Machine load (1-min average, before -> after each run, "
                                f"{cfg.get('cpus')} CPUs): {loads}.") if loads else "")
                 + "</p>")
    parts.append("<h2>Checker (docs/design.md §5)</h2>")
    crow = []
    for r in results:
        counts = r.check.counts
        crow.append([r.config.get("system", "baton"), *(counts.get(k, 0) for k in VIOLATIONS),
                     "/".join(str(counts.get(k, 0)) for k in LOST_CLASSES),
                     counts.get("pending", 0), r.check.stats.get("redeliveries", 0),
                     r.check.stats.get("consumers_lost", 0), "OK" if r.ok else "FAILED"])
    parts.append(_table(["system", *VIOLATIONS, "lost prefix/middle/postfix", "pending",
                         "redeliveries", "consumers lost", "verdict"], crow))
    brows = [
        [r.config.get("system", "baton"), broker, v.get("deliveries", 0), v.get("messages", 0),
         v.get("accepted", 0), v.get("split_brain", 0)]
        for r in results for broker, v in r.check.brokers.items()
    ]
    if brows:
        # docs/loadtest.md: what each broker delivered, side by side (a split brain shows
        # as deliveries or accepts overlapping another broker's).
        parts.append("<h3>Per broker</h3>")
        parts.append(_table(["system", "broker", "deliveries", "messages", "accepted",
                             "overlapping another broker"], brows))
    for r in results:
        for kind, examples in r.check.examples.items():
            for ex in examples:
                parts.append(f"<p class='bad'>{html.escape(r.config.get('system', ''))} "
                             f"{html.escape(kind)}: {html.escape(ex)}</p>")
        faults = r.metrics.get("faults")
        if faults:
            parts.append(f"<h3>Faults ({html.escape(r.config.get('system', 'baton'))})</h3>")
            parts.append(_table(["t (s from load start)", "fault", "phase", "detail"],
                                [[f"{f['t']:.1f}", f["kind"], f["phase"], f["detail"]]
                                 for f in faults]))
        if r.metrics.get("fault_errors"):
            parts.append("<p class='bad'>" + html.escape("; ".join(r.metrics["fault_errors"]))
                         + "</p>")
    for name, caption in images:
        parts.append(f"<h2>{html.escape(caption)}</h2><img src='{name}' style='max-width:100%'>")
    parts.append("<h2>Configuration</h2><pre>"
                 + html.escape(json.dumps([r.config for r in results], indent=1)) + "</pre>")
    parts.append("</body></html>")
    path = out / "report.html"
    path.write_text("\n".join(parts))
    return path
