"""Speed of local training: the project's path against the authors' kind of path, in one process.

    feddb bench                                 # CPU: small sizes, about 2-4 minutes
    feddb bench --device cuda --preset paper   # GPU: the paper's round
    feddb bench --preset exact                  # the exact regime's round (benchmarks/exact.py)

Both paths train FedDB's client (FixMatch with full-batch steps) on the same client data and model:
- project: uint8 data resident on the device, batched per-sample augmentation on the device, bf16
  autocast + channels_last on CUDA (fp32 on CPU), optional torch.compile;
- reference: per-image torchvision PIL transforms (flip, reflect-pad crop, RandAugment(2, 10)) in a
  DataLoader on the CPU, then fp32 NCHW on the device, as the authors' code.
It prints images/s for augmentation alone and for a local training step, seconds per round (clients x
local epochs, full batch, each client also pseudo-labelling its unlabeled data once), peak memory and
the speed-up; with --flwr-rounds N it also runs N rounds of a real `flwr run` simulation of the same
round and reports Flower's and Ray's overhead per round. Every unlabeled sample counts as confident
(tau close to 0), the most work a round can take.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from fssl import augment  # noqa: E402
from fssl.data import load_dataset  # noqa: E402
from fssl.instruction import Instruction  # noqa: E402
from fssl.methods import make_model, make_trainer  # noqa: E402
from fssl.runtime import data_meta  # noqa: E402
from fssl.train import ClientData, to_nchw  # noqa: E402
from server_app.config import compose  # noqa: E402

EXPERIMENT = "paper/cifar10_dir0.3"  # the paper's protocol: full batch, E = 5, lr 0.03, tau 0.95
PRESETS = {  # clients per round, labeled and unlabeled images per client, local epochs
    "small": dict(dataset="mnist10k", model="cnn", clients=10, labeled=50, unlabeled=400, epochs=5),
    "paper": dict(
        dataset="cifar10", model="wrn28_2", clients=10, labeled=40, unlabeled=500, epochs=5
    ),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device, repeat: int = 1, warmup: bool = True) -> float:
    """Seconds per call (after one warm-up call unless `warmup` is false)."""
    if warmup:
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / repeat


def client_images(args, ds) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per client: labeled images/labels and unlabeled images/labels (NHWC uint8), disjoint slices
    of the training set (cycled when the set is small)."""
    per = args.labeled + args.unlabeled
    idx = np.arange(args.clients * per) % len(ds.y_train)
    out = []
    for c in range(args.clients):
        li, ui = idx[c * per : c * per + args.labeled], idx[c * per + args.labeled : (c + 1) * per]
        out.append((ds.x_train[li], ds.y_train[li], ds.x_train[ui], ds.y_train[ui]))
    return out


def write_random_cifar10(
    root: Path, n_train: int = 50000, n_test: int = 10000, seed: int = 0
) -> Path:
    """CIFAR-10's own on-disk format (cifar-10-batches-py pickles) holding random images and labels:
    the paper's shapes for speed measurements where the real data cannot be had."""
    import pickle

    rng = np.random.default_rng(seed)
    base = Path(root) / "cifar-10-batches-py"
    base.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    sizes = [n_train // 5] * 5 + [n_test]
    for name, n in zip(names, sizes):
        batch = {
            b"batch_label": name.encode(),
            b"labels": rng.integers(0, 10, n).tolist(),
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"{i}.png".encode() for i in range(n)],
        }
        with open(base / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    return Path(root)


# -- the reference path --------------------------------------------------------------------------


class PILDataset(torch.utils.data.Dataset):
    def __init__(self, x: np.ndarray, y: np.ndarray, transform) -> None:
        from PIL import Image

        self.images = [Image.fromarray(img.squeeze(-1) if img.shape[-1] == 1 else img) for img in x]
        self.y, self.transform = torch.from_numpy(y).long(), transform

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.transform(self.images[i]), self.y[i]


def reference_transforms(cfg, meta):
    from torchvision import transforms as T

    h = meta["image_shape"][1]
    weak = [T.RandomHorizontalFlip()] if cfg["dataset"]["flip"] else []
    weak.append(T.RandomCrop(h, padding=round(0.125 * h), padding_mode="reflect"))
    tail = [T.ToTensor(), T.Normalize(meta["mean"], meta["std"])]
    return T.Compose(weak + tail), T.Compose(weak + [T.RandAugment(2, 10)] + tail)


def loader(x, y, transform, batch_size):
    return torch.utils.data.DataLoader(
        PILDataset(x, y, transform), batch_size=batch_size, shuffle=True, num_workers=0
    )


class Reference:
    """The authors' client, as their published code runs it: PIL augmentation per image on the
    CPU in a DataLoader (FixTransform yields a weak and a strong view of every image), fp32 NCHW; the
    pseudo-labelling pass in eval mode, batches of 250; per local epoch one full-batch step with
    three forward passes: labeled (weak), unlabeled weak (train mode, for the APP-U EMA), strong."""

    def __init__(self, cfg, meta, device) -> None:
        self.device = device
        self.weak, strong = reference_transforms(cfg, meta)
        self.fix = lambda img: (self.weak(img), strong(img))  # noqa: E731
        self.epochs = cfg["train"]["local_epochs"]

    def round(self, model, client) -> None:
        x_l, y_l, x_u, y_u = client
        dev = self.device
        model.to(dev).train()
        opt = torch.optim.SGD(
            model.parameters(), lr=0.03, momentum=0.9, nesterov=True, weight_decay=5e-4
        )
        with torch.no_grad():  # pseudo-labels once, batches of 250
            model.eval()
            labels = torch.cat(
                [
                    model(views[0].to(dev)).argmax(1).cpu()
                    for views, _ in loader(x_u, y_u, self.fix, 250)
                ]
            )
            model.train()
        lab = loader(x_l, y_l, self.weak, len(y_l))
        unl = loader(x_u, labels.numpy(), self.fix, len(y_u))  # every sample confident
        for _ in range(self.epochs):
            self.step(model, opt, next(iter(lab)), next(iter(unl)))

    def step(self, model, opt, lab, unl) -> None:
        (xl, yl), ((xw, xs), ys) = lab, unl
        xl, yl, xw, xs, ys = (t.to(self.device) for t in (xl, yl, xw, xs, ys))
        loss = F.cross_entropy(model(xl), yl)
        app_u = F.softmax(model(xw), 1).mean(0)  # APP-U EMA input (graph kept, as theirs)
        loss = loss + F.cross_entropy(model(xs), ys)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return app_u.detach()


# -- measurements ---------------------------------------------------------------------------------


def peak_memory(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB (CUDA, max allocated)"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (process RSS)"


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def flwr_rounds(args, rounds: int, gpus: str) -> dict:
    """A real simulation of the same protocol (the launcher, Ray backend): wall time per round
    against the clients' own training time. The paper preset runs the paper's federation (100
    clients, 10 a round, Dirichlet 0.3); the small one `--clients` clients, all every round."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep_run) if args.keep_run else Path(tmp) / "run"
        overrides = "train.tau=1e-6 checkpoint.every=0" + (
            " train.compile=true" if args.compile else ""
        )
        if args.preset != "paper":
            overrides += f" fl.num_clients={args.clients} fl.fraction_train=1.0"
        rc = (
            f"experiment='{EXPERIMENT}' dataset='{args.dataset}' model='{args.model}' "
            f"num-server-rounds={rounds} output-dir='{out}' overrides='{overrides}'"
            + (f" data-path='{args.data_path}'" if args.data_path else "")
        )
        env = dict(os.environ, FLWR_HOME=str(Path(tmp) / "flwr-home"))
        t0 = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-m", "feddb.launch", "--gpus-per-client", gpus, "--run-config", rc]
            + (["--mps"] if args.mps else []),
            cwd=PROJECT,
            env=env,
            capture_output=True,
            text=True,
        )
        total = time.perf_counter() - t0
        if res.returncode != 0:
            return {"error": res.stderr[-2000:]}
        recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    later = recs[1:] or recs  # round 1 also starts the Ray workers
    wall = float(np.mean([r["round_seconds"] for r in later]))
    train = float(np.mean([sum(c["train_seconds"] for c in r["clients"]) for r in later]))
    slowest = float(np.mean([max(c["train_seconds"] for c in r["clients"]) for r in later]))
    workers = min(args.clients, os.cpu_count() or 1)  # one CPU per client (launcher default)
    critical = max(slowest, train / workers)  # the round's training if clients ran in parallel
    return {
        "rounds": rounds,
        "launcher_seconds": total,
        "round_wall_seconds": wall,
        "client_train_seconds_sum": train,
        "slowest_client_seconds": slowest,
        "parallel_clients": workers,
        "training_critical_seconds": critical,
        "overhead_seconds": wall - critical,
        "first_round_seconds": recs[0]["round_seconds"],
    }


def table(results: dict) -> str:
    """The figures as one markdown table (printed, and rendered into docs/speed.md by `feddb
    tables` from the --json file)."""
    a, s, r = (
        results[k] for k in ("augment_images_per_s", "train_step_images_per_s", "round_seconds")
    )
    preset, mem = results["preset"], results["peak_memory"]
    return "\n".join(
        [
            "| measure | project | reference | ratio |",
            "|---|---|---|---|",
            f"| augmentation (weak + strong), images/s | {a['project']:,.0f} | "
            f"{a['reference']:,.0f} | {a['project'] / a['reference']:.1f}× |",
            f"| local training step, images/s | {s['project']:,.0f} | {s['reference']:,.0f} | "
            f"{s['project'] / s['reference']:.1f}× |",
            f"| seconds per round ({preset['clients']} clients × {preset['epochs']} epochs, one "
            f"after another) | {r['project']:.2f} | {r['reference']:.2f} | "
            f"**{r['reference'] / r['project']:.1f}×** |",
            f"| peak memory | {mem['project']} | {mem['reference']} | |",
        ]
    )


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to train"
    )
    ap.add_argument(
        "--preset",
        choices=[*PRESETS, "exact"],
        help="default: paper on CUDA, small on CPU; exact: the authors' exact regime's round "
        "alone, N at once, and its floor (benchmarks/exact.py)",
    )
    ap.add_argument("--dataset", help="dataset name (default: the preset's)")
    ap.add_argument(
        "--data-path",
        default="",
        help="dataset directory; missing CIFAR-10 -> random images of its shape",
    )
    ap.add_argument("--model", help="model name, conf/model/ (default: the preset's)")
    for key, what in (
        ("clients", "clients (default: the preset's)"),
        ("labeled", "labeled images a client (default: the preset's)"),
        ("unlabeled", "unlabeled images a client (default: the preset's)"),
        ("epochs", "local epochs a round (default: the preset's)"),
    ):
        ap.add_argument(f"--{key}", type=int, help=what)
    ap.add_argument("--compile", action="store_true", help="torch.compile the project's model")
    ap.add_argument(
        "--flwr-rounds",
        type=int,
        default=2,
        help="rounds of a real `flwr run` to time (0: skip; needs flwr)",
    )
    ap.add_argument(
        "--gpus-per-client",
        default="auto",
        help="GPU share per simulated client on CUDA (feddb run's option)",
    )
    ap.add_argument(
        "--mps",
        action="store_true",
        help="run the flwr simulation under NVIDIA MPS (feddb run's --mps)",
    )
    ap.add_argument("--rounds", type=int, default=6, help="exact: rounds a run")
    ap.add_argument("--repeats", type=int, default=2, help="exact: runs alone a path")
    ap.add_argument("--jobs", type=int, default=2, help="exact: runs at once (0: none)")
    ap.add_argument("--method", default="fixmatch", help="exact: the method")
    ap.add_argument("--overrides", default="", help="exact: more Hydra overrides for the runs")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument(
        "--keep-run",
        metavar="DIR",
        help="keep the `flwr run`'s output directory here (for `feddb floor --paper-round --run`)",
    )
    ap.add_argument(
        "--write-random-cifar10",
        metavar="DIR",
        help="only write CIFAR-10's files filled with random images into DIR (for a "
        "timed `feddb run` of a paper preset without the real data), then exit",
    )
    return ap.parse_args()


def dataset_or_random(cfg: dict, args: argparse.Namespace):
    """The preset's dataset, or random images of CIFAR-10's shape where it is not here; and
    what the figures were measured on."""
    try:
        ds = load_dataset(cfg["dataset"])
        return ds, ds.name
    except Exception as err:  # noqa: BLE001 - no data here: random images of the dataset's shape
        from fssl.data import Dataset

        shape = (32, 32, 3)
        rng = np.random.default_rng(0)
        n = args.clients * (args.labeled + args.unlabeled)
        ds = Dataset(
            name=cfg["dataset"]["name"],
            x_train=rng.integers(0, 256, (n, *shape), np.uint8),
            y_train=rng.integers(0, 10, n),
            x_test=np.zeros((1, *shape), np.uint8),
            y_test=np.zeros(1, np.int64),
            num_classes=10,
            mean=(0.4914, 0.4822, 0.4465),
            std=(0.2471, 0.2435, 0.2616),
        )
        return ds, f"random images of CIFAR-10's shape ({type(err).__name__}: no data found)"


def augment_speed(cfg: dict, meta: dict, clients: list, device: torch.device) -> dict:
    """Augmentation alone: weak + strong views of one client's unlabeled images, per second."""
    x_u = to_nchw(clients[0][2], device)
    gen = torch.Generator(device=device).manual_seed(0)
    flip = cfg["dataset"]["flip"]
    t_proj = timed(
        lambda: (augment.weak(x_u, flip, gen), augment.strong(x_u, flip, gen)), device, 3
    )
    weak_t, strong_t = reference_transforms(cfg, meta)
    ref_ds_w, ref_ds_s = (PILDataset(clients[0][2], clients[0][3], t) for t in (weak_t, strong_t))
    t_ref = timed(
        lambda: (
            [ref_ds_w[i] for i in range(len(ref_ds_w))],
            [ref_ds_s[i] for i in range(len(ref_ds_s))],
        ),
        device,
        1,
    )
    n_views = 2 * len(x_u)
    return {"project": n_views / t_proj, "reference": n_views / t_ref}


def training_speed(cfg: dict, meta: dict, clients: list, device: torch.device) -> dict:
    """One local training step (labeled weak + all unlabeled strong, full batch), then one
    round (every client pseudo-labels its data once and trains E full-batch epochs): the
    project's against the reference implementation's."""
    torch.manual_seed(0)
    model = make_model(cfg, meta["num_classes"], meta["channels"]).to(device)
    trainer = make_trainer(cfg, meta["mean"], meta["std"], device)
    data = [
        ClientData(
            to_nchw(a, device),
            torch.from_numpy(b).to(device),
            to_nchw(c, device),
            torch.from_numpy(d).to(device),
        )
        for a, b, c, d in clients
    ]
    d0 = data[0]
    opt = trainer.prepare(model, 0.03, seed=0)
    trainer.lambda_u = cfg["train"]["lambda_u"]  # as fit() sets it after the warm-up
    prior = torch.full((meta["num_classes"],), 1.0 / meta["num_classes"], device=device)
    trainer.begin_round(model, d0, trainer.weak_probs(model, d0), prior)
    lab = torch.arange(len(d0.y_l), device=device)
    step_imgs = len(d0.y_l) + len(d0.y_u)
    t_step = timed(lambda: trainer.step(model, opt, d0, lab, None, prior), device, 3)
    ref = Reference(cfg, meta, device)
    ref_model = make_model(cfg, meta["num_classes"], meta["channels"]).to(device)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.03, momentum=0.9)
    x_l, y_l, x_un, y_un = clients[0]
    weak_t, _ = reference_transforms(cfg, meta)
    lab_loader = loader(x_l, y_l, weak_t, len(y_l))
    unl_loader = loader(x_un, y_un.astype(np.int64), ref.fix, len(y_un))
    t_ref_step = timed(
        lambda: ref.step(ref_model, ref_opt, next(iter(lab_loader)), next(iter(unl_loader))),
        device,
        2,
    )
    reset_peak(device)

    def project_round():
        for c, d in enumerate(data):
            trainer.fit(model, d, Instruction(0.03, seed=c))

    t_round = timed(project_round, device, 1, warmup=device.type == "cuda")
    mem_project = peak_memory(device)
    reset_peak(device)
    t_ref_round = timed(
        lambda: [ref.round(ref_model, c) for c in clients], device, 1, warmup=device.type == "cuda"
    )
    return {
        "train_step_images_per_s": {
            "project": step_imgs / t_step,
            "reference": step_imgs / t_ref_step,
        },
        "round_seconds": {"project": t_round, "reference": t_ref_round},
        "peak_memory": {"project": mem_project, "reference": peak_memory(device)},
        "speedup_round": t_ref_round / t_round,
    }


def print_flwr(sim: dict | None) -> None:
    if sim and "error" not in sim:
        print(
            f"\nflwr run simulation ({sim['rounds']} rounds, Ray backend): "
            f"{sim['round_wall_seconds']:.2f} s per round after the first (first "
            f"{sim['first_round_seconds']:.2f} s); the clients' own training, measured inside "
            f"the simulation, sums to {sim['client_train_seconds_sum']:.2f} s a round, the "
            f"slowest client {sim['slowest_client_seconds']:.2f} s, so training takes at least "
            f"{sim['training_critical_seconds']:.2f} s and Flower, Ray and the server add about "
            f"{sim['overhead_seconds']:.2f} s per round; the whole launcher took "
            f"{sim['launcher_seconds']:.0f} s including start-up"
        )
    elif sim:
        print(f"\nflwr run simulation skipped: {sim['error']}")


def main() -> int:
    args = arguments()
    if args.write_random_cifar10:
        print(f"random CIFAR-10 written to {write_random_cifar10(Path(args.write_random_cifar10))}")
        return 0
    device = torch.device(
        "cuda"
        if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        else "cpu"
    )
    if args.preset == "exact":
        from benchmarks import exact

        args.device = device.type
        return exact.main(args)
    preset = PRESETS[args.preset or ("paper" if device.type == "cuda" else "small")]
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    cfg = compose(
        [
            f"experiment={EXPERIMENT}",
            f"dataset={args.dataset}",
            f"model={args.model}",
            "train.tau=1e-6",
            f"train.local_epochs={args.epochs}",
            f"train.compile={str(args.compile).lower()}",
            f"device={device.type}",
        ]
        + ([f"dataset.path='{args.data_path}'"] if args.data_path else [])
    )
    ds, source = dataset_or_random(cfg, args)
    cfg["data_meta"] = meta = data_meta(ds)
    clients = client_images(args, ds)
    print(
        f"device {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else os.cpu_count()} "
        f"{'GPU' if device.type == 'cuda' else 'CPU cores'}), torch {torch.__version__}, data: {source}"
    )
    print(
        f"round: {args.clients} clients x {args.epochs} epochs, full batch, {args.labeled} labeled + "
        f"{args.unlabeled} unlabeled images per client, model {args.model}"
    )
    results: dict = {"device": str(device), "preset": vars(args), "data": source}
    results["augment_images_per_s"] = augment_speed(cfg, meta, clients, device)
    results |= training_speed(cfg, meta, clients, device)
    if args.flwr_rounds > 0:
        try:
            import flwr  # noqa: F401

            results["flwr_simulation"] = flwr_rounds(
                args, args.flwr_rounds, args.gpus_per_client if device.type == "cuda" else "0"
            )
        except ImportError:
            results["flwr_simulation"] = {"error": "flwr is not installed here"}

    print("\n" + table(results))
    print_flwr(results.get("flwr_simulation"))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
