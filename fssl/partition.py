"""The paper's partition (section 5.1): a class-balanced labeled split, the rest unlabeled, each pool
spread over M clients (IID or Dirichlet(delta) per class, independent draws), and each client's own
labeled images added, labels removed, to its unlabeled set.

`scenario` places the labeled split elsewhere (the three federated semi-supervised scenarios):
labels_at_clients (the paper's, above), labels_at_server (the server holds the labeled split, the
unlabeled pool is spread over the M clients, which hold no label) and labels_at_partial_clients (the
labeled split is spread over the first L clients, which hold nothing else, and the unlabeled pool
over the other M - L, which hold no label).

`partition.mode: flwr` spreads the images with one of Flower Datasets' partitioners instead
(`partition.partitioner`, its keyword arguments in `partition.params`): the same labeled split is
drawn first, the partitioner then divides the whole training set (labeled and unlabeled pools
together) among the clients, and each client's labeled set is what it received of the labeled
pool. Flower Datasets is Flower's data library, not its framework: it is imported only then.

`partition.pool_order` orders each client's unlabeled pool: by index (the default), or for Dirichlet
pools class by class as the authors' lists are (order_pools).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAX_REDRAWS = 1000


SCENARIOS = ("labels_at_clients", "labels_at_server", "labels_at_partial_clients")
POOL_ORDERS = ("index", "class")


@dataclass
class Partition:
    labeled: list[np.ndarray]  # per client: indices into the train set
    unlabeled: list[np.ndarray]  # per client: indices into the train set (own labeled included)
    num_classes: int
    server: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # the server's labels

    @property
    def num_clients(self) -> int:
        return len(self.labeled)

    def histograms(self, y: np.ndarray) -> dict[str, list[list[int]]]:
        labeled, unlabeled = label_counts(self, y)
        return {"labeled": labeled.tolist(), "unlabeled": unlabeled.tolist()}

    def to_json(self) -> dict:
        return {
            "num_classes": self.num_classes,
            "labeled": [i.tolist() for i in self.labeled],
            "unlabeled": [i.tolist() for i in self.unlabeled],
            "server": self.server.tolist(),
        }


def label_counts(
    part: Partition, labels: np.ndarray, num_classes: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per client, the number of images of each class in its labeled and in its unlabeled data:
    two (clients, classes) integer arrays (the unlabeled counts include the client's own labeled
    images, as its unlabeled set does)."""
    k = part.num_classes if num_classes is None else num_classes

    def counts(sets: list[np.ndarray]) -> np.ndarray:
        out = np.zeros((len(sets), k), dtype=np.int64)
        for m, idx in enumerate(sets):
            c = np.bincount(labels[idx], minlength=k)
            if len(c) > k:
                raise ValueError(f"label {len(c) - 1} is outside the {k} classes")
            out[m] = c
        return out

    return counts(part.labeled), counts(part.unlabeled)


def balanced_labeled_split(
    y: np.ndarray, num_labeled: int, num_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """`num_labeled // K` random samples per class as labeled; everything else unlabeled."""
    per_class = num_labeled // num_classes
    if per_class < 1:
        raise ValueError(
            f"dataset.num_labeled={num_labeled} gives no labeled sample per class "
            f"for {num_classes} classes; use at least {num_classes}"
        )
    chosen = []
    for c in range(num_classes):
        idx = np.flatnonzero(y == c)
        if len(idx) < per_class:
            raise ValueError(
                f"class {c} has {len(idx)} training images, fewer than the {per_class} "
                f"labeled per class that dataset.num_labeled={num_labeled} asks of "
                f"{num_classes} classes: lower dataset.num_labeled, or check the labels (a "
                "stray label K adds a class; an .npz may carry num_classes)"
            )
        chosen.append(rng.choice(idx, per_class, replace=False))
    labeled = np.sort(np.concatenate(chosen))
    unlabeled = np.setdiff1d(np.arange(len(y)), labeled)
    return labeled, unlabeled


def spread(
    idx: np.ndarray,
    y: np.ndarray,
    num_clients: int,
    mode: str,
    delta: float | None,
    num_classes: int,
    rng: np.random.Generator,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Spread the pool `idx` over clients. IID: equal random shares (remainder spread one each).
    Dirichlet: per class, proportions ~ Dir(delta * 1_M), clients already over N/M capped at 0
    (the partitioner of SemiFL/FedDB), redrawn until every client holds `min_size` samples."""
    if len(idx) < num_clients * min_size:
        raise ValueError(
            f"cannot give {num_clients} clients {min_size} sample(s) each from a "
            f"pool of {len(idx)}; use fewer clients or more data"
        )
    if mode == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(idx), num_clients)]
    cap = len(idx) / num_clients
    for _ in range(MAX_REDRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients)
        for c in range(num_classes):
            members = rng.permutation(idx[y[idx] == c])
            p = rng.dirichlet(np.full(num_clients, float(delta)))
            p = p * (sizes < cap)
            p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(p) * len(members)).astype(int)[:-1]
            for m, chunk in enumerate(np.split(members, cuts)):
                parts[m].append(chunk)
                sizes[m] += len(chunk)
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
    raise ValueError(
        f"Dirichlet(delta={delta}) could not give every one of {num_clients} "
        f"clients {min_size} sample(s) in {MAX_REDRAWS} draws; raise delta or "
        "lower partition.min_size"
    )


def long_tailed(
    pool: np.ndarray, y: np.ndarray, num_classes: int, ratio: float, rng: np.random.Generator
) -> np.ndarray:
    """A random subset of `pool` whose class counts fall exponentially from class 0 to class K-1,
    n_c = n_max * ratio^(-c / (K - 1)) (the CIFAR-LT profile), n_max the smallest class's size in
    the pool, so the largest class over the smallest is `ratio` (to rounding)."""
    members = [pool[y[pool] == c] for c in range(num_classes)]
    n_max = min(len(m) for m in members)
    keep = [
        rng.choice(m, max(1, round(n_max * ratio ** (-c / max(num_classes - 1, 1)))), replace=False)
        for c, m in enumerate(members)
    ]
    return np.sort(np.concatenate(keep))


def split_pools(
    y: np.ndarray, num_classes: int, num_labeled: int, seed: int, imbalance_ratio: float | None
) -> tuple[np.random.Generator, np.ndarray, np.ndarray]:
    """The run's generator and its two pools: the class-balanced labeled split and the rest,
    long-tailed when `imbalance_ratio` is given (the generator goes on to spread them)."""
    rng = np.random.default_rng([seed, 2024])
    labeled_pool, unlabeled_pool = balanced_labeled_split(y, num_labeled, num_classes, rng)
    if imbalance_ratio is not None:
        unlabeled_pool = long_tailed(unlabeled_pool, y, num_classes, imbalance_ratio, rng)
    return rng, labeled_pool, unlabeled_pool


def make_partition(
    y: np.ndarray,
    num_classes: int,
    num_labeled: int,
    num_clients: int,
    mode: str,
    delta: float | None,
    seed: int,
    min_size: int = 1,
    imbalance_ratio: float | None = None,
    scenario: str = "labels_at_clients",
    labeled_clients: int | None = None,
) -> Partition:
    """`imbalance_ratio`: the unlabeled pool is long-tailed (long_tailed) before it is spread;
    the labeled set and the test set stay balanced. Images left out are used by no client.
    `scenario`, `labeled_clients`: where the labeled split goes (the module's docstring)."""
    rng, labeled_pool, unlabeled_pool = split_pools(
        y, num_classes, num_labeled, seed, imbalance_ratio
    )
    if scenario != "labels_at_clients":
        return place_labels(
            scenario,
            labeled_pool,
            unlabeled_pool,
            num_clients,
            labeled_clients,
            lambda pool, n: spread(pool, y, n, mode, delta, num_classes, rng, min_size),
            num_classes,
        )
    labeled = spread(labeled_pool, y, num_clients, mode, delta, num_classes, rng, min_size)
    unlabeled = spread(unlabeled_pool, y, num_clients, mode, delta, num_classes, rng, min_size)
    unlabeled = [np.sort(np.concatenate([u, l])) for u, l in zip(unlabeled, labeled)]
    return Partition(labeled, unlabeled, num_classes)


def place_labels(
    scenario: str,
    labeled_pool: np.ndarray,
    unlabeled_pool: np.ndarray,
    num_clients: int,
    labeled_clients: int | None,
    spread_pool: Callable[[np.ndarray, int], list[np.ndarray]],
    num_classes: int,
) -> Partition:
    """labels_at_server: the labeled pool is the server's, the unlabeled pool is spread over all
    clients. labels_at_partial_clients: the labeled pool is spread over clients 0..L-1 (their
    unlabeled set is their own labeled images, as everywhere: what APP-U is measured on), the
    unlabeled pool over clients L..M-1. `spread_pool(pool, n)` spreads a pool over n clients."""
    none = np.zeros(0, dtype=np.int64)
    if scenario == "labels_at_server":
        unlabeled = spread_pool(unlabeled_pool, num_clients)
        return Partition([none] * num_clients, unlabeled, num_classes, server=labeled_pool)
    if scenario != "labels_at_partial_clients":
        raise ValueError(f"unknown scenario '{scenario}': choose one of {', '.join(SCENARIOS)}")
    if labeled_clients is None or not 1 <= labeled_clients < num_clients:
        raise ValueError(
            f"labels_at_partial_clients needs 1 <= scenario.labeled_clients < fl.num_clients="
            f"{num_clients}, not {labeled_clients}"
        )
    labeled = spread_pool(labeled_pool, labeled_clients)
    unlabeled = spread_pool(unlabeled_pool, num_clients - labeled_clients)
    return Partition(
        labeled + [none] * (num_clients - labeled_clients), labeled + unlabeled, num_classes
    )


# Flower Datasets' horizontal partitioners that need nothing but the labels: what this project
# fills in for each (the rest come from partition.params)
FLOWER_PARTITIONERS = (
    "IidPartitioner",
    "DirichletPartitioner",
    "InnerDirichletPartitioner",
    "PathologicalPartitioner",
    "ShardPartitioner",
    "LinearPartitioner",
    "SquarePartitioner",
    "ExponentialPartitioner",
    "SizePartitioner",
)


def flower_partitioner(name: str, params: dict, num_clients: int, num_images: int, seed: int):
    """The named Flower Datasets partitioner, built with `params` plus what the run decides:
    num_partitions (fl.num_clients), partition_by ("label"), seed, and equal partition_sizes when
    the partitioner needs sizes and none are given. Raises ValueError naming the partitioner."""
    import inspect

    import flwr_datasets.partitioner as fp

    if name not in FLOWER_PARTITIONERS:
        raise ValueError(
            f"partition.partitioner '{name}' is not one of Flower Datasets' partitioners that "
            f"work on labels alone: {', '.join(FLOWER_PARTITIONERS)}"
        )
    cls = getattr(fp, name)
    accepted = inspect.signature(cls.__init__).parameters
    ours = {"num_partitions": num_clients, "partition_by": "label", "seed": seed}
    if "partition_sizes" in accepted and "partition_sizes" not in params:
        ours["partition_sizes"] = [
            len(c) for c in np.array_split(np.arange(num_images), num_clients)
        ]
    unknown = sorted(set(params) - set(accepted) - {"self"})
    if unknown:
        raise ValueError(
            f"partition.params {unknown} are not parameters of {name}: it takes "
            f"{', '.join(k for k in accepted if k not in ('self', *ours))}"
        )
    kwargs = {k: v for k, v in ours.items() if k in accepted} | dict(params)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}({kwargs}) cannot be built: {err}") from err


def check_partitioner(name: str, params: dict, num_clients: int, seed: int) -> None:
    """Build the partitioner and partition 100 images per client of 10 balanced classes with it:
    a bad name or parameter raises ValueError naming it before any data is read (some
    partitioners check their parameters only when they partition)."""
    from datasets import Dataset

    labels = np.arange(100 * num_clients) % 10
    partitioner = flower_partitioner(name, params, num_clients, len(labels), seed)
    partitioner.dataset = Dataset.from_dict({"label": labels})
    try:
        partitioner.load_partition(0)
    except (ValueError, TypeError, KeyError, IndexError) as err:
        raise ValueError(f"{name}({params}) cannot partition: {err}") from err


def flower_partition(
    y: np.ndarray,
    num_classes: int,
    num_labeled: int,
    num_clients: int,
    name: str,
    params: dict,
    seed: int,
    imbalance_ratio: float | None = None,
    scenario: str = "labels_at_clients",
    labeled_clients: int | None = None,
) -> Partition:
    """The paper's labeled split, then a Flower Datasets partitioner over both pools together
    (labels_at_clients), or over each pool apart for the other scenarios (place_labels)."""
    _, labeled_pool, unlabeled_pool = split_pools(
        y, num_classes, num_labeled, seed, imbalance_ratio
    )
    if scenario != "labels_at_clients":
        return place_labels(
            scenario,
            labeled_pool,
            unlabeled_pool,
            num_clients,
            labeled_clients,
            lambda pool, n: flower_spread(pool, y, n, name, params, seed),
            num_classes,
        )
    images = np.sort(np.concatenate([labeled_pool, unlabeled_pool]))
    is_labeled = np.isin(np.arange(len(y)), labeled_pool)
    labeled, unlabeled = [], []
    for own in flower_spread(images, y, num_clients, name, params, seed):
        labeled.append(own[is_labeled[own]])
        unlabeled.append(own)  # its own labeled images included, as in the paper's partition
    empty = [m for m, lab in enumerate(labeled) if len(lab) == 0]
    if empty:
        raise ValueError(
            f"{name} left client(s) {empty[:5]} without a labeled image (dataset.num_labeled="
            f"{num_labeled} over {num_clients} clients); raise dataset.num_labeled, use fewer "
            "clients, or other partition.params"
        )
    return Partition(labeled, unlabeled, num_classes)


def flower_spread(
    pool: np.ndarray, y: np.ndarray, n: int, name: str, params: dict, seed: int
) -> list[np.ndarray]:
    """The images `pool` divided among n clients by the named Flower Datasets partitioner."""
    from datasets import Dataset

    partitioner = flower_partitioner(name, params, n, len(pool), seed)
    partitioner.dataset = Dataset.from_dict(
        {"label": y[pool].astype(np.int64), "index": pool.astype(np.int64)}
    )
    out = []
    for m in range(n):
        try:
            out.append(np.sort(np.asarray(partitioner.load_partition(m)["index"], dtype=np.int64)))
        except ValueError as err:
            raise ValueError(f"{name} cannot partition this dataset: {err}") from err
    return out


def class_ordered(idx: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`idx` class by class, 0..K-1, each class in index order: how the authors' non_iid builds a
    client's list (per class, a contiguous slice of torch.where's ascending indices)."""
    idx = np.sort(idx)
    return idx[np.argsort(y[idx], kind="stable")]


def order_pools(part: Partition, y: np.ndarray) -> Partition:
    """`partition.pool_order=class`: each client's unlabeled pool in the authors' order, its own
    labeled images first, then the rest, each part class by class, as their pool is
    `labeled_split + unlabeled_split` (main.py L49), so their unshuffled batches of 250 (the
    pseudo-label and APP-U pass) are grouped by class. The labeled sets keep index order: the
    authors train on them in one full batch, where order changes nothing."""
    part.unlabeled = [
        np.concatenate([class_ordered(lab, y), class_ordered(np.setdiff1d(unl, lab), y)])
        for lab, unl in zip(part.labeled, part.unlabeled)
    ]
    return part


def scenario_of(cfg: dict) -> tuple[str, int | None]:
    """The run's scenario and its number of labeled clients (runs saved before scenarios existed
    are labels_at_clients)."""
    sc = cfg.get("scenario") or {}
    return sc.get("name", "labels_at_clients"), sc.get("labeled_clients")


def partition_from_cfg(cfg: dict, y: np.ndarray, num_classes: int) -> Partition:
    p = cfg["partition"]
    scenario, labeled_clients = scenario_of(cfg)
    if p["mode"] == "flwr":
        return flower_partition(
            y,
            num_classes,
            cfg["dataset"]["num_labeled"],
            cfg["fl"]["num_clients"],
            p["partitioner"],
            p.get("params") or {},
            cfg["seed"],
            p.get("imbalance_ratio"),
            scenario,
            labeled_clients,
        )
    part = make_partition(
        y,
        num_classes,
        cfg["dataset"]["num_labeled"],
        cfg["fl"]["num_clients"],
        p["mode"],
        p["delta"],
        cfg["seed"],
        p["min_size"],
        p.get("imbalance_ratio"),
        scenario,
        labeled_clients,
    )
    # only Dirichlet pools: the authors' iid lists are in random order (randperm), which index
    # order already matches in class mix, so an IID pool keeps index order under either value
    if p["mode"] == "dirichlet" and p.get("pool_order", "index") == "class":
        return order_pools(part, y)
    return part


def summary_table(part: Partition, y: np.ndarray) -> str:
    """Per-client class histograms of labeled and unlabeled data as a text table."""
    hist = part.histograms(y)
    k = part.num_classes
    head = f"{'client':>6} {'n_lab':>6} {'n_unl':>6} | labeled per class | unlabeled per class"
    lines = [head, "-" * len(head)]
    for m in range(part.num_clients):
        lab, unl = hist["labeled"][m], hist["unlabeled"][m]
        if k <= 20:
            lab_s, unl_s = " ".join(map(str, lab)), " ".join(map(str, unl))
        else:
            lab_s = f"{sum(1 for v in lab if v)} classes present"
            unl_s = f"{sum(1 for v in unl if v)} classes present"
        lines.append(f"{m:>6} {sum(lab):>6} {sum(unl):>6} | {lab_s} | {unl_s}")
    if len(part.server):  # labels_at_server: the labeled split stays with the server
        counts = np.bincount(y[part.server], minlength=k)
        shown = " ".join(map(str, counts)) if k <= 20 else f"{int((counts > 0).sum())} classes"
        lines.append(f"{'server':>6} {len(part.server):>6} {0:>6} | {shown} |")
    return "\n".join(lines) + "\n"


def partition_label(p: dict) -> str:
    """A partition in a run directory's name: dirichlet0.3, iid, or the Flower Datasets
    partitioner's name."""
    return p["partitioner"] if p["mode"] == "flwr" else f"{p['mode']}{p['delta'] or ''}"


def partition_name(cfg: dict | None) -> str:
    """How a figure names a run's partition: 'IID', 'Dirichlet δ=0.3', with the long-tailed
    unlabeled pool's ratio when there is one; '' without a configuration."""
    p = (cfg or {}).get("partition")
    if not p:
        return ""
    if p["mode"] == "flwr":
        params = ", ".join(f"{k}={v}" for k, v in (p.get("params") or {}).items())
        name = f"{p['partitioner']}({params})"
    else:
        name = "IID" if p["mode"] == "iid" else f"Dirichlet δ={p['delta']}"
    if p.get("imbalance_ratio") is not None:
        name += f", unlabeled pool long-tailed {p['imbalance_ratio']}:1"
    return name


def label_figure_title(cfg: dict | None) -> str:
    """The dataset and partition that the label-distribution figure's titles name."""
    dataset = ((cfg or {}).get("dataset") or {}).get("name")
    return ", ".join(t for t in (dataset, partition_name(cfg)) if t)


LABEL_FIGURE_DPI = 100


def label_figure_size(num_clients: int) -> tuple[float, float]:
    """Width and height (inches) of the label-distribution figure: wider with more clients, up
    to 100 clients at about a tenth of an inch each."""
    return min(16.0, max(8.0, 5.0 + 0.11 * num_clients)), 6.5


def plot_label_distribution(
    labeled: np.ndarray, unlabeled: np.ndarray, path: Path, title: str = ""
) -> Path:
    """Two panels, labeled data above and unlabeled below: per client (x axis) a bar stacked by
    class, one colour per class (a legend up to 20 classes, a colour bar beyond), no per-bar
    labels. `labeled`, `unlabeled`: (clients, classes) counts, as label_counts returns them. Each
    panel's bars are one polygon collection and Agg draws the figure without pyplot, so that 100
    clients of 100 classes take a fraction of a second and no global matplotlib state changes."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    num_clients, k = labeled.shape
    # classes 0..k-1 take tab10's (or tab20's) first k colours; more classes a sampled turbo
    cmap = (
        ListedColormap(colormaps["tab10" if k <= 10 else "tab20"].colors[:k])
        if k <= 20
        else colormaps["turbo"].resampled(k)
    )
    colours = [cmap(c) for c in range(k)]
    width, height = label_figure_size(num_clients)
    fig = Figure(figsize=(width, height), dpi=LABEL_FIGURE_DPI)
    FigureCanvasAgg(fig)
    # fixed margins in inches (a layout engine would double the drawing time): the legend or
    # colour bar on the right
    axes = fig.subplots(2, 1, sharex=True)
    right = 1 - 1.3 / width
    fig.subplots_adjust(left=0.8 / width, right=right, bottom=0.6 / height, top=1 - 0.7 / height)
    fig.subplots_adjust(hspace=0.9 / (height / 2 - 0.5))
    x = np.arange(num_clients, dtype=float)
    x0, x1 = x - 0.4, x + 0.4
    if title:  # the setting once, above both panels (a panel's title is short: it fits)
        fig.suptitle(title, fontsize=10, y=1 - 0.12 / height, va="top")
    for ax, counts, what in (
        (axes[0], labeled, "Labeled images per client"),
        (axes[1], unlabeled, "Unlabeled images per client (own labeled included)"),
    ):
        # one rectangle per non-empty (client, class) cell, all in one collection
        top = np.cumsum(counts, axis=1)
        client, cls = np.nonzero(counts)
        lo, hi = (top - counts)[client, cls], top[client, cls]
        a, b = x0[client], x1[client]
        verts = np.stack([np.stack(v, 1) for v in ((a, lo), (a, hi), (b, hi), (b, lo))], 1)
        ax.add_collection(
            PolyCollection(verts, facecolors=np.asarray(colours)[cls], edgecolors="none")
        )
        ax.set_xlim(-0.6, num_clients - 0.4)
        ax.set_ylim(0, max(1, int(counts.sum(1).max())) * 1.03)
        ax.set_ylabel("images")
        ax.set_title(what, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[1].set_xlabel(f"client (0-{num_clients - 1})")
    if num_clients <= 20:
        axes[1].set_xticks(range(num_clients))
    else:
        axes[1].xaxis.set_major_locator(MaxNLocator(nbins=20, integer=True))
    if k <= 20:
        fig.legend(
            handles=[Patch(color=colours[c], label=str(c)) for c in range(k)],
            title="class",
            loc="center left",
            bbox_to_anchor=(right + 0.15 / width, 0.5),
            fontsize=8,
            frameon=False,
        )
    else:
        norm = BoundaryNorm(np.arange(k + 1) - 0.5, k)
        cax = fig.add_axes((right + 0.25 / width, 0.15, 0.2 / width, 0.7))
        bar = fig.colorbar(ScalarMappable(norm, cmap), cax=cax, label="class")
        bar.locator = MaxNLocator(nbins=10, integer=True)
        bar.minorticks_off()
        bar.update_ticks()
    fig.savefig(path)
    return path


def save_partition(part: Partition, y: np.ndarray, run_dir: Path, cfg: dict | None = None) -> None:
    """partition.json (the indices), partition_summary.json/.txt (class counts per client) and
    label_distribution.png (the counts as a figure; `cfg`, the run's configuration, names the
    dataset and partition in its titles)."""
    (run_dir / "partition.json").write_text(json.dumps(part.to_json()))
    labeled, unlabeled = label_counts(part, y)
    hist = {"labeled": labeled.tolist(), "unlabeled": unlabeled.tolist()}
    summary = {
        "num_clients": part.num_clients,
        "num_classes": part.num_classes,
        "num_labeled": [len(i) for i in part.labeled],
        "num_unlabeled": [len(i) for i in part.unlabeled],
        **hist,
        "server": np.bincount(y[part.server], minlength=part.num_classes).tolist(),
    }
    (run_dir / "partition_summary.json").write_text(json.dumps(summary))
    (run_dir / "partition_summary.txt").write_text(summary_table(part, y))
    plot_label_distribution(
        labeled, unlabeled, run_dir / "label_distribution.png", label_figure_title(cfg)
    )
