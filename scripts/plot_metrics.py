#!/usr/bin/python3
"""Plot train_mt --metrics JSON Lines as PNG files.

    plot_metrics.py RUN.jsonl                        # RUN.png beside it
    plot_metrics.py RUN.jsonl -o run.png
    plot_metrics.py A.jsonl B.jsonl                  # A.png and B.png, one per run
    plot_metrics.py A.jsonl B.jsonl -o compare.png   # both runs overlaid in one figure
    plot_metrics.py --x time --label tiny --label small A.jsonl B.jsonl -o compare.png

Six panels: loss (training and dev), learning rate, gradient norm, tokens/s,
dev BLEU and peak memory per rank (the allocator's peak, solid, and the peak
resident set, dashed), over steps or, with --x time, over wall time (the
elapsed_s of each row; a resumed run's clock starts again at 0, so its rows
are drawn after the last time before it). With --x step a resumed run's rows
replace the rows of the steps it ran again. Overlay labels are the file
names without .jsonl, or --label, given once per file in order.

Prints the path of each PNG and its panels; the panel titles are also in the
PNG's Description. --list-panels builds the figures and prints their panel
titles, one per line, without writing anything.

A line that is not a JSON object, or a row without an integer step or with
a figure that is not a number, is refused with the file and line number
(exit 1); so is a file without training or evaluation rows, and --x time on
rows without elapsed_s. Usage errors exit 2. Needs Debian's
python3-matplotlib (scripts/install_deps.sh --plot) and runs with the
system's /usr/bin/python3; drawn with the Agg backend, no display needed.
"""
import argparse
import json
import math
import os
import sys

PANELS = ["loss", "learning rate", "gradient norm", "tokens/s", "dev BLEU", "peak memory per rank (MiB)"]
# Records train_mt writes beside the rows drawn here: --profile's table,
# --keep-best's new best, --patience's stop, --average-last's result.
SIDE_RECORDS = ("profile", "best", "early_stop", "averaged", "time")  # "time": the shares of evaluating and saving
TRAIN_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s")


class MetricsError(Exception):
    pass


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def load(path):
    """(training rows, evaluation rows) of one metrics file, in file order,
    each row with its line number under "_line"."""
    train, dev = [], []
    try:
        f = open(path, "rb")
    except OSError as e:
        raise MetricsError(f"{path}: {e.strerror}") from None
    with f:
        for n, raw in enumerate(f, 1):
            where = f"{path}:{n}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise MetricsError(f"{where}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                raise MetricsError(f"{where}: not a JSON line (column {e.colno}: {e.msg})") from None
            except ValueError as e:  # a number too long to convert
                raise MetricsError(f"{where}: not a JSON line ({e})") from None
            if not isinstance(row, dict):
                raise MetricsError(f"{where}: not a JSON object")
            if any(k in row for k in SIDE_RECORDS):
                continue  # train_mt's other records: nothing to draw
            step = row.get("step")
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                raise MetricsError(f"{where}: no integer \"step\"")
            for k in ("elapsed_s",) + TRAIN_KEYS + ("dev_loss", "dev_bleu"):
                if k in row and not is_number(row[k]):
                    raise MetricsError(f"{where}: \"{k}\" is not a number: {json.dumps(row[k])}")
            for k in ("mem_peak_mib", "mem_rss_mib"):
                if k in row and not (isinstance(row[k], list) and all(is_number(v) for v in row[k])):
                    raise MetricsError(f"{where}: \"{k}\" is not a list of numbers")
            row["_line"] = n
            if "memory" in row:
                if not isinstance(row["memory"], list):
                    raise MetricsError(f"{where}: \"memory\" is not a list")
            elif "loss" in row:
                missing = [k for k in TRAIN_KEYS if k not in row]
                if missing:
                    raise MetricsError(f"{where}: a training row without {', '.join(missing)}")
                train.append(row)
            elif "dev_loss" in row:
                dev.append(row)
            else:
                raise MetricsError(f"{where}: neither a training row (loss), an evaluation row (dev_loss) "
                                   "nor a memory record")
    if not train and not dev:
        raise MetricsError(f"{path}: no training or evaluation rows")
    return train, dev


class Run:
    def __init__(self, path, label, xmode):
        self.path, self.label = path, label
        train, dev = load(path)
        if xmode == "time":
            self._times(train, dev)
        else:
            train, dev = latest(train), latest(dev)
            for r in train + dev:
                r["_x"] = r["step"]
        self.train, self.dev = train, dev

    def _times(self, train, dev):
        """_x = wall seconds, continued across resumed runs (elapsed_s restarts)."""
        rows = sorted(train + dev, key=lambda r: r["_line"])
        offset, last = 0.0, None
        for r in rows:
            if "elapsed_s" not in r:
                raise MetricsError(f"{self.path}:{r['_line']}: no \"elapsed_s\" for --x time (written by "
                                   "train_mt since it records wall time; use --x step)")
            e = float(r["elapsed_s"])
            if last is not None and e < last[0]:
                offset = last[1]  # a resumed run: its clock starts again
            r["_x"] = offset + e
            last = (e, r["_x"])


def latest(rows):
    """Rows in file order; a step logged again (a resumed run) drops the rows
    from that step on that came before it."""
    out = []
    for r in rows:
        while out and out[-1]["step"] >= r["step"]:
            out.pop()
        out.append(r)
    return out


def series(rows, key):
    pts = [(r["_x"], r[key]) for r in rows if key in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def draw(runs, xmode, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(12, 10.5))
    ax = dict(zip(PANELS, axes.flat))
    for name, a in ax.items():
        a.set_title(name)
        a.grid(True, alpha=0.3)
    span = max((r["_x"] for run in runs for r in run.train + run.dev), default=0)
    scale, xlabel = 1.0, "step"
    if xmode == "time":
        scale, xlabel = (60.0, "wall time (min)") if span > 600 else (1.0, "wall time (s)")
    overlay = len(runs) > 1
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    have = {p: False for p in PANELS}

    def plot(panel, xs, ys, **kw):
        if xs:
            ax[panel].plot([x / scale for x in xs], ys, **kw)
            have[panel] = True

    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        tag = f"{run.label} " if overlay else ""
        plot("loss", *series(run.train, "loss"), color=c, label=f"{tag}train")
        plot("loss", *series(run.dev, "dev_loss"), color=c if overlay else colors[1], linestyle="--", marker="o",
             markersize=3, label=f"{tag}dev")
        plot("learning rate", *series(run.train, "lr"), color=c, label=run.label)
        plot("gradient norm", *series(run.train, "grad_norm"), color=c, label=run.label)
        plot("tokens/s", *series(run.train, "tokens_per_s"), color=c, label=run.label)
        plot("dev BLEU", *series(run.dev, "dev_bleu"), color=c, marker="o", markersize=3, label=run.label)
        mem = [r for r in run.train if "mem_peak_mib" in r]
        ranks = max((len(r["mem_peak_mib"]) for r in mem), default=0)
        for k in range(ranks):
            ck = c if overlay else colors[k % len(colors)]
            pts = [(r["_x"], r["mem_peak_mib"][k]) for r in mem if k < len(r["mem_peak_mib"])]
            rss = [(r["_x"], r["mem_rss_mib"][k]) for r in mem if k < len(r.get("mem_rss_mib", []))]
            who = (f"{run.label} ({ranks} rank{'s' if ranks > 1 else ''})" if k == 0 else None) if overlay \
                else f"rank {k}"
            plot("peak memory per rank (MiB)", [p[0] for p in pts], [p[1] for p in pts], color=ck,
                 alpha=1.0 if k == 0 or not overlay else 0.5, label=who)
            plot("peak memory per rank (MiB)", [p[0] for p in rss], [p[1] for p in rss], color=ck,
                 linestyle="--", alpha=0.6, label=(f"{who} RSS" if who else None))
    these = "these runs" if overlay else "this run"
    notes = {"dev BLEU": f"no dev BLEU in {these} (a synthetic task, or no evaluation yet)",
             "peak memory per rank (MiB)": f"no memory figures in {these}"}
    for p in PANELS:
        a = ax[p]
        a.set_xlabel(xlabel)
        if not have[p]:
            a.text(0.5, 0.5, notes.get(p, "no data"), transform=a.transAxes, ha="center", va="center",
                   color="gray", wrap=True)
        elif a.get_legend_handles_labels()[0] and (overlay or p in ("loss", "peak memory per rank (MiB)")):
            a.legend(fontsize="small")
    ax["learning rate"].ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    losses = [v for run in runs for v in series(run.train, "loss")[1] + series(run.dev, "dev_loss")[1]
              if math.isfinite(v)]
    if losses and max(losses) > 0 and min(losses) > 0 and max(losses) / min(losses) > 20:
        ax["loss"].set_yscale("log")
    fig.suptitle(title)
    fig.tight_layout()
    return fig, plt


def default_out(path):
    base = path[:-len(".jsonl")] if path.endswith(".jsonl") else path
    return base + ".png"


def labels_for(paths, given):
    if given:
        return given
    stems = [os.path.basename(default_out(p))[:-len(".png")] for p in paths]
    if len(set(stems)) < len(stems):  # the same file name in several folders: keep the folders
        stems = [default_out(p)[:-len(".png")] for p in paths]
    return stems


def main(argv):
    ap = argparse.ArgumentParser(prog="plot_metrics.py", description="Plot train_mt --metrics JSON Lines.",
                                 epilog="One PNG per run beside its file, or all runs overlaid with -o.")
    ap.add_argument("files", nargs="+", metavar="RUN.jsonl")
    ap.add_argument("-o", "--output", metavar="OUT.png",
                    help="the PNG to write; with several runs, one figure with all of them overlaid")
    ap.add_argument("--label", action="append", default=[], help="a run's name in legends (once per file, in order)")
    ap.add_argument("--x", choices=("step", "time"), default="step", help="x axis: step (default) or wall time")
    ap.add_argument("--title", help="the figure's title (default: the run's label, or the labels overlaid)")
    ap.add_argument("--list-panels", action="store_true", help="print the panel titles, write nothing")
    a = ap.parse_args(argv)
    if a.label and len(a.label) != len(a.files):
        ap.error(f"--label given {len(a.label)} times for {len(a.files)} files")
    if a.output and not a.output.endswith(".png"):
        ap.error(f"-o {a.output}: the output is a PNG file (name it .png)")
    labels = labels_for(a.files, a.label)
    try:
        runs = [Run(p, l, a.x) for p, l in zip(a.files, labels)]
    except MetricsError as e:
        print(f"plot_metrics: {e}", file=sys.stderr)
        return 1
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_metrics: matplotlib is missing: install Debian's python3-matplotlib "
              "(bash scripts/install_deps.sh --plot) and run with /usr/bin/python3", file=sys.stderr)
        return 1
    jobs = [(runs, a.output)] if a.output else [([r], default_out(r.path)) for r in runs]
    for group, out in jobs:
        title = a.title or (group[0].label if len(group) == 1 else " vs ".join(r.label for r in group))
        fig, plt = draw(group, a.x, title)
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        if a.list_panels:
            print("\n".join(titles))
        else:
            try:
                fig.savefig(out, dpi=100, metadata={"Title": title, "Description": "panels: " + "; ".join(titles),
                                                    "Software": "tptrain scripts/plot_metrics.py"})
            except OSError as e:
                print(f"plot_metrics: {out}: {e.strerror or e}", file=sys.stderr)
                return 1
            print(f"plot_metrics: wrote {out} ({len(group)} run{'s' if len(group) > 1 else ''}, panels: "
                  f"{'; '.join(titles)})")
        plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
