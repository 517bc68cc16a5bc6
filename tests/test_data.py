"""Readers on small files written in the datasets' real on-disk formats."""

import pickle

import numpy as np
import pytest
import scipy.io

from fssl.data import DataError, load_dataset

RNG = np.random.default_rng(0)


def _cfg(name, path="", **kw):
    return {"name": name, "path": str(path), "download": False, "mean": None, "std": None, **kw}


def write_cifar10(root, n=20):
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": [i % 10 for i in range(n)],
            b"data": RNG.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [b"x.png"] * n,
        }
        with open(base / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)  # as the original Python 2 files


def write_cifar100(root, n=200):
    base = root / "cifar-100-python"
    base.mkdir(parents=True)
    for name in ("train", "test"):
        obj = {
            b"fine_labels": [i % 100 for i in range(n)],
            b"coarse_labels": [0] * n,
            b"data": RNG.integers(0, 256, (n, 3072), dtype=np.uint8),
        }
        with open(base / name, "wb") as f:
            pickle.dump(obj, f, protocol=2)


def write_svhn(root, n=30):
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        y = np.array([(i % 10) or 10 for i in range(n)], dtype=np.uint8)[:, None]
        scipy.io.savemat(
            root / f"{split}_32x32.mat",
            {"X": RNG.integers(0, 256, (32, 32, 3, n), dtype=np.uint8), "y": y},
        )


def test_cifar10_reader(tmp_path):
    write_cifar10(tmp_path)
    ds = load_dataset(_cfg("cifar10", tmp_path, mean=[0.5] * 3, std=[0.2] * 3))
    assert ds.x_train.shape == (100, 32, 32, 3) and ds.x_test.shape == (20, 32, 32, 3)
    assert ds.num_classes == 10 and ds.y_train[:3].tolist() == [0, 1, 2]
    # channel layout: first 1024 bytes are the red plane of image 0
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        raw = pickle.load(f, encoding="bytes")[b"data"][0]
    assert np.array_equal(ds.x_train[0, :, :, 0].reshape(-1), raw[:1024])


def test_cifar100_reader(tmp_path):
    write_cifar100(tmp_path)
    ds = load_dataset(_cfg("cifar100", tmp_path))
    assert ds.num_classes == 100 and ds.x_train.shape == (200, 32, 32, 3)
    assert len(ds.mean) == 3  # computed when not given


def test_svhn_reader_maps_10_to_0(tmp_path):
    write_svhn(tmp_path)
    ds = load_dataset(_cfg("svhn", tmp_path))
    assert ds.x_train.shape == (30, 32, 32, 3) and ds.y_train[:3].tolist() == [0, 1, 2]
    assert ds.y_train.max() == 9


def test_cifar_pickle_with_code_is_refused(tmp_path):
    write_cifar10(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"data": Evil(), b"labels": []}, f)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load builtins.print"):
        load_dataset(_cfg("cifar10", tmp_path))


def test_missing_directory_says_where_and_how(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset(_cfg("cifar10", tmp_path / "nowhere"))
    msg = str(err.value)
    assert str(tmp_path / "nowhere") in msg and "cifar-10-batches-py" in msg
    assert "download=True" in msg and "data-path" in msg


def test_download_uses_torchvision_then_reads(tmp_path, monkeypatch):
    import torchvision

    calls = []

    class FakeCIFAR10:
        def __init__(self, root, train=True, download=False):
            calls.append((root, download))
            write_cifar10(tmp_path / "dl")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    ds = load_dataset(_cfg("cifar10", tmp_path / "dl", download=True))
    assert calls == [(str(tmp_path / "dl"), True)] and len(ds.y_train) == 100


def test_embedded_mnist10k():
    ds = load_dataset(_cfg("mnist10k", mean=[0.1307], std=[0.3081]))
    assert ds.x_train.shape == (8000, 28, 28, 1) and ds.x_test.shape == (2000, 28, 28, 1)
    assert ds.num_classes == 10 and ds.x_train.dtype == np.uint8


def _npz(path, **arrays):
    base = {
        "x_train": RNG.integers(0, 256, (40, 8, 8), dtype=np.uint8),
        "y_train": np.arange(40) % 4,
        "x_test": RNG.integers(0, 256, (8, 8, 8), dtype=np.uint8),
        "y_test": np.arange(8) % 4,
    }
    base.update(arrays)
    np.savez(path, **{k: v for k, v in base.items() if v is not None})
    return _cfg("npz", path)


def test_npz_reader(tmp_path):
    ds = load_dataset(_npz(tmp_path / "d.npz"))
    assert ds.x_train.shape == (40, 8, 8, 1) and ds.num_classes == 4


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"y_test": None}, "missing arrays \\['y_test'\\]"),
        ({"x_train": np.zeros((40, 8, 8), np.float32)}, "must be uint8"),
        ({"y_test": np.arange(8) % 4 + 5}, "labels outside 0..3"),
        ({"x_train": np.zeros((40, 8, 8, 2), np.uint8)}, "C = 1 or 3"),
        ({"y_train": np.arange(39) % 4}, "must be 40 integer labels"),
    ],
)
def test_malformed_npz_is_rejected_clearly(tmp_path, bad, match):
    with pytest.raises(DataError, match=match):
        load_dataset(_npz(tmp_path / "d.npz", **bad))


def test_npz_needs_an_existing_path(tmp_path):
    with pytest.raises(DataError, match="data-path"):
        load_dataset(_cfg("npz"))
    with pytest.raises(DataError, match="not found"):
        load_dataset(_cfg("npz", tmp_path / "missing.npz"))


def _digits(n, size=8, seed=0):
    """n small uint8 images whose brightness encodes the class (0..2), and the classes."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    x = (y[:, None, None] * 100 + rng.integers(0, 20, (n, size, size))).astype(np.uint8)
    return x, y


def test_imagefolder_reader(tmp_path):
    from PIL import Image

    names = ["cat", "dog", "emu"]  # sorted: class ids 0, 1, 2
    for split, n in (("train", 12), ("test", 6)):
        x, y = _digits(n, seed=n)
        for i, (img, lab) in enumerate(zip(x, y)):
            d = tmp_path / split / names[lab]
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(d / f"{i:03d}.png")
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    ds = load_dataset({"name": "imagefolder", "path": str(tmp_path)})
    assert ds.x_train.shape == (12, 8, 8, 1) and ds.num_classes == 3
    assert sorted(np.bincount(ds.y_train).tolist()) == [4, 4, 4]
    # the image with the highest brightness is an "emu" (class 2)
    assert ds.y_train[ds.x_train.reshape(12, -1).mean(1).argmax()] == 2
    rgb = load_dataset({"name": "imagefolder", "path": str(tmp_path), "channels": 3})
    assert rgb.x_test.shape == (6, 8, 8, 3)
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(tmp_path / "test" / "dog" / "odd.png")
    with pytest.raises(DataError, match="images differ in size"):
        load_dataset({"name": "imagefolder", "path": str(tmp_path)})


def test_imagefolder_layout_errors_say_what_is_expected(tmp_path):
    with pytest.raises(DataError, match="ImageFolder layout"):
        load_dataset({"name": "imagefolder", "path": str(tmp_path)})
    with pytest.raises(DataError, match="needs a directory"):
        load_dataset({"name": "imagefolder", "path": ""})


def test_hugging_face_dataset_saved_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    def split(n, seed):
        x, y = _digits(n, seed=seed)
        return datasets.Dataset.from_dict(
            {"img": [Image.fromarray(i) for i in x], "label": y.tolist()},
            features=datasets.Features(
                {"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=3)}
            ),
        )

    datasets.DatasetDict({"train": split(12, 1), "test": split(6, 2)}).save_to_disk(tmp_path / "hf")
    ds = load_dataset({"name": "hf", "path": str(tmp_path / "hf")})
    assert ds.x_train.shape == (12, 8, 8, 1) and ds.num_classes == 3
    assert ds.y_test.tolist() == [0, 1, 2, 0, 1, 2]
    datasets.DatasetDict({"train": split(6, 3)}).save_to_disk(tmp_path / "one")
    with pytest.raises(DataError, match="'train' and 'test' splits"):
        load_dataset({"name": "hf", "path": str(tmp_path / "one")})
    with pytest.raises(DataError, match="image_key"):
        load_dataset({"name": "hf", "path": str(tmp_path / "hf"), "image_key": "pixels"})


def test_an_image_folder_runs_through_the_server_app(tmp_path, task_identity):
    """The project's partitioner and a whole (one-round) run on an ImageFolder dataset."""
    import json

    from localgrid import run_in_process
    from PIL import Image

    for split, n in (("train", 60), ("test", 15)):
        x, y = _digits(n, size=12, seed=n)
        for i, (img, lab) in enumerate(zip(x, y)):
            d = tmp_path / "imgs" / split / f"c{lab}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(d / f"{i}.png")
    out = tmp_path / "run"
    run_in_process(
        {
            "method": "fixmatch",
            "dataset": "imagefolder",
            "data-path": str(tmp_path / "imgs"),
            "num-server-rounds": 1,
            "output-dir": str(out),
            "overrides": "fl.num_clients=3 fl.fraction_train=1.0 dataset.num_labeled=30 "
            "fl.node_wait=0 train.local_epochs=1",
        },
        3,
    )
    rounds = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rounds) == 1 and len(rounds[0]["clients"]) == 3
    part = json.loads((out / "partition.json").read_text())
    assert sum(len(i) for i in part["labeled"]) == 30
