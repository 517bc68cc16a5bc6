"""A method's running estimates (fssl/methods/estimates.py): each method's start and update rules,
and the trainer saving and restoring what a method names in `keeps`, with no code of its own."""

import pytest
import torch
from conftest import TINY

from fssl.methods import make_trainer
from fssl.methods.estimates import SLOT, Estimates
from fssl.methods.fixmatch import FixMatch
from fssl.runtime import data_meta, dataset_for
from server_app.config import compose

CPU = torch.device("cpu")


def test_start_gives_a_new_client_its_values_and_keeps_a_returning_clients():
    e = Estimates(("time_p", "p_model"), CPU)
    e.start(time_p=torch.tensor([0.5]), p_model=torch.full((2,), 0.5))
    e["p_model"] = torch.tensor([0.9, 0.1])
    e.start(time_p=torch.tensor([0.5]), p_model=torch.full((2,), 0.5))  # a returning client
    assert e["p_model"].tolist() == pytest.approx([0.9, 0.1])
    e.start(time_p=torch.tensor([0.5]), p_model=torch.full((3,), 1 / 3))  # another shape: all
    assert e["p_model"].shape == (3,) and e["time_p"].tolist() == [0.5]


def test_update_is_the_moving_average_and_an_absent_estimate_takes_the_first_value():
    e = Estimates(("p_hat",), CPU)
    first, second = torch.tensor([0.2, 0.8]), torch.tensor([0.6, 0.4])
    assert torch.equal(e.update("p_hat", first, 0.9), first)  # SoftMatch's p-hat, USB's hook
    assert torch.equal(e.update("p_hat", second, 0.9), 0.9 * first + (1 - 0.9) * second)


def test_a_name_the_method_does_not_keep_is_refused_before_it_is_lost():
    e = Estimates(("q_hat",), CPU)
    with pytest.raises(KeyError, match="'qhat' is not among the method's `keeps`"):
        e["qhat"] = torch.zeros(3)


def test_restore_moves_to_the_device_drops_unkept_names_and_saved_is_on_the_cpu():
    meta = torch.device("meta")  # stands for an accelerator: tensors change device, no data
    e = Estimates(("mu", "var"), meta)
    e.restore({"mu": torch.tensor(0.5), "old": torch.tensor(1.0)})
    assert set(e.values) == {"mu"} and e["mu"].device.type == "meta"
    e.device = CPU
    e.restore({"mu": torch.tensor(0.5), "var": torch.tensor(0.04)})
    assert {k: float(v) for k, v in e.saved().items()} == pytest.approx({"mu": 0.5, "var": 0.04})


class Seen(FixMatch):
    """A user's method that keeps a count per unlabeled image: it names it in `keeps` and writes
    no load_client_state or client_state."""

    keeps = ("seen",)


def test_the_trainer_keeps_what_a_method_names_with_the_sgd_momentum():
    cfg = compose(TINY + ["train.optimizer_state=client"])
    cfg["data_meta"] = meta = data_meta(dataset_for(cfg))
    t = Seen(cfg, meta["mean"], meta["std"], CPU)
    t.load_client_state({})
    t.momentum_out = {"w": torch.ones(2)}
    t.estimates.start(seen=torch.tensor([2.0, 0.0, 1.0]))
    kept = t.client_state()
    assert set(kept) == {"optimizer", SLOT} and kept[SLOT]["seen"].tolist() == [2, 0, 1]
    again = Seen(cfg, meta["mean"], meta["std"], CPU)
    again.load_client_state(kept)
    assert again.estimates["seen"].tolist() == [2, 0, 1]
    fresh = make_trainer(cfg, meta["mean"], meta["std"], CPU)  # a method that keeps nothing
    fresh.load_client_state(kept)
    assert not fresh.estimates.values
