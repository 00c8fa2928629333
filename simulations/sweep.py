"""Parameter sweeps over branching factor and target object size, the choice of the best
setting, and the plot (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from dstltree.simulations.cluster import SimResult, simulate
from dstltree.simulations.config import Design, SimConfig
from dstltree.topology.latency import get_model

__all__ = ["best", "floor_ms", "plot", "sweep"]

_FLAT: tuple[str, ...] = ("task", "executor")  # designs that ignore branching and target


def floor_ms(model: str = "flip158-s3") -> float:
    """The floor of a checkpoint's tail (ms): one request's p99 at the model's reference
    size, hedged for the FLIP-158 S3 model (its ``flip158-s3-hedged`` table: 937 ms;
    FLIP-158, "DFS write latency"). Raises KeyError for an unknown model."""
    if model == "flip158-s3":
        model = "flip158-s3-hedged"
    return get_model(model).quantile(99) * 1000


def sweep(
    base: SimConfig,
    branching: Sequence[int] | None = None,
    targets: Sequence[int] | None = None,
    designs: Sequence[Design] = ("task", "executor", "tree", "tree-noplan"),
    jobs: int = 1,
) -> list[SimResult]:
    """Simulate every design over the grid ``branching x targets`` (bytes; None keeps the
    base value). ``task`` and ``executor`` run once each: they use neither. ``jobs`` > 1
    runs configurations in that many processes. Results come in grid order."""
    bs = list(branching or [base.branching])
    ts = list(targets or [base.target_object_bytes])
    cfgs: list[SimConfig] = []
    for d in designs:
        if d in _FLAT:
            cfgs.append(replace(base, design=d))
            continue
        for b in bs:
            for t in ts:
                cfgs.append(replace(base, design=d, branching=b, target_object_bytes=t))
    if jobs <= 1:
        return [simulate(c) for c in cfgs]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(simulate, cfgs))


def best(
    results: Sequence[SimResult], prefixes: int = 1, p99_slack: float = 0.05
) -> SimResult | None:
    """The recommended setting: among the results within the request-rate limit (no
    throttled request, PUT/s at most ``put_rate_limit`` x ``prefixes``, the limit being
    per prefix: S3's 3,500 PUT/s per prefix), those whose checkpoint p99 is within
    ``p99_slack`` (a fraction) of the lowest p99, and of these the one with the fewest
    requests per checkpoint (users pay per request); ties go to the lower p99, then the
    lower p50. None if no result stays within the limit. Raises ValueError if
    ``prefixes`` < 1 or ``p99_slack`` < 0."""
    if prefixes < 1 or p99_slack < 0:
        raise ValueError(f"prefixes must be >= 1 and p99_slack >= 0: {prefixes}, {p99_slack}")
    ok = [r for r in results if r.under_limit(prefixes)]
    if not ok:
        return None
    floor = min(r.checkpoint_ms["p99"] for r in ok)
    near = [r for r in ok if r.checkpoint_ms["p99"] <= floor * (1 + p99_slack)]
    return min(
        near,
        key=lambda r: (r.requests_per_checkpoint, r.checkpoint_ms["p99"], r.checkpoint_ms["p50"]),
    )


def _label(r: SimResult, by_branching: bool) -> str:
    if r.design in _FLAT or not by_branching:
        return r.design
    return f"{r.design} b={r.branching}"


_STYLE = {  # design -> (colour or None: by branching, line style, marker)
    "task": ("k", "--", ""),
    "executor": ("tab:red", "--", ""),
    "tree": (None, "-", "o"),
    "tree-noplan": (None, ":", "x"),
}


def _draw_panel(
    ax: Any,
    f: Callable[[SimResult], float],
    lines: dict[str, list[SimResult]],
    xpts: Sequence[float],
    xval: Callable[[SimResult], float],
    colour: dict[int, Any],
) -> None:
    """One line per label on ``ax``: flat designs horizontal, tree designs over x."""
    for label, rs in lines.items():
        c, ls, mk = _STYLE[rs[0].design]
        if rs[0].design in _FLAT:
            ax.plot(xpts, [f(rs[0])] * len(xpts), color=c, ls=ls, label=label)
            continue
        rs = sorted(rs, key=xval)
        ax.plot(
            [xval(r) for r in rs],
            [f(r) for r in rs],
            color=colour[rs[0].branching],
            ls=ls,
            marker=mk,
            label=label,
        )


def plot(
    results: Sequence[SimResult],
    path: str | Path,
    title: str = "",
    prefixes: int = 1,
    floor_ms: float | None = None,
) -> Path:
    """Checkpoint p50 and p99 (ms) and requests per checkpoint against the swept
    parameter (target object size if it varies, else branching), one line per design
    (per design and branching when both vary). ``task``/``executor`` are flat lines.
    The request panel marks the store's limit (``put_rate_limit`` x ``prefixes``
    requests per checkpoint interval), the p99 panel the floor ``floor_ms`` (one
    request's p99, ms) when given. Writes a PNG to ``path`` and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    tree_runs = [r for r in results if r.design not in _FLAT]
    targets = sorted({r.target_object_bytes for r in tree_runs})
    branchings = sorted({r.branching for r in tree_runs})
    x_is_target = len(targets) > 1 or len(branchings) <= 1
    xs = targets if x_is_target else branchings
    if not xs:
        xs = [results[0].target_object_bytes] if results else [0]

    def xval(r: SimResult) -> float:
        return r.target_object_bytes / 2**20 if x_is_target else r.branching

    lines: dict[str, list[SimResult]] = {}
    for r in results:
        lines.setdefault(_label(r, x_is_target and len(branchings) > 1), []).append(r)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    xlab = "target object size (MiB)" if x_is_target else "branching factor"
    xpts = [x / 2**20 for x in xs] if x_is_target else list(xs)
    panels = (
        ("checkpoint p50 (ms)", lambda r: r.checkpoint_ms["p50"]),
        ("checkpoint p99 (ms)", lambda r: r.checkpoint_ms["p99"]),
        ("requests per checkpoint", lambda r: r.requests_per_checkpoint),
    )
    cmap = plt.get_cmap("viridis")
    colour = {b: cmap(i / max(1, len(branchings) - 1) * 0.9) for i, b in enumerate(branchings)}
    for ax, (ylab, f) in zip(axes, panels, strict=True):
        _draw_panel(ax, f, lines, xpts, xval, colour)
        ax.set_xlabel(xlab)
        ax.set_ylabel(ylab)
        ax.set_yscale("log")
        if x_is_target or len(xpts) > 1:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xpts, [f"{x:g}" for x in xpts])  # the swept values, not powers
            ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(True, which="both", alpha=0.3)
    if results:
        r0 = results[0]
        rate = r0.put_rate_limit * prefixes
        limit = rate * r0.checkpoint_interval_s
        axes[2].axhline(limit, color="red", lw=1, label=f"{rate:g} PUT/s limit")
    if floor_ms is not None:
        axes[1].axhline(floor_ms, color="grey", lw=1, label=f"floor {floor_ms:.0f} ms")
        axes[1].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
