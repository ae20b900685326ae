"""The figures of benchmarks/README.md (matplotlib, written atomically); benchmarks.report draws them."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List


def sentence_points(grouped: Dict[str, List[dict]]) -> Dict[str, Dict[str, float]]:
    """Sentence-level P@1 per dataset and method, from the ranking benchmarks."""
    points: Dict[str, Dict[str, float]] = defaultdict(dict)
    for kind in ("open_domain", "cross_domain", "atomic_facts"):
        for r in grouped.get(kind, []):
            value = r["metrics"].get("sent_p1")
            if value is not None:
                points[r["dataset"]][r["method"]] = value
    return points


def sentence_chart(grouped: Dict[str, List[dict]], path: Path, method_key: Callable[[dict], tuple]) -> bool:
    """Bar chart of sentence-level P@1 per method and dataset; False when there is nothing to plot."""
    points = sentence_points(grouped)
    if not points:
        return False
    plt = _pyplot()
    datasets = sorted(points)
    methods = sorted({m for d in points.values() for m in d}, key=lambda m: method_key({"method": m}))
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(datasets)), 4.2), dpi=120)
    for k, method in enumerate(methods):
        xs = [i + k * width for i, d in enumerate(datasets) if method in points[d]]
        ys = [points[d][method] for d in datasets if method in points[d]]
        ax.bar(xs, ys, width, label=method)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(datasets))], datasets)
    ax.set_ylabel("sentence P@1 (%)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _save_figure(fig, path)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_figure(fig, path: Path) -> bool:
    """Write a chart under a temporary name, then rename it: a reader never sees half a PNG."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return True


def _p1_chart(path: Path, draw, xlabel: str, title: str | None = None) -> bool:
    """Passage and sentence P@1 side by side: ``draw(ax, metric)`` plots one panel's lines."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=120, sharex=True)
    for ax, metric, label in zip(axes, ("psg_p1", "sent_p1"), ("passage P@1 (%)", "sentence P@1 (%)")):
        draw(ax, metric)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=9)
    return _save_figure(fig, path)


def frontier_chart(grouped: Dict[str, List[dict]], path: Path) -> bool:
    """Passage and sentence P@1 against bytes per token, one line per model (its codecs), the float16 scan
    as a hollow marker; False when no frontier result exists."""
    runs = [r for r in grouped.get("index_search", []) if r.get("what") == "size-quality frontier"]
    if not runs:
        return False
    rows = runs[-1]["rows"]

    def draw(ax, metric):
        import matplotlib.ticker

        for model in dict.fromkeys(r["model"] for r in rows):
            mine = sorted((r for r in rows if r["model"] == model and r["nbits"] != 16), key=lambda r: r["bytes_per_token"])
            line = ax.plot([r["bytes_per_token"] for r in mine], [r["metrics"][metric] for r in mine], "o-",
                           label=f"{model} (1/2/4 bits)")[0]
            for r in mine:
                ax.annotate(f"{r['nbits']}b", (r["bytes_per_token"], r["metrics"][metric]), fontsize=7,
                            textcoords="offset points", xytext=(3, 3))
            for r in (r for r in rows if r["model"] == model and r["nbits"] == 16):
                ax.plot([r["bytes_per_token"]], [r["metrics"][metric]], "o", mfc="none", color=line.get_color(),
                        label=f"{model} float16 scan")
        ax.set_xscale("log")
        ticks = [16, 32, 64, 128, 256, 512, 1024]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())

    return _p1_chart(path, draw, "bytes per token (log)")


def pooling_chart(grouped: Dict[str, List[dict]], path: Path) -> bool:
    """Token pooling's frontier (issue 53): passage and sentence P@1 on SQuAD train against bytes per
    original token, one line per residual width through pool factors 1–4; False without a result."""
    runs = [r for r in grouped.get("index_search", []) if r.get("what") == "token pooling frontier"]
    if not runs:
        return False
    rows = runs[-1]["rows"]

    def draw(ax, metric):
        for nbits in sorted({r["nbits"] for r in rows}):
            mine = sorted((r for r in rows if r["nbits"] == nbits), key=lambda r: r["bytes_per_original_token"])
            ax.plot([r["bytes_per_original_token"] for r in mine], [r["metrics"][metric] for r in mine], "o-",
                    label=f"{nbits}-bit residuals, pool factor 1–4")
            for r in mine:
                ax.annotate(f"×{r['pool_factor']:g}", (r["bytes_per_original_token"], r["metrics"][metric]), fontsize=7,
                            textcoords="offset points", xytext=(3, 3))

    return _p1_chart(path, draw, "bytes per original token",
                     f"token pooling, {runs[-1]['model']} (SQuAD train)")
