"""Self-contained HTML reports (images inlined) for one run, or several side by side."""

from __future__ import annotations

import base64
import html
import json
import os
from pathlib import Path

import numpy as np

from taciturn.core.folder import Folder, as_folder
from taciturn.report.divergence import divergence
from taciturn.report.figures import Png
from taciturn.report.rundir import BEST_RECORD, RunDir

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.6em 0; } td, th { border: 1px solid #ccc; padding: 3px 9px; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; } .muted { color: #777; }
"""


def image(png: Png) -> str:
    data = base64.b64encode(png.data).decode()
    return f'<img alt="{html.escape(png.path.stem)}" src="data:image/png;base64,{data}">'


def table(header: list[str], rows: list[list], numeric_from: int = 1) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{html.escape(str(v))}</td>'
            if i >= numeric_from
            else f"<td>{html.escape(str(v))}</td>"
            for i, v in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def summary(rows: list[dict], metric: str = "accuracy") -> dict:
    """Headline numbers of one run's metrics."""
    if not rows:
        return {}
    last = rows[-1]
    best = (min if metric == "loss" else max)(rows, key=lambda r: r[metric])  # a loss is best when lowest
    return {
        "rounds": last["round"],
        f"final {metric}": round(last[metric], 4),
        f"best {metric}": f"{best[metric]:.4f} (round {best['round']})",
        "MB up": round(last["bytes_up"] / 1e6, 3),
        "MB down": round(last["bytes_down"] / 1e6, 3),
        "messages up (delivered)": f"{last['messages_up']} ({last['delivered_up']})",
        "messages down (delivered)": f"{last['messages_down']} ({last['delivered_down']})",
        "rejected updates": last["rejected"],
        "failed clients": last["failed"],
        "wall s": last["wall_s"],
    }


def _evaluated_on(row: dict) -> str:
    """Where a run on per-client data evaluated its model (its metrics rows' ``eval_on``)."""
    if row.get("eval_on") == "clients":
        return (
            f"Evaluated by the clients (federated evaluation): each scored the global model on its own "
            f"held-out split; the metrics are the sample-weighted mean over {row.get('eval_samples')} "
            f"samples on {row.get('eval_clients')} clients."
        )
    if row.get("eval_on") == "server":
        return "Evaluated on the server's own held-out set ([data] test); the clients' data never left them."
    return ""


def write_report(rundir: RunDir) -> Path:
    from taciturn.report import lazy, plots  # matplotlib: only when a page is written

    images = plots.run_plots(rundir)
    metric = rundir.primary_metric()
    rows = rundir.numeric_metrics(plots.metric_keys(metric))
    parts = [f"<h1>taciturn run: {html.escape(rundir.path.name)}</h1>"]
    if why := divergence(rows):
        parts.append(f'<p style="color:#b00;font-weight:bold">Warning: {html.escape(why)}</p>')
    parts.append(
        table(["", "value"], [[k, v] for k, v in summary(rows, metric).items()] + _run_facts(rundir))
    )
    if note := _evaluated_on(rows[-1]):
        parts.append(f"<p>{html.escape(note)}</p>")
    parts += [
        "<h2>Accuracy</h2>",
        image(images["accuracy"]),
        "<h2>Communication</h2>",
        image(images["bytes"]),
        image(images["traffic"]),
    ]
    if "partition" in images:
        part = rundir.read_partition()
        sizes = np.array(part["sizes"])
        classes = (np.array(part["histogram"]) > 0).sum(axis=1)
        parts += [
            "<h2>Partition</h2>",
            f"<p>{html.escape(part['dataset'])} from "
            f"<span class='muted'>{html.escape(part['source'])}</span>: "
            f"{_number(part['num_clients'])} clients, {html.escape(part['kind'])} split. "
            f"Samples per client: min {sizes.min()}, median {int(np.median(sizes))}, max {sizes.max()}. "
            f"Classes per client: min {classes.min()}, median {int(np.median(classes))}, "
            f"max {classes.max()}.{_held_out_note(part)}</p>",
            image(images["partition"]),
            _histogram_table(part),
        ]
    if "analysis" in images or "centralized" in images:
        parts += [
            "<h2>Lazy-training analysis</h2>",
            "<p>How lazy the training is: with the width n, the clients' divergence, the kernel's "
            "change and the distance to the linearised model shrink like n<sup>-1/2</sup> (Jian &amp; "
            "Liu, ICML 2025). The centralized twin takes as many gradient steps as each client, on the "
            "pooled data, from the same initial weights.</p>",
            table(
                ["", f"round {rows[-1]['round']}"],  # table() escapes every cell
                [[k, _number(rows[-1][k])] for k in lazy.COLUMNS if rows[-1].get(k) is not None],
            ),
            *(image(images[k]) for k in ("analysis", "centralized") if k in images),
        ]
    if rows[-1].get(f"local_{metric}") is not None:
        last = rows[-1]
        parts += [
            "<h2>Each client's own model (FedBN)</h2>",
            f'<p>BatchNorm statistics stay with the clients (<code>model.buffers = "local"</code>). '
            f"In round {_number(last['round'])}, the {_number(last.get('local_clients'))} clients that hold "
            "statistics, each "
            f"with the global weights and its own statistics on the held-out set weighted like its own "
            f"labels: mean {html.escape(metric)} {_number(last[f'local_{metric}'])}, mean loss "
            f"{_number(last.get('local_loss'))}. The global model above uses the server's initial "
            "statistics.</p>",
        ]
    if "clients" in images:
        parts += _client_section(rows, metric, images["clients"])
    if rows[-1].get("epsilon") is not None:
        parts += ["<h2>Privacy</h2>", _privacy(rows[-1], rundir)]
    events = rundir.read_jsonl(rundir.events)
    if events:
        parts += [
            "<h2>Rejected updates, failed clients and skipped rounds</h2>",
            table(
                ["round", "client", "event", "reason"],
                [[e.get("round"), e.get("client"), e.get("event"), e.get("reason")] for e in events[:200]],
                99,
            ),
        ]
    parts += [
        "<h2>Metrics</h2>",
        _metrics_table(rows, metric),
        "<h2>Config</h2>",
        f"<pre>{html.escape(rundir.read_text(rundir.config))}</pre>",
    ]
    return page(rundir.fs, "report.html", f"taciturn: {rundir.path.name}", parts)


def _privacy(last: dict, rundir: RunDir) -> str:
    """The privacy paragraph: epsilon and what it means, or, with reproducible noise, that the run
    is not private (its epsilon is what the mechanism would cost with secret noise)."""
    try:
        record = rundir.read_info().get("privacy") or {}
    except (OSError, AttributeError):
        record = {}
    if not isinstance(last["epsilon"], int | float):  # "not private: reproducible noise"
        return (
            f'<p style="color:#b00;font-weight:bold">{html.escape(str(last["epsilon"]))}. The noise came '
            "from the run seed (<code>[privacy] reproducible_noise = true</code>), which anyone with the "
            "config can regenerate and subtract: this run releases its clients' updates. Nominal "
            f"epsilon {_number(last.get('nominal_epsilon'))} after round {_number(last['round'])} is "
            "what the mechanism would cost with secret noise.</p>"
        )
    if record.get("mode") == "local":
        return (
            f"<p>Local differential privacy: each client's participation costs epsilon = "
            f"{last['epsilon']:.4g} against the server, at the delta of <code>[privacy]</code> "
            "(dp-accounting; a client that takes part k times spends k of them composed). Noise from "
            "the OS CSPRNG.</p>"
        )
    return (
        f"<p>Client-level differential privacy: epsilon = {last['epsilon']:.4g} after round "
        f"{_number(last['round'])}, at the delta of <code>[privacy]</code> (dp-accounting; per round in "
        "the metrics below). Noise from the OS CSPRNG.</p>"
    )


def _held_out_note(part: dict) -> str:
    """partition.json's held-out sizes ([eval] clients), which the counts above leave out."""
    held = part.get("held_out")
    if not isinstance(held, list) or len(held) != len(part["sizes"]) or not all(type(n) is int for n in held):
        return ""
    return (
        f" Besides these training samples, held out for client-side evaluation: {sum(held)} samples "
        f"(per client min {min(held)}, median {int(np.median(held))}, max {max(held)})."
    )


def _client_section(rows: list[dict], metric: str, plot: Png) -> list[str]:
    """[eval] clients: the global model on sampled clients' own held-out splits, the last evaluation's
    distribution in numbers and every evaluation's in the plot."""
    from taciturn.report.plots import client_rows

    last = client_rows(rows, metric)[-1]
    numbers = [
        [label, _number(last[f"client_{metric}{part}"])]
        for label, part in (
            ("weighted by held-out size", ""),
            ("mean over clients", "_mean"),
            ("min", "_min"),
            ("10th percentile", "_p10"),
            ("median", "_p50"),
            ("90th percentile", "_p90"),
            ("max", "_max"),
        )
    ]
    return [
        "<h2>Each client's own held-out data</h2>",
        f"<p>At every evaluation, a sample of clients scores the global model on its own held-out split "
        f"(<code>[eval] clients</code>; those samples are never trained on). Round {_number(last['round'])}: "
        f"{_number(last.get('eval_clients'))} clients, "
        f"{_number(last.get('eval_samples'))} held-out samples, {html.escape(metric)}:</p>",
        table(["", "value"], numbers),
        image(plot),
    ]


def _run_facts(rundir: RunDir) -> list[list]:
    """Where the run trained, whether it stopped early, and the best model it kept (run.json, best/)."""
    facts: list[list] = []
    info = rundir.read_info()
    try:
        best = json.loads(rundir.read_text(BEST_RECORD)) if rundir.has(BEST_RECORD) else None
    except ValueError:
        best = None
    if isinstance(info, dict) and isinstance(info.get("device"), str):
        facts.append(["device", info["device"]])
    stopped = info.get("stopped") if isinstance(info, dict) else None
    if isinstance(stopped, dict):
        facts.append(["stopped early", f"after round {stopped.get('round')}: {stopped.get('reason')}"])
    if isinstance(best, dict):
        facts.append(
            [
                "best model kept (best/)",
                f"{best.get('metric')} {_number(best.get('value'))} at round {best.get('round')}",
            ]
        )
    return facts


def _histogram_table(part: dict, max_clients: int = 100) -> str:
    hist = part["histogram"]
    header = ["client", *[str(c) for c in range(part["num_classes"])], "total"]
    rows = [[i, *counts, sum(counts)] for i, counts in enumerate(hist[:max_clients])]
    more = (
        f"<p class='muted'>first {max_clients} of {len(hist)} clients</p>" if len(hist) > max_clients else ""
    )
    return f"<details><summary>Per-client class histogram</summary>{table(header, rows)}{more}</details>"


STANDARD = {
    "round", "loss", "bytes_up", "bytes_down", "messages_up", "messages_down", "delivered_up",
    "delivered_down", "train_loss", "clients", "rejected", "failed", "skipped", "wall_s",
}  # fmt: skip


def _metrics_table(rows: list[dict], metric: str = "accuracy") -> str:
    """Every evaluation: the leading metric first, then the other scores (your own metrics= too)."""
    scores = [k for k, v in rows[-1].items() if k not in STANDARD and isinstance(v, int | float)]
    scores = [k for k in scores if not k.startswith(("local_", "client_", "eval_")) and k != metric]
    clients = [f"client_{metric}{part}" for part in ("", "_mean", "_p10")]  # the plot has the rest
    keys = [
        "round",
        *([metric] if metric in rows[-1] and metric != "loss" else []),
        *[k for k in scores if k not in ("epsilon", "clip_norm")],
        "loss",
        *[k for k in rows[-1] if k.startswith("local_")],
        *[k for k in clients if k in rows[-1]],
        "bytes_up",
        "bytes_down",
        "messages_up",
        "messages_down",
        "wall_s",
        *[k for k in ("epsilon", "clip_norm", "skipped") if k in rows[-1]],
    ]
    body = [[r.get(k) if not isinstance(r.get(k), float) else f"{r[k]:.4f}" for k in keys] for r in rows]
    return f"<details><summary>{len(rows)} evaluations</summary>{table(keys, body, 0)}</details>"


def _number(value: object) -> str:
    """A number as text, or anything else escaped (the files a report reads may have been edited)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.4g}"
    return html.escape(str(value))


def page(folder: Folder, rel: str, title: str, parts: list[str]) -> Path:
    """Write the page ``rel`` into ``folder`` (core/folder.py: never through a link)."""
    folder.write_text(
        rel,
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>",
    )
    return folder.where(rel)


def write_comparison(rundirs: list[RunDir], out: Path, note: str = "") -> Path:
    """Overlay several runs with a summary table: accuracy against bytes first (what the runs cost
    for what they reach), then against rounds. ``note``: a sentence shown under the first plot."""
    from taciturn.report import plots

    folder = as_folder(out)
    labels = _labels(rundirs)
    metric = rundirs[0].primary_metric()
    columns = plots.metric_keys(metric)
    series = [(label, r.numeric_metrics(columns)) for label, r in zip(labels, rundirs, strict=True)]
    acc = plots.accuracy_vs_round(series, folder, "accuracy_vs_round.png", metric)
    comm = plots.accuracy_vs_bytes(series, folder, "accuracy_vs_bytes.png", metric)
    keys = list(summary(series[0][1], metric))
    overview = table(["run", *keys], [[label, *summary(rows, metric).values()] for label, rows in series])
    configs = "".join(
        f"<details><summary>{html.escape(label)}</summary><pre>{html.escape(r.read_text(r.config))}</pre>"
        "</details>"
        for label, r in zip(labels, rundirs, strict=True)
    )
    folder.write_text(
        "summary.json", json.dumps({label: summary(rows, metric) for label, rows in series}, indent=1)
    )
    links = " · ".join(
        f"<a href='{html.escape(os.path.relpath(r.report, out))}'>{html.escape(label)}</a>"
        for label, r in zip(labels, rundirs, strict=True)
        if r.has(r.report)
    )
    return page(
        folder,
        "report.html",
        "taciturn comparison",
        [
            "<h1>taciturn comparison</h1>",
            "<h2>Accuracy against communication</h2>",
            image(comm),
            f"<p>{html.escape(note)}</p>" if note else "",
            overview,
            f"<p>Each run's own report: {links}</p>" if links else "",
            "<h2>Accuracy against rounds</h2>",
            image(acc),
            "<h2>Configs</h2>",
            configs,
        ],
    )


def _labels(rundirs: list[RunDir]) -> list[str]:
    names = [r.path.name for r in rundirs]
    return names if len(set(names)) == len(names) else [str(r.path) for r in rundirs]
