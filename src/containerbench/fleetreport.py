"""The fleet verdict's page (containerbench fleet judge): one self-contained HTML file, read from the
tables fleetexport.write_verdict wrote (fleet_summary.csv, fleet_nodes.csv, fleet_links.csv, drain.txt)."""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # no display on login or compute nodes
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from jinja2 import Environment, PackageLoader, select_autoescape  # noqa: E402

from containerbench import outputs  # noqa: E402
from containerbench.fleet import CONTAINER_PATH  # noqa: E402
from containerbench.fleetstats import NOT_REPEATED  # noqa: E402
from containerbench.report import figure_png, html_table  # noqa: E402
from containerbench.validate import rail_of  # noqa: E402


def node_chart(nodes: pd.DataFrame, min_shortfall: float | None = None) -> str | None:
    """One panel per variable: each node's signed deviation from the fleet median, failed bars red."""
    if nodes.empty:
        return None
    variables = list(dict.fromkeys(nodes["variable"]))
    order = list(dict.fromkeys(nodes["node"]))
    figure, axes = plt.subplots(len(variables), 1, figsize=(min(24, max(7, 0.3 * len(order))), 2.2 * len(variables)),
                                squeeze=False, sharex=True)
    for axis, variable in zip(axes[:, 0], variables):
        rows = nodes[nodes["variable"] == variable].set_index("node").reindex(order)
        # A figure not repeated when measured again shows its first pass, in its own colour; the container
        # path's, as a fail's but lighter: not the node's hardware.
        colours = [{"fail": "#c62828", "unjudged": "#bdbdbd", NOT_REPEATED: "#ffb74d", CONTAINER_PATH: "#ef9a9a"}
                   .get(result, "#7986cb") for result in rows["result"]]
        axis.bar(range(len(order)), rows["better_percent"].fillna(0), color=colours)
        axis.axhline(0, color="black", linewidth=0.8)
        if min_shortfall:
            axis.axhline(-100 * min_shortfall, color="#c62828", linewidth=0.8, linestyle="--")
        axis.set_title(variable, fontsize=8, loc="left")
        axis.set_ylabel("% vs fleet median", fontsize=8)
        axis.grid(alpha=0.3, axis="y")
    if len(order) <= 96:  # beyond, names would overlap: the table below has them
        axes[-1, 0].set_xticks(range(len(order)), order, rotation=90 if len(order) > 16 else 0, fontsize=8)
    figure.tight_layout()
    return figure_png(figure)


def link_matrices(links: pd.DataFrame, order: list[str], unmeasured=()) -> list[tuple[str, str]]:
    """(title, picture): the links over each fabric whole, then over each rail alone, where rails are
    configured (a rail degraded on one node's HCA shows as that node's row on its picture only)."""
    rails = links["variable"].map(rail_of) if not links.empty else pd.Series(dtype=str)
    pictures = []
    for rail in dict.fromkeys(["", *sorted(set(rails) - {""})]):
        mine = links[rails == rail] if not links.empty else links
        title = f"Rail {rail} alone" if rail else ("Every fabric, its rails together" if len(set(rails)) > 1
                                                   else "Links")
        if (picture := link_matrix(mine, order, unmeasured, title)) is not None:
            pictures.append((title, picture))
    return pictures


def link_matrix(links: pd.DataFrame, order: list[str], unmeasured=(), title: str = "Links") -> str | None:
    """Nodes x nodes: each measured link's worst signed deviation; slow links crossed, links whose job
    failed (`unmeasured`, no figure) squared."""
    if links.empty:
        return None
    position = {node: i for i, node in enumerate(order)}
    worst = links.groupby("link").agg(signed=("better_percent", "min"), slow=("slow", "any"))
    matrix = np.full((len(order), len(order)), np.nan)
    slow = []
    for link, row in worst.iterrows():
        a, b = (position[end] for end in link.split("+"))
        matrix[a, b] = matrix[b, a] = row.signed
        if row.slow:
            slow += [(a, b), (b, a)]
    size = max(4, min(14, 0.35 * len(order)))
    figure, axis = plt.subplots(figsize=(size + 1.5, size))
    limit = max(10.0, float(np.nanmax(np.abs(matrix))))
    image = axis.imshow(matrix, cmap="RdBu", vmin=-limit, vmax=limit)
    if slow:
        rows, columns = zip(*slow)
        axis.scatter(columns, rows, marker="x", color="black", s=40 if len(order) <= 32 else 8)
    failed = [(position[a], position[b]) for a, b in (link.split("+") for link in unmeasured)]
    if failed:
        rows, columns = zip(*failed, *[(b, a) for a, b in failed])
        axis.scatter(columns, rows, marker="s", facecolors="none", edgecolors="black", s=60 if len(order) <= 32 else 10)
    ticks = range(len(order)) if len(order) <= 64 else []
    axis.set_xticks(ticks, [order[i] for i in ticks], rotation=90, fontsize=7)
    axis.set_yticks(ticks, [order[i] for i in ticks], fontsize=7)
    figure.colorbar(image, ax=axis, label="worst figure, % vs fleet median (below 0: worse)")
    axis.set_title(title)
    return figure_png(figure)


FLEET_SUMMARY_COLUMNS = {"kind": "kind", "member": "node or link", "result": "result", "reason": "reason"}
FLEET_NODE_COLUMNS = {"node": "node", "variable": "variable", "value": "value", "unit": "unit",
                      "reference": "reference", "fleet_median": "fleet median", "mad": "MAD",
                      "robust_z": "robust z", "deviation_percent": "deviation %",
                      "repeatability_percent": "repeatability %", "recheck_value": "measured again",
                      "result": "result", "reason": "reason"}
FLEET_LINK_COLUMNS = {"link": "link", "variable": "variable", "value": "value", "unit": "unit",
                      "fleet_median": "fleet median", "mad": "MAD", "robust_z": "robust z",
                      "deviation_percent": "deviation %", "blamed_on": "blamed on"}


def render_fleet(verdict_dir, out_path, min_shortfall: float | None = None, z_limit: float = 3.5) -> None:
    """The fleet verdict's HTML page from its tables (fleet_*.csv, drain.txt in verdict_dir)."""
    folder = Path(verdict_dir)
    summary, nodes, links = (pd.read_csv(folder / f"fleet_{name}.csv", keep_default_na=False,
                                         na_values=[""]) for name in ("summary", "nodes", "links"))
    summary["reason"] = summary["reason"].fillna("")
    order = summary.loc[summary["kind"] == "node", "member"].tolist()
    failing = summary[summary["result"] != "pass"]
    environment = Environment(loader=PackageLoader("containerbench"), autoescape=select_autoescape())
    page = environment.get_template("fleet.html.j2").render(
        generated=time.strftime("%Y-%m-%d %H:%M %Z"),
        node_count=len(order), link_count=int((summary["kind"] == "link").sum()),
        failed_nodes=int(((summary["kind"] == "node") & (summary["result"] == "fail")).sum()),
        bad_links=int(((summary["kind"] == "link") & (summary["result"] == "fail")).sum()),
        container_paths=int(((summary["kind"] == "node") & (summary["result"] == CONTAINER_PATH)).sum()),
        failures_table=html_table(failing, FLEET_SUMMARY_COLUMNS),
        node_chart=node_chart(nodes, min_shortfall), node_table=html_table(nodes, FLEET_NODE_COLUMNS),
        link_matrices=link_matrices(links, order, sorted(set(failing.loc[failing["kind"] == "link", "member"])
                                                         - set(links["link"]))),
        link_table=html_table(links[links["slow"]], FLEET_LINK_COLUMNS),
        drain=(folder / "drain.txt").read_text(), z_limit=z_limit,
    )
    outputs.write_text(out_path, page)
