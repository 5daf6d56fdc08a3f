"""Figures for `lookahead bench` (matplotlib, the optional ``bench`` extra: ``pip install 'lookahead[bench]'``)."""
from __future__ import annotations


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'lookahead[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def tokens_per_forward(values: dict, methods: list, datasets: list, path: str, title: str = "",
                       ylabel: str = "tokens per target forward", group_width: float = 1.8) -> None:
    """Grouped bars: tokens per target forward (or what `ylabel` names), ``values[(method, dataset)]``, one group per
    dataset."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(3 + group_width * len(datasets), 4.6))
    width = 0.8 / len(methods)
    palette = plt.get_cmap("tab20") if len(methods) > 10 else None  # past the default cycle's 10, no colour twice
    for i, method in enumerate(methods):
        xs = [j + i * width for j, d in enumerate(datasets) if (method, d) in values]
        ys = [values[method, d] for d in datasets if (method, d) in values]
        bars = ax.bar(xs, ys, width, label=method, hatch="//" if method.startswith("HF") else None,
                      color=None if palette is None else palette(i % palette.N))
        crowded = len(methods) > 6 or len(methods) * len(datasets) > 40
        ax.bar_label(bars, fmt="%.2f", fontsize=5 if crowded else 6, rotation=90 if crowded else 0, padding=2)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(datasets))], datasets, fontsize=8,
                  rotation=30 if len(datasets) > 8 else 0, ha="right" if len(datasets) > 8 else "center")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.margins(y=0.15)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    _legend_below(ax, -0.32 if len(datasets) > 8 else -0.16)
    _save(fig, path)


def speedup_vs_batch(points: dict, path: str, title: str = "") -> None:
    """Lines: speedup over greedy against batch size, ``points[(dataset, method)] = [(batch, speedup), ...]``;
    one colour per method, one line style per dataset."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.8))
    methods = sorted({method for _, method in points})
    datasets = list(dict.fromkeys(dataset for dataset, _ in sorted(points)))
    for (dataset, method), xy in sorted(points.items()):
        xy = sorted(xy)
        ax.plot([b for b, _ in xy], [s for _, s in xy], ["-", "--", ":", "-."][datasets.index(dataset) % 4],
                marker="s" if method.startswith("hf") else "o", color=f"C{methods.index(method) % 10}",
                label=f"{dataset}: {method}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    batches = sorted({b for xy in points.values() for b, _ in xy})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over greedy (same batch)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    _legend_below(ax)
    _save(fig, path)


def step_cost(results: dict, labels: list, sizes: list, path: str, title: str = "") -> None:
    """Log-log lines: median microseconds per step against tokens held, ``results[(label, size)] = (median, mean)``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.8))
    for label in labels:
        xy = [(s, results[label, s][0]) for s in sizes if (label, s) in results]
        if xy:
            ax.plot(*zip(*xy), "--s" if label.startswith("HF") else "-o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens held (context length)")
    ax.set_ylabel("µs per step: propose(10) + extend(3)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", lw=0.3)
    _legend_below(ax)
    _save(fig, path)


def _legend_below(ax, offset: float = -0.16) -> None:
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, offset), ncol=2, frameon=False)


def _save(fig, path: str) -> None:
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    except OSError as error:
        raise ValueError(f"cannot write plot {path}: {error.strerror or error}") from None
    finally:
        plt.close(fig)
