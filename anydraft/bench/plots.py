"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

from .report import aggregate, group_rows


def write_plots(out_dir: Path, rows: list[dict], k: int) -> list[str]:
    """Write the plots; return their file names (relative to ``out_dir``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    groups = group_rows(rows, False)
    ar_labels = {key[0] for key, v in groups.items() if v[0]["method"] == "ar"}  # one per target backend
    by_cat = {key: aggregate(v, k) for key, v in group_rows(rows, True).items()}
    categories = list(dict.fromkeys(key[0] for key in by_cat))
    labels = [lab for lab in dict.fromkeys(key[1] for key in by_cat) if lab not in ar_labels]

    def save(fig, ax, name: str, legend: bool) -> None:
        if legend:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=120)
        plt.close(fig)
        names.append(name)

    # 1. speedup over AR by category and method
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(categories) * max(1, len(labels)) / 2), 4))
    width = 0.8 / max(1, len(labels))
    for i, lab in enumerate(labels):
        ys = [(by_cat.get((c, lab)) or {}).get("speedup_vs_ar") or 0.0 for c in categories]
        xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(categories))]
        ax.bar(xs, ys, width, label=lab)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    ax.set_ylabel("median speedup vs AR (x)")
    ax.set_title("Speedup over plain decoding by category")
    save(fig, ax, "speedup_by_category.png", bool(labels))

    # 2. measured decode speedup vs the analytic bound, one point per (category, method)
    fig, ax = plt.subplots(figsize=(5, 5))
    top = 1.0
    for lab in labels:
        pts = [(g["bound"], g["decode_speedup_vs_ar"]) for (c, lb), g in by_cat.items()
               if lb == lab and g["bound"] is not None and g["decode_speedup_vs_ar"] is not None]
        if pts:
            ax.scatter(*zip(*pts, strict=True), label=lab)
            top = max(top, *(max(p) for p in pts))
    ax.plot([0, top * 1.1], [0, top * 1.1], color="gray", linestyle="--", linewidth=0.8,
            label="measured = bound")
    ax.set_xlabel("analytic bound S(a, k, c) (x)")
    ax.set_ylabel("decode speedup vs AR (x), after the prompt read")
    ax.set_title("Measured decode speedup vs bound (per category)")
    save(fig, ax, "measured_vs_bound.png", True)

    # 3. distribution over prompts of tokens committed per target call
    fig, ax = plt.subplots(figsize=(6, 4))
    for lab, group in groups.items():
        vals = [r["mean_accepted"] for r in group if r["mean_accepted"] is not None]
        if lab[0] not in ar_labels and vals:
            ax.hist(vals, bins=min(20, max(5, len(vals))), alpha=0.5, label=lab[0])
    ax.set_xlabel("tokens per target call (per prompt)")
    ax.set_ylabel("prompts")
    ax.set_title("Accepted tokens per target call")
    save(fig, ax, "accepted_hist.png", bool(labels))
    return names
