"""Each baseline is its real algorithm: tests that fail if a method silently became FixMatch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, make_reply

from fssl.instruction import Instruction
from fssl.methods import fedmatch, make_model, make_trainer
from fssl.methods.dpl import debias
from fssl.methods.fedmatch import FedMatchServer
from fssl.methods.fedrgd import FedRGDServer
from fssl.models import build_model
from fssl.runtime import data_meta, dataset_for
from fssl.train import ClientData
from server_app.config import compose
from strategy import make_strategy
from strategy.base import gradient_diversity


def cfg_for(method, *extra):
    cfg = compose(TINY + [f"method={method}", *extra])
    cfg["data_meta"] = data_meta(dataset_for(cfg))
    return cfg


def toy_data(n_l=12, n_u=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = lambda n: torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)  # noqa: E731
    return ClientData(img(n_l), torch.arange(n_l) % 10, img(n_u), torch.arange(n_u) % 10)


def trainer_for(cfg, seed=0):
    meta = cfg["data_meta"]
    t = make_trainer(cfg, meta["mean"], meta["std"], torch.device("cpu"))
    t.gen, t.rng, t.received, t.helpers = (
        torch.Generator().manual_seed(seed),
        np.random.default_rng(seed),
        {},
        [],
    )
    return t


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def changed(before, after, keys):
    return {k: not torch.equal(before[k], after[k]) for k in keys}


# -- FedMatch: decomposition and disjoint learning ----------------------------------------------


def test_decomposition_keeps_the_initial_function_and_thresholds_psi_in_eval():
    cfg = cfg_for("fedmatch")
    torch.manual_seed(0)
    plain = build_model(cfg["model"], 10, 1)
    torch.manual_seed(0)
    model = make_model(cfg, 10, 1)
    state = model.state_dict()
    sigmas = [k for k in state if fedmatch.is_sigma(k)]
    psis = [k for k in state if fedmatch.is_psi(k)]
    n_layers = sum(isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) for m in plain.modules())
    assert len(sigmas) == len(psis) == n_layers
    for s in sigmas:
        assert torch.allclose(state[s.replace("original", "0.psi")], 0.2 * state[s])
    x = torch.randn(8, 1, 28, 28)
    assert torch.allclose(model(x), plain(x), atol=1e-5)  # theta = sigma + psi = w
    conv = model.features[0]
    with torch.no_grad():
        conv.parametrizations.weight[0].psi.fill_(1e-7)  # below l1_thres = 5e-6
    sigma = conv.parametrizations.weight.original
    model.eval()
    assert torch.equal(conv.weight, sigma)
    model.train()
    assert torch.allclose(conv.weight, sigma + 1e-7)


def test_sigma_does_not_move_on_the_unlabeled_step_nor_psi_on_the_labeled_step():
    cfg = cfg_for("fedmatch", "train.tau=0.05")  # every sample confident
    model, t, data = make_model(cfg, 10, 1), trainer_for(cfg), toy_data()
    opt = t.make_optimizer(model, 0.1)
    keys = list(model.state_dict())
    psi = [k for k in keys if fedmatch.is_psi(k)]
    sigma_side = [k for k in keys if k not in psi and "running" not in k]
    prior = torch.full((10,), 0.1)
    for _ in range(2):  # also with momentum buffers
        before = snapshot(model)
        t.supervised_step(model, opt, data, torch.arange(len(data.y_l)))
        after = snapshot(model)
        assert not any(changed(before, after, psi).values())
        assert all(changed(before, after, [k for k in sigma_side if fedmatch.is_sigma(k)]).values())
        t.unsupervised_step(model, opt, data, None, prior)
        final = snapshot(model)
        assert not any(changed(after, final, sigma_side).values())  # sigma, norm affine, biases
        assert all(changed(after, final, psi).values())


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_psi_step_is_the_gradient_of_the_l2_and_l1_terms(reduction):
    """Only lambda_l2 * sum (sigma - psi)^2 (then only lambda_l1 * sum |psi|): plain SGD moves
    psi by exactly -lr * 2 lambda_l2 (psi - sigma) (resp. -lr * lambda_l1 sign(psi)); with
    l2_reduction=mean the L2 part is divided by the number of psi values."""
    for l1, l2 in ((0.0, 0.5), (0.3, 0.0)):
        cfg = cfg_for(
            "fedmatch",
            "train.momentum=0",
            "train.grad_clip=0",
            "method.lambda_a=0",
            "method.lambda_i=0",
            f"method.lambda_l1={l1}",
            f"method.lambda_l2={l2}",
            f"method.l2_reduction={reduction}",
        )
        model, t = make_model(cfg, 10, 1), trainer_for(cfg)
        opt = t.make_optimizer(model, 0.1)
        pairs = [
            (s.detach().clone(), p.detach().clone()) for s, p in fedmatch.decomposed_pairs(model)
        ]
        n = sum(p.numel() for _, p in pairs) if reduction == "mean" else 1
        t.unsupervised_step(model, opt, toy_data(), None, torch.full((10,), 0.1))
        for (sigma, psi), (_, new) in zip(pairs, fedmatch.decomposed_pairs(model)):
            expected = psi - 0.1 * (2 * l2 * (psi - sigma) / n + l1 * torch.sign(psi))
            assert torch.allclose(new, expected, atol=1e-6)


def test_fedmatch_sees_weak_views_by_default_and_raw_images_when_asked():
    """Raw labeled images overfit 100 labels (docs/results.md): weak views are the default."""
    x = toy_data().x_l
    for view, changed in (("weak", True), (None, True), ("raw", False)):
        cfg = cfg_for("fedmatch", *([f"method.view={view}"] if view else []))
        trainer = make_trainer(cfg, (0.5,), (0.5,), torch.device("cpu"))
        trainer.gen = torch.Generator().manual_seed(0)
        assert (not torch.equal(trainer.view(x), x)) is changed, view


def test_agreement_labels_vote_gate_on_the_local_model_and_debias_every_voter():
    local = torch.tensor([[0.90, 0.05, 0.05], [0.40, 0.35, 0.25], [0.50, 0.45, 0.05]])
    h1 = torch.tensor([[0.1, 0.8, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    h2 = torch.tensor([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.2, 0.1, 0.7]])
    labels, mask = fedmatch.agreement_labels(local, [h1, h2], tau=0.75)
    assert labels.tolist() == [1, 0, 2]  # majority; 1-1-1 tie -> lowest class; majority
    assert mask.tolist() == [True, False, False]  # only the local model gates
    assert fedmatch.agreement_labels(local, [], 0.75)[0].tolist() == [0, 0, 0]
    prior = torch.tensor([0.7, 0.2, 0.1])
    labels, mask = fedmatch.agreement_labels(local, [h1, h2], 0.5, prior)
    dl, d1, d2 = (debias(p, prior) for p in (local, h1, h2))
    votes = sum(F.one_hot(p.argmax(1), 3) for p in (dl, d1, d2))
    assert labels.tolist() == votes.argmax(1).tolist()
    assert mask.tolist() == (dl.max(1).values >= 0.5).tolist()
    assert mask.tolist() != fedmatch.agreement_labels(local, [h1, h2], 0.5)[1].tolist()


def test_helpers_are_the_true_nearest_neighbours():
    rng = np.random.default_rng(0)
    emb = {pid: rng.normal(size=40) for pid in rng.choice(100, 30, replace=False).tolist()}
    for pid, v in emb.items():
        dist = sorted((np.linalg.norm(v - w), q) for q, w in emb.items() if q != pid)
        assert fedmatch.nearest_helpers(emb, pid, 2) == [q for _, q in dist[:2]]
    assert fedmatch.nearest_helpers(emb, 1000, 2) == []  # never uploaded: no helpers


def _metrics(pid, k=10):
    return {"partition_id": pid, "num_labeled": 5, "num_unlabeled": 50, "app_u": [1 / k] * k}


def _perturbed(arrays, seed):
    rng = np.random.default_rng(seed)
    return {
        k: (v + 0.05 * rng.standard_normal(v.shape).astype(v.dtype))
        if np.issubdtype(v.dtype, np.floating)
        else v
        for k, v in arrays.items()
    }


def test_fedmatch_server_embeds_uploads_and_sends_the_nearest_clients_psi(task_identity):
    cfg = cfg_for("fedmatch", "fl.num_clients=6", "fl.fraction_train=0.5")
    s = make_strategy(cfg, 10)
    assert isinstance(s.method, FedMatchServer)
    s.intake.bind_nodes({p: 100 + p for p in range(6)})
    torch.manual_seed(0)
    glob = {k: v.numpy() for k, v in make_model(cfg, 10, 1).state_dict().items()}
    s.global_arrays = glob
    s.begin_round(1, [])
    uploads = {pid: _perturbed(glob, pid) for pid in range(6)}
    s.aggregate_train(1, [make_reply(uploads[p], _metrics(p), node=100 + p) for p in range(6)])
    model = make_model(cfg, 10, 1)
    meta = cfg["data_meta"]
    for pid, arrays in uploads.items():
        model.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
        assert np.allclose(
            s.method.embeddings[pid],
            fedmatch.embedding(model, s.method.probe, tuple(meta["mean"]), tuple(meta["std"])),
        )
        assert set(s.method.psi[pid]) == {k for k in glob if fedmatch.is_psi(k)}

    from flwr.app import ArrayRecord, ConfigRecord

    arrays = ArrayRecord({k: torch.from_numpy(v) for k, v in glob.items()})
    msgs = list(s.configure_train(10, arrays, ConfigRecord(), grid=None))  # 10 % 10 == 0
    assert msgs
    for m in msgs:
        pid = m.metadata.dst_node_id - 100
        expected = fedmatch.nearest_helpers(s.method.embeddings, pid, 2)
        assert len(expected) == 2 and s.round_record.method["helpers"][str(pid)] == expected
        for i, h in enumerate(expected):
            got = {k: v.numpy() for k, v in m.content[f"helper_{i}"].items()}
            assert set(got) == set(s.method.psi[h]) and all(
                np.array_equal(got[k], s.method.psi[h][k]) for k in got
            )
    later = list(s.configure_train(11, arrays, ConfigRecord(), grid=None))
    assert all(not any(k.startswith("helper_") for k in m.content.array_records) for m in later)
    # the caches are part of the checkpointed state
    t = make_strategy(cfg, 10)
    t.load_state(*s.state())
    assert set(t.method.embeddings) == set(s.method.embeddings) and set(t.method.psi) == set(
        s.method.psi
    )
    assert all(
        np.array_equal(t.method.embeddings[p], s.method.embeddings[p]) for p in s.method.embeddings
    )
    assert all(np.array_equal(t.method.psi[3][k], s.method.psi[3][k]) for k in s.method.psi[3])


# -- FedRGD ----------------------------------------------------------------------------------


def _arrays(w):
    return {"w": np.asarray(w, np.float32), "n.num_batches_tracked": np.array(1, np.int64)}


def test_fedrgd_aggregate_is_the_grouped_average_with_the_global_model_in_every_group():
    cfg = cfg_for("fedrgd", "server.momentum=0", "fl.num_clients=10")
    s = make_strategy(cfg, 10)
    assert isinstance(s.method, FedRGDServer) and cfg["model"]["norm"] == "gn"
    glob = _arrays([1.0, -2.0])
    clients = {p: _arrays([float(p), float(p * p)]) for p in (1, 3, 4, 6, 8)}
    s.global_arrays = glob
    s.begin_round(7, [])
    new, _ = s.aggregate_train(7, [make_reply(a, _metrics(p), node=p) for p, a in clients.items()])
    groups = s.round_record.method["groups"]
    assert sorted(len(g) for g in groups) == [2, 3] and sorted(sum(groups, [])) == list(clients)
    expected = np.mean(
        [(glob["w"] + sum(clients[p]["w"] for p in g)) / (len(g) + 1) for g in groups], axis=0
    )  # Eq. 7 with w_s = global
    assert np.allclose(new["w"].numpy(), expected, atol=1e-6)
    global_weight = 0.5 * (1 / 3 + 1 / 4)  # (1/S) sum_i 1 / (|G_i| + 1)
    assert sum(c["weight"] for c in s.round_record.clients) == pytest.approx(1 - global_weight)
    assert s.method.groups(7, 5)[0].tolist() == s.method.groups(7, 5)[0].tolist()  # seeded
    assert any(
        s.method.groups(r, 5)[0].tolist() != s.method.groups(7, 5)[0].tolist() for r in range(8, 20)
    )


def test_gradient_diversity_on_hand_built_updates():
    g = _arrays([0.0, 0.0])
    assert gradient_diversity(g, [_arrays([1, 0]), _arrays([0, 1])]) == pytest.approx(1.0)
    assert gradient_diversity(g, [_arrays([1, 0]), _arrays([1, 0])]) == pytest.approx(0.5)
    assert gradient_diversity(g, [_arrays([1, 0]), _arrays([-1, 0])]) is None


# -- SemiFL ----------------------------------------------------------------------------------


def test_semifl_mixup_targets_mix_the_two_labels_with_the_sampled_lambda(monkeypatch):
    import fssl.methods.semifl

    monkeypatch.setattr(fssl.methods.semifl.augment, "weak", lambda x, flip, gen: x)
    monkeypatch.setattr(fssl.methods.semifl.augment, "strong", lambda x, flip, gen: x)
    cfg = cfg_for("semifl")
    t = trainer_for(cfg, seed=3)
    n_u = 20
    x_u = (10 * torch.arange(n_u, dtype=torch.uint8))[:, None, None, None].expand(n_u, 1, 4, 4)
    data = ClientData(x_u[:2].clone(), torch.tensor([0, 1]), x_u.clone(), torch.arange(n_u) % 10)
    t.pl_labels = torch.arange(n_u) % 7
    t.fix_idx = torch.tensor([2, 5, 11])
    (x_fix, x_mix), n_extra, loss_fn = t.unlabeled_batch(None, data, None, None)
    x = torch.cat([x_fix, x_mix])  # strong views, then mixed weak views: one loss over both
    lam = t.last_lambda
    assert lam == np.random.default_rng(3).beta(0.75, 0.75)
    assert n_extra == 6 and torch.allclose(x[:3], t.norm(x_u[[2, 5, 11]]))
    m, sd = cfg["data_meta"]["mean"][0] * 255, cfg["data_meta"]["std"][0] * 255
    mixed = x[3:, 0, 0, 0] * sd + m  # lam v_fix + (1 - lam) v_partner
    partner = (mixed - lam * 10 * torch.tensor([2.0, 5.0, 11.0])) / (1 - lam) / 10
    assert torch.allclose(partner, partner.round(), atol=1e-3)
    partner = partner.round().long()
    logits = torch.randn(6, 10)
    y_fix, y_partner = t.pl_labels[[2, 5, 11]], t.pl_labels[partner]
    expected = (
        F.cross_entropy(logits[:3], y_fix)
        + lam * F.cross_entropy(logits[3:], y_fix)
        + (1 - lam) * F.cross_entropy(logits[3:], y_partner)
    )
    assert torch.allclose(loss_fn(logits), expected)


def test_semifl_labels_once_from_the_received_model_and_dpl_changes_them_as_the_formula_says():
    probs = torch.tensor([[0.96, 0.02, 0.02], [0.50, 0.45, 0.05], [0.30, 0.30, 0.40]])
    prior = torch.tensor([0.8, 0.1, 0.1])
    data = ClientData(
        torch.zeros(1, 1, 4, 4, dtype=torch.uint8),
        torch.tensor([0]),
        torch.zeros(3, 1, 4, 4, dtype=torch.uint8),
        torch.tensor([0, 1, 2]),
    )
    for dpl in (False, True):
        cfg = cfg_for("semifl", f"dpl={str(dpl).lower()}", "train.tau=0.6")
        t = trainer_for(cfg)
        t.begin_round(None, data, probs, prior)
        p = debias(probs, prior) if dpl else probs
        assert t.pl_labels.tolist() == p.argmax(1).tolist()
        assert t.fix_idx.tolist() == (p.max(1).values >= 0.6).nonzero().flatten().tolist()
    assert t.pl_labels.tolist() == [0, 1, 2] and t.fix_idx.tolist() == [
        0,
        1,
    ]  # without: [0, 0, 2], [0]


def test_fedrgd_client_labels_all_unlabeled_data_online_each_step_fixmatch_once_per_round():
    data = toy_data()
    prior = torch.full((10,), 0.1)
    probs = torch.full((20, 10), 0.1)
    probs[:4] = F.one_hot(torch.arange(4), 10).float()  # 4 confident samples
    for method, expected in (("fedrgd", 2 * 20), ("fixmatch", 4)):
        cfg = cfg_for(method, "train.tau=0.9")
        t = trainer_for(cfg)
        t.begin_round(None, data, probs, prior)
        _, n_extra, _ = t.unlabeled_batch(None, data, None, prior)
        assert n_extra == expected


@pytest.mark.parametrize("experiment", ["quick", "miniature", "miniature_authors"])
def test_the_shipped_app_u_carries_local_training_in_the_cpu_presets(experiment):
    """Algorithm 2 as printed averages the models *entering* each epoch: with the CPU presets'
    one epoch the shipped APP-U is the received model's and DMA never sees local training. The
    default estimate takes each epoch's model after its update."""

    def fit(*extra):
        cfg = cfg_for("feddb", f"experiment={experiment}", "train.tau=0.5", *extra)
        torch.manual_seed(0)
        model = make_model(cfg, 10, 1)
        m = trainer_for(cfg).fit(
            model, toy_data(n_l=16, n_u=64), Instruction(0.1, seed=1, lambda_u=1.0)
        )
        return cfg, np.array(m["app_u"]), np.array(m["app_u_global"])

    cfg, shipped, received = fit()
    assert cfg["app_u"]["estimate"] == "local"
    assert np.abs(shipped - received).max() > 1e-3
    assert shipped.sum() == pytest.approx(1.0, abs=1e-5)
    cfg, literal, received = fit("app_u.estimate=literal")
    if cfg["train"]["local_epochs"] == 1:
        assert np.array_equal(literal, received)  # what the literal estimate ships
    else:
        assert np.abs(literal - received).max() > 0
