"""Datasets: CIFAR-10/100 and SVHN in torchvision's on-disk formats, a generic `.npz`, image folders
(torchvision's ImageFolder layout), Hugging Face datasets saved with `save_to_disk`, and the
embedded MNIST-10k. Every loader returns uint8 images as N x H x W x C and int64 labels.
"""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

DIST_NAME = "feddb-flower"
EMBEDDED = "fssl/assets/mnist10k.npz"


class DataError(ValueError):
    """The dataset is missing or malformed; the message says where and how to fix it."""


@dataclass
class Dataset:
    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    x_val: np.ndarray | None = None  # held out of x_train (dataset.val_size); never trained on
    y_val: np.ndarray | None = None

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        n, h, w, c = self.x_train.shape
        return c, h, w


def embedded_candidates() -> list[Path]:
    """Where the embedded MNIST-10k may live: beside this module, or in the installed project.

    Flower installs the app bundle (Python/TOML/YAML only) under $FLWR_HOME/apps, so the data is
    also looked up in the pip-installed distribution (editable installs point at the source tree).
    """
    here = Path(__file__).resolve().parents[1] / EMBEDDED
    found = [here]
    try:
        dist = metadata.distribution(DIST_NAME)
        found.append(Path(str(dist.locate_file(EMBEDDED))))
        direct = dist.read_text("direct_url.json")
        if direct:
            url = json.loads(direct).get("url", "")
            if url.startswith("file://"):
                found.append(Path(url[len("file://") :]) / EMBEDDED)
    except metadata.PackageNotFoundError:
        pass
    return found


def load_dataset(dcfg: dict[str, Any]) -> Dataset:
    name, path = dcfg["name"], dcfg.get("path") or ""
    if name == "mnist10k":
        candidates = [Path(path).expanduser()] if path else embedded_candidates()
        for cand in candidates:
            if cand.is_file():
                return _from_arrays("mnist10k", _read_npz(cand), dcfg)
        raise DataError(
            "embedded MNIST-10k not found; looked in: "
            + ", ".join(map(str, candidates))
            + ". Reinstall the project (`pip install -e .`) or pass data-path='/abs/mnist10k.npz'."
        )
    if name == "npz":
        if not path:
            raise DataError("dataset npz needs a file: set data-path='/abs/path/data.npz'")
        file = Path(path).expanduser()
        if file.is_dir():
            raise DataError(
                f"data-path {file.resolve()} is a directory, and dataset npz reads one .npz file: "
                "name the file, or use dataset='imagefolder' for a directory of images"
            )
        if not file.is_file():
            raise DataError(f"npz file not found: {file.resolve()} (run-config key data-path)")
        try:
            return _from_arrays("npz", _read_npz(file), dcfg)
        except DataError as err:
            raise DataError(f"{file}: {err}") from err
    if name in ("imagefolder", "hf"):
        if not path:
            raise DataError(f"dataset {name} needs a directory: set data-path='/abs/dir'")
        root = Path(path).expanduser()
        if not root.is_dir():
            raise DataError(
                f"{name} directory not found: {root.resolve()} (run-config key data-path)"
            )
        reader = _read_imagefolder if name == "imagefolder" else _read_hf
        return _from_arrays(name, reader(root, dcfg), dcfg)
    root = Path(path or "data").expanduser()
    readers = {"cifar10": _read_cifar10, "cifar100": _read_cifar100, "svhn": _read_svhn}
    if name not in readers:
        raise DataError(
            f"unknown dataset '{name}': choose one of mnist10k, cifar10, cifar100, "
            "svhn, npz, imagefolder, hf"
        )
    if dcfg.get("download") and not _has_files(name, root):
        _download(name, root)
    if not _has_files(name, root):
        raise DataError(
            f"{name} not found in {root.resolve()}: expected {', '.join(EXPECTED[name])}. "
            f"Download it with torchvision (e.g. torchvision.datasets.{TV_CLASS[name]}("
            f"'{root}', download=True)) or set dataset.download=true, or point data-path at "
            "the directory that holds it."
        )
    return _from_arrays(name, readers[name](root), dcfg)


EXPECTED = {
    "cifar10": ["cifar-10-batches-py/data_batch_1..5", "cifar-10-batches-py/test_batch"],
    "cifar100": ["cifar-100-python/train", "cifar-100-python/test"],
    "svhn": ["train_32x32.mat", "test_32x32.mat"],
}
TV_CLASS = {"cifar10": "CIFAR10", "cifar100": "CIFAR100", "svhn": "SVHN"}


def _has_files(name: str, root: Path) -> bool:
    files = {
        "cifar10": [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)]
        + ["cifar-10-batches-py/test_batch"],
        "cifar100": ["cifar-100-python/train", "cifar-100-python/test"],
        "svhn": ["train_32x32.mat", "test_32x32.mat"],
    }[name]
    return all((root / f).is_file() for f in files)


def _download(name: str, root: Path) -> None:
    import torchvision  # the downloaders write exactly the formats read below

    root.mkdir(parents=True, exist_ok=True)
    cls = getattr(torchvision.datasets, TV_CLASS[name])
    try:
        if name == "svhn":
            cls(str(root), split="train", download=True)
            cls(str(root), split="test", download=True)
        else:
            cls(str(root), train=True, download=True)
    except Exception as err:  # network errors come in many types
        raise DataError(f"download of {name} into {root.resolve()} failed: {err}") from err


class _ArrayUnpickler(pickle.Unpickler):
    """CIFAR batches are pickles; allow only the numpy pieces they need, never arbitrary code."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset file")


def _load_pickle(file: Path) -> dict:
    with open(file, "rb") as f:
        obj = _ArrayUnpickler(io.BytesIO(f.read()), encoding="latin1").load()
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _cifar_images(flat: Any) -> np.ndarray:
    return np.asarray(flat, dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


def _read_cifar10(root: Path) -> dict[str, np.ndarray]:
    base = root / "cifar-10-batches-py"
    batches = [_load_pickle(base / f"data_batch_{i}") for i in range(1, 6)]
    test = _load_pickle(base / "test_batch")
    return {
        "x_train": np.concatenate([_cifar_images(b["data"]) for b in batches]),
        "y_train": np.concatenate([np.asarray(b["labels"]) for b in batches]),
        "x_test": _cifar_images(test["data"]),
        "y_test": np.asarray(test["labels"]),
        "num_classes": 10,
    }


def _read_cifar100(root: Path) -> dict[str, np.ndarray]:
    base = root / "cifar-100-python"
    train, test = _load_pickle(base / "train"), _load_pickle(base / "test")
    return {
        "x_train": _cifar_images(train["data"]),
        "y_train": np.asarray(train["fine_labels"]),
        "x_test": _cifar_images(test["data"]),
        "y_test": np.asarray(test["fine_labels"]),
        "num_classes": 100,
    }


def _read_svhn(root: Path) -> dict[str, np.ndarray]:
    from scipy.io import loadmat

    out: dict[str, Any] = {"num_classes": 10}
    for split in ("train", "test"):
        mat = loadmat(str(root / f"{split}_32x32.mat"))
        out[f"x_{split}"] = np.ascontiguousarray(mat["X"].transpose(3, 0, 1, 2))
        y = mat["y"].astype(np.int64).reshape(-1)
        out[f"y_{split}"] = np.where(y == 10, 0, y)  # SVHN stores digit 0 as label 10
    return out


def _read_npz(file: Path) -> dict[str, np.ndarray]:
    """The four arrays (and `num_classes` when the file carries it) of an .npz written by
    numpy.savez; a file that is not one, or is truncated or corrupt, is named with what to do."""
    import zipfile
    import zlib

    if not zipfile.is_zipfile(file):
        raise DataError(
            f"{file}: not an .npz (numpy.savez writes a zip archive of .npy arrays; this file "
            "is not a zip archive, or is truncated): write it again with numpy.savez"
        )
    keys = ("x_train", "y_train", "x_test", "y_test")
    try:
        with np.load(file, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise DataError(
                    f"{file}: missing arrays {missing}; an .npz needs x_train, "
                    "y_train, x_test, y_test"
                )
            out = {k: z[k] for k in keys}
            if "num_classes" in z.files:
                out["num_classes"] = int(z["num_classes"])
            return out
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise DataError(
            f"{file}: corrupt or truncated .npz ({err}): copy it again or write it again "
            "with numpy.savez"
        ) from err
    except (OSError, ValueError, TypeError) as err:
        if isinstance(err, DataError):
            raise
        if "pickle" in str(err):
            raise DataError(
                f"{file}: holds object arrays, which would need pickles (refused: they can run "
                "code); save plain numeric arrays with numpy.savez"
            ) from err
        raise DataError(f"{file}: not a readable .npz ({err})") from err


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def _pil_arrays(images: list, where: str, channels: int | None) -> np.ndarray:
    """PIL images -> uint8 N x H x W x C; C = `channels`, or 1 when every image is grayscale."""
    if channels is None:
        channels = 1 if all(im.mode in ("1", "L", "I", "I;16") for im in images) else 3
    mode = "L" if channels == 1 else "RGB"
    arrays = [np.asarray(im.convert(mode), dtype=np.uint8) for im in images]
    shapes = sorted({a.shape for a in arrays})
    if len(shapes) > 1:
        raise DataError(
            f"{where}: images differ in size ({shapes[0]} ... {shapes[-1]}); resize "
            "them to one size first"
        )
    x = np.stack(arrays)
    return x[..., None] if x.ndim == 3 else x


def _read_imagefolder(root: Path, dcfg: dict[str, Any]) -> dict[str, np.ndarray]:
    """root/train/<class>/<image> and root/test/<class>/<image>; classes in sorted order, as
    torchvision's ImageFolder numbers them."""
    from PIL import Image

    layout = f"{root}/train/<class>/*.png and {root}/test/<class>/*.png (ImageFolder layout)"
    for split in ("train", "test"):
        if not (root / split).is_dir():
            raise DataError(f"imagefolder: {root / split} not found; expected {layout}")
    classes = sorted(d.name for d in (root / "train").iterdir() if d.is_dir())
    if not classes:
        raise DataError(f"imagefolder: no class directories in {root / 'train'}; expected {layout}")
    out: dict[str, Any] = {"num_classes": len(classes)}
    for split in ("train", "test"):
        extra = sorted(
            d.name for d in (root / split).iterdir() if d.is_dir() and d.name not in classes
        )
        if extra:
            raise DataError(f"imagefolder: {root / split} has classes {extra} that train lacks")
        images, labels = [], []
        for k, c in enumerate(classes):
            for f in sorted((root / split / c).iterdir()) if (root / split / c).is_dir() else []:
                if f.suffix.lower() in IMAGE_SUFFIXES:
                    try:
                        with Image.open(f) as im:
                            images.append(im.copy())
                    except OSError as err:
                        raise DataError(f"imagefolder: cannot read {f} ({err})") from err
                    labels.append(k)
        if not images:
            raise DataError(
                f"imagefolder: no images ({', '.join(IMAGE_SUFFIXES)}) under {root / split}"
            )
        out[f"x_{split}"] = _pil_arrays(images, str(root / split), dcfg.get("channels"))
        out[f"y_{split}"] = np.asarray(labels, dtype=np.int64)
    return out


def _read_hf(root: Path, dcfg: dict[str, Any]) -> dict[str, np.ndarray]:
    """A Hugging Face DatasetDict written by `save_to_disk`, with train and test splits, an image
    column and an integer label column (`dataset.image_key` / `label_key`, or found by name)."""
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            "dataset hf needs the `datasets` package: pip install -e '.[hf]' (or "
            "pip install datasets)"
        ) from err
    try:
        dd = datasets.load_from_disk(str(root))
    except (FileNotFoundError, ValueError) as err:
        raise DataError(f"hf: {root} is not a dataset saved with save_to_disk ({err})") from err
    if not isinstance(dd, datasets.DatasetDict) or not {"train", "test"} <= set(dd):
        found = list(dd) if isinstance(dd, datasets.DatasetDict) else "one split"
        raise DataError(
            f"hf: {root} must hold a DatasetDict with 'train' and 'test' splits, found {found}"
        )
    cols = dd["train"].column_names
    image_key = dcfg.get("image_key") or next((c for c in ("image", "img") if c in cols), None)
    label_key = dcfg.get("label_key") or next(
        (c for c in ("label", "labels", "fine_label") if c in cols), None
    )
    if image_key not in cols or label_key not in cols:
        raise DataError(
            f"hf: columns {cols}; set dataset.image_key and dataset.label_key to the "
            "image and label columns"
        )
    out: dict[str, Any] = {}
    for split in ("train", "test"):
        part = dd[split]
        images = part[image_key]
        if images and not hasattr(images[0], "convert"):  # arrays, not PIL images
            from PIL import Image

            images = [Image.fromarray(np.asarray(im, dtype=np.uint8)) for im in images]
        out[f"x_{split}"] = _pil_arrays(list(images), f"hf {split}", dcfg.get("channels"))
        out[f"y_{split}"] = np.asarray(part[label_key])
    feature = dd["train"].features.get(label_key)
    if getattr(feature, "num_classes", None):
        out["num_classes"] = int(feature.num_classes)
    return out


def _from_arrays(name: str, arrays: dict[str, Any], dcfg: dict[str, Any]) -> Dataset:
    xs, ys = {}, {}
    for split in ("train", "test"):
        x, y = np.asarray(arrays[f"x_{split}"]), np.asarray(arrays[f"y_{split}"])
        if x.size == 0 or y.size == 0:
            empty = f"x_{split}" if x.size == 0 else f"y_{split}"
            raise DataError(f"{name}: {empty} is empty; it needs at least one image and label")
        if x.dtype != np.uint8:
            raise DataError(f"{name}: x_{split} must be uint8 images, got {x.dtype}")
        if x.ndim == 3:
            x = x[..., None]
        if x.ndim != 4 or x.shape[-1] not in (1, 3):
            raise DataError(
                f"{name}: x_{split} must be N x H x W or N x H x W x C (C = 1 or 3), "
                f"got shape {x.shape}"
            )
        if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
            raise DataError(
                f"{name}: y_{split} must be {len(x)} integer labels, got {y.dtype} {y.shape}"
            )
        xs[split], ys[split] = x, y.astype(np.int64)
    if xs["train"].shape[1:] != xs["test"].shape[1:]:
        raise DataError(
            f"{name}: train images {xs['train'].shape[1:]} and test images "
            f"{xs['test'].shape[1:]} differ in shape"
        )
    declared = arrays.get("num_classes")
    k = int(declared or ys["train"].max() + 1)
    for split, y in ys.items():
        if y.min() < 0 or y.max() >= k:
            raise DataError(
                f"{name}: y_{split} has labels outside 0..{k - 1}"
                + (
                    ""
                    if declared
                    else f" (K = {k} read from y_train; an .npz may carry num_classes)"
                )
            )
    if len(np.unique(ys["train"])) != k:
        raise DataError(f"{name}: y_train must contain every class 0..{k - 1}")
    channels = xs["train"].shape[-1]
    mean, std = dcfg.get("mean"), dcfg.get("std")
    if mean is None or std is None:
        pixels = xs["train"].reshape(-1, channels).astype(np.float64) / 255.0
        mean, std = pixels.mean(0).tolist(), (pixels.std(0) + 1e-8).tolist()
    if len(mean) != channels or len(std) != channels:
        raise DataError(f"{name}: mean/std need {channels} values, got {mean} / {std}")
    ds = Dataset(
        name,
        xs["train"],
        ys["train"],
        xs["test"],
        ys["test"],
        k,
        tuple(float(m) for m in mean),
        tuple(float(s) for s in std),
    )
    return split_validation(ds, int(dcfg.get("val_size") or 0), int(dcfg.get("val_seed") or 0))


def split_validation(ds: Dataset, size: int, seed: int) -> Dataset:
    """Carve a class-stratified validation set of `size` images out of the training images (the
    same for every run seed and method: model selection never sees the test set, and the
    partition, labeled split included, is drawn from what remains)."""
    if size <= 0:
        return ds
    n, k = len(ds.y_train), ds.num_classes
    if size > n // 2:
        raise DataError(
            f"{ds.name}: dataset.val_size={size} leaves too few training images "
            f"({n} in all); use at most {n // 2}"
        )
    rng = np.random.default_rng([seed, 4099])
    counts = np.bincount(ds.y_train, minlength=k)
    share = np.floor(counts / n * size).astype(int)  # proportional, then the remainder
    share[np.argsort(-(counts / n * size - share), kind="stable")[: size - share.sum()]] += 1
    val = np.sort(
        np.concatenate(
            [rng.choice(np.flatnonzero(ds.y_train == c), share[c], replace=False) for c in range(k)]
        )
    )
    keep = np.setdiff1d(np.arange(n), val)
    return Dataset(
        ds.name,
        ds.x_train[keep],
        ds.y_train[keep],
        ds.x_test,
        ds.y_test,
        k,
        ds.mean,
        ds.std,
        ds.x_train[val],
        ds.y_train[val],
    )


CLIENT_ARRAYS = ("x_labeled", "y_labeled", "x_unlabeled")


def read_client_file(path: str | Path, meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """One deployed client's own data: `x_labeled`, `y_labeled`, `x_unlabeled` and optionally
    `y_unlabeled` (hidden labels, used only for pseudo-label metrics), checked against the server's
    dataset meta (classes, channels)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(
            f"client data file not found: {file.resolve()} (node config data-path); "
            "write one per client with `feddb deploy export`"
        )
    try:
        with np.load(file, allow_pickle=False) as z:
            missing = [k for k in CLIENT_ARRAYS if k not in z.files]
            if missing:
                raise DataError(
                    f"{file}: missing arrays {missing}; a client file needs "
                    f"{', '.join(CLIENT_ARRAYS)} (and optionally y_unlabeled)"
                )
            out = {k: z[k] for k in z.files if k in CLIENT_ARRAYS + ("y_unlabeled",)}
    except (OSError, ValueError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{file}: not a readable .npz without pickles ({err})") from err
    if "y_unlabeled" not in out:
        out["y_unlabeled"] = np.full(len(out["x_unlabeled"]), -1, dtype=np.int64)
    for part in ("labeled", "unlabeled"):
        x, y = out[f"x_{part}"], out[f"y_{part}"]
        if x.dtype != np.uint8:
            raise DataError(f"{file}: x_{part} must be uint8, got {x.dtype}")
        if x.ndim == 3:
            x = out[f"x_{part}"] = x[..., None]
        if x.ndim != 4 or x.shape[-1] != meta["channels"]:
            raise DataError(
                f"{file}: x_{part} must be N x H x W x {meta['channels']}, got {x.shape}"
            )
        if (
            y.shape != (len(x),)
            or not np.issubdtype(y.dtype, np.integer)
            or y.max(initial=-1) >= meta["num_classes"]
        ):
            raise DataError(f"{file}: y_{part} must be {len(x)} labels below {meta['num_classes']}")
        out[f"y_{part}"] = y.astype(np.int64)
    if (out["y_labeled"] < 0).any():
        raise DataError(f"{file}: y_labeled must be labels >= 0")
    if len(out["x_labeled"]) + len(out["x_unlabeled"]) == 0:  # no label: labels at the server
        raise DataError(f"{file}: holds no image, labeled or unlabeled")
    return out


def write_client_files(
    ds: Dataset, labeled: list[np.ndarray], unlabeled: list[np.ndarray], out_dir: Path
) -> list[Path]:
    """One file per client with only its own data, for deployment."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for pid, (li, ui) in enumerate(zip(labeled, unlabeled)):
        file = out_dir / f"client_{pid}.npz"
        np.savez(
            file,
            x_labeled=ds.x_train[li],
            y_labeled=ds.y_train[li],
            x_unlabeled=ds.x_train[ui],
            y_unlabeled=ds.y_train[ui],
        )
        files.append(file)
    return files
