"""The optional PNG: utilisation and queue length over time (replay), or allocation ratio
against the fill fraction (fill). matplotlib is imported only when a plot is asked for."""

from __future__ import annotations

DAY_S = 86_400


def plot_replay(result: dict, path: str) -> None:
    plt = _pyplot()
    timeline = result["timeline"]
    days = [t / DAY_S for t in timeline["t_s"]]
    total = result["inputs"]["cluster"]["gpus"]
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    top.plot(days, [busy / total for busy in timeline["busy_gpus"]], linewidth=0.8)
    top.set_ylabel("GPU utilisation")
    top.set_ylim(0, 1.05)
    bottom.plot(days, timeline["queue"], linewidth=0.8, color="tab:red")
    bottom.set_ylabel("jobs waiting")
    bottom.set_xlabel("days since the first arrival")
    figure.suptitle(f"replay, policy {result['policy']}: utilisation {result['utilization']:.3f}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_fill(result: dict, path: str) -> None:
    plt = _pyplot()
    ratios = result["allocation_ratio"]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot([float(f) for f in ratios], list(ratios.values()), marker="o")
    axes.set_xlabel("GPUs asked for / cluster GPUs")
    axes.set_ylabel("GPU allocation ratio")
    axes.set_title(f"fill, policy {result['policy']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
