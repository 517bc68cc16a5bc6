"""Real deployments on loopback: a SuperLink and SuperNodes as separate processes, TLS and
SuperNode authentication on (tens of seconds each: Flower starts a ClientApp process per message)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import flower_pids
from localgrid import metrics_without_timing, run_in_process

from feddb.deploy import LocalDeployment, make_keys

PROJECT = Path(__file__).resolve().parents[1]
TINY = (
    "fl.num_clients=3 fl.fraction_train=1.0 dataset.num_labeled=150 train.local_epochs=2 "
    "train.tau=0.6 fl.node_wait=90 dataset.val_size=200 model.width=8"
)  # the validation split: the loss check's data

SMALL: dict[str, str] = {}  # the run-config keys of the small dataset (1,000 training digits)


@pytest.fixture(autouse=True)
def _nothing_left(no_process_left_behind):
    """A deployment's SuperExecs and app processes end with it (each test also checks its
    SuperLink and SuperNodes by name)."""


@pytest.fixture(autouse=True)
def small_data(small_npz):
    """Every deployment here trains on the suite's small `.npz`: what these tests check is the
    deployment, and the full 8,000 digits made each round several times longer."""
    SMALL.update({"dataset": "npz", "data-path": str(small_npz)})


def deploy(tmp_path, run_config, *extra, nodes=3, timeout=420):
    run_config = f"dataset='npz' data-path='{SMALL['data-path']}' {run_config}"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "feddb.deploy",
            "local",
            "--nodes",
            str(nodes),
            "--workdir",
            str(tmp_path / "w"),
            "--run-config",
            run_config,
            *extra,
        ],
        cwd=PROJECT,
        text=True,
        capture_output=True,
        timeout=timeout,
        env=dict(os.environ),
    )


@pytest.mark.slow
def test_a_tls_deployment_holds_a_malicious_node_refuses_an_unregistered_one_and_agrees_with_simulation(
    tmp_path, task_identity, monkeypatch, capsys
):
    """SemiFL in its own setting (the labels at the server), deployed with TLS and SuperNode
    authentication on three registered SuperNodes, node 0 sending w + 1000 (w_0 - w): the
    SuperNodes' files hold unlabeled images only, the server fine-tunes on its labels and
    recomputes BatchNorm statistics on them; every defence runs on the SuperNodes and the norm
    bound holds the attacker; a fourth node, whose key was never registered, is refused and the
    run goes on without it; the same configuration simulated (the attacker and the defences in
    scope there too) gives the same metrics."""
    import numpy as np

    from client_app.attacks import ENV
    from feddb.deploy import export_data

    out, work = tmp_path / "run", tmp_path / "w"
    # SemiFL's clients pseudo-label with the model they receive, in round 1 the random initial
    # one: a threshold just above its uniform confidence (0.1), so that every client trains
    tiny = TINY.replace("train.tau=0.6", "train.tau=0.105")
    overrides = f"{tiny} model.norm=bn train.warmup_rounds=0"
    rc = {
        **SMALL,
        "method": "semifl",
        "scenario": "labels_at_server",
        "num-server-rounds": 1,
        "seed": 2,
        "output-dir": str(out),
        "overrides": overrides,
    }
    files = export_data(rc, work / "data")
    dep = LocalDeployment(work)
    try:
        dep.start_superlink()
        *keys, unregistered = make_keys(dep.workdir / "keys", 4)
        for key in keys:
            dep.register(key)
        for i in range(3):
            attack = {"extra_config": "attack='scaled_update'", "env_extra": {ENV: "1"}}
            dep.start_supernode(i, 3, files[i], keys[i], **(attack if i == 0 else {}))
        refused = dep.start_supernode(3, 4, None, unregistered)
        status = dep.follow(dep.submit(rc))
        assert status["status"] == "finished:completed", status
        assert refused.wait(timeout=90) != 0
        assert "Failed to activate SuperNode" in (dep.logs / "supernode_3.log").read_text()
        assert (
            "Attempted to register SuperNode with public key"
            in (dep.logs / "superlink.log").read_text()
        )
    finally:
        dep.close()
    printed = capsys.readouterr().out
    assert "--enable-supernode-auth" not in printed  # sanity: the nodes' logs are in files
    assert "runs the methods as published" not in printed
    assert (work / "certs" / "ca.crt").is_file()
    assert sorted(p.name for p in (work / "logs").iterdir())[:1] == ["superlink.log"]
    assert not (work / "superlink-state.db").exists()  # in memory unless asked
    assert len(files) == 3
    for f in files:
        with np.load(f) as z:
            assert len(z["y_labeled"]) == 0 and len(z["x_labeled"]) == 0 and len(z["x_unlabeled"])
    assert sum(json.loads((out / "partition_summary.json").read_text())["server"]) == 150
    deployed = metrics_without_timing(out)
    (r,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "server_train" in r["timing"] and r["test_accuracy"] > 0.1 and r["test_loss"] < 10
    assert len(r["clients"]) == 3 and r["num_failures"] == 0
    assert all(c["num_labeled"] == 0 for c in r["clients"])
    # on SuperNodes every defence runs by default (server.robust.scope=deployment): the norm
    # bound, the agreement filter, the loss check and the DMA cap; replies sorted by partition
    robust = r["robust"]
    assert None not in robust["loss_impact"] and len(robust["cosines"]) == 3
    assert robust["clip"] == 4.0 and "norm_bound" in robust and robust["clipped"] == [0]
    assert robust["update_norms"][0] > 100 * max(robust["update_norms"][1:])
    saved = (out / "config.yaml").read_text()
    assert "cap: 2.0" in saved and "scope: deployment" in saved
    sim = tmp_path / "sim"
    monkeypatch.setenv(ENV, "1")
    run_in_process(
        {**rc, "output-dir": str(sim), "overrides": f"{overrides} server.robust.scope=always"},
        3,
        node_config={0: {"attack": "scaled_update"}},
    )
    assert metrics_without_timing(sim) == deployed
    assert not flower_pids(work)


@pytest.mark.slow
def test_supernodes_that_leave_and_come_back_do_not_end_the_run(tmp_path):
    """Churn, the short form of `feddb deploy local --churn` (the soak, 6 nodes and 20+ rounds,
    is the command), on two SuperNodes: once round 1 is recorded one is killed, and started
    again 2 s later with its data file. The run completes its 3 rounds; the killed node's
    partition is reported
    as a failure (or left out) while it is down, and trains again once back; memory was sampled;
    nothing is left running. Without authentication the node returns under a new node id, which
    the ServerApp binds at the next round's start (an authenticated node keeps its id, but Flower
    refuses it for about a minute: too long for the suite)."""
    out = tmp_path / "run"
    # 90 s a round: round 1 includes each SuperNode's cold start, its resident worker's too
    # (30 s timed out every time on a 2-core AMD EPYC, 2026-11-26, the machine otherwise idle)
    res = deploy(
        tmp_path,
        f"num-server-rounds=3 seed=2 output-dir='{out}' "
        f"overrides='{TINY} fl.num_clients=2 fl.round_timeout=90'",
        "--insecure",
        *("--churn", "3", "--churn-after-round", "1", "--churn-kills", "1"),
        *("--churn-every", "0,0", "--churn-down", "2,2"),
        nodes=2,
    )
    # a round in which the killed node's reply was missing kept the global model: exit 4
    skipped = json.loads((out / "summary.json").read_text())["skipped_rounds"]
    assert res.returncode == (4 if skipped else 0), res.stdout[-3000:] + res.stderr[-3000:]
    assert "finished:completed" in res.stdout and "churn: 1 SuperNode kills" in res.stdout
    assert (f"{len(skipped)} of 3 rounds skipped" in res.stdout) == bool(skipped)
    events = [json.loads(x) for x in (tmp_path / "w" / "churn.jsonl").open()]
    assert [e["event"] for e in events if e["event"] != "memory"] == ["kill", "restart", "end"]
    assert events[0]["event"] == "memory" and events[0]["rss_mb"]["superlink"] > 0
    assert events[-1]["peak_rss_mb"]["superlink"] > 0
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in recs] == [1, 2, 3] and not recs[0]["failures"]
    node = next(e["node"] for e in events if e["event"] == "kill")
    trained = [node in [c["partition_id"] for c in r["clients"]] for r in recs]
    lost = [f for r in recs for f in r["failures"] if f["partition_id"] == node]
    assert lost or not all(trained), recs
    assert all(f["partition_id"] == node for r in recs for f in r["failures"]), recs
    assert trained[-1], f"partition {node} did not train again after it came back: {trained}"
    assert not flower_pids(tmp_path / "w")


def start_ray(ray: str, env: dict, *args: str) -> subprocess.Popen:
    """`ray start ... --block` in a session of its own: stopped as one process group, never by
    name (`ray stop` would stop every Ray on the machine)."""
    return subprocess.Popen(
        [ray, "start", "--block", "--num-cpus", "1", "--disable-usage-stats", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.mark.slow
def test_simulation_on_an_existing_ray_cluster(tmp_path):
    """A Ray head and a worker node (both local), then two `feddb run`s attached to that cluster:
    one whose clients all fail (a method whose fit raises) exits 3 with the first cause
    (`flwr run --stream` itself exits 0 when a run fails) and leaves no SuperLink; the next
    completes."""
    from feddb.resources import free_port, group_alive, stop_group

    ray = str(Path(sys.executable).with_name("ray"))
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", FLWR_HOME=str(tmp_path / "flwr-home"))
    port = free_port()
    address = f"127.0.0.1:{port}"
    temp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit
    head = start_ray(
        ray, env, "--head", "--port", str(port), "--include-dashboard=false", "--temp-dir", temp
    )
    worker = None
    try:
        count = (
            "import ray, time; ray.init(address='" + address + "', logging_level='ERROR')\n"
            "while len([n for n in ray.nodes() if n['Alive']]) < 2: time.sleep(0.5)\n"
            "print(2)"
        )
        worker = start_ray(ray, env, "--address", address)
        nodes = subprocess.run(
            [sys.executable, "-c", count], env=env, capture_output=True, text=True, timeout=120
        )
        assert nodes.stdout.strip().endswith("2"), nodes.stderr[-2000:]

        def launch(output_dir: Path, extra: str = "") -> subprocess.CompletedProcess:
            rc = (
                f"{extra}dataset='npz' data-path='{SMALL['data-path']}' num-server-rounds=1 "
                f"output-dir='{output_dir}' overrides='fl.num_clients=4 fl.fraction_train=1.0 "
                "dataset.num_labeled=200 dataset.val_size=200 train.local_epochs=1 fl.node_wait=5'"
            )
            return subprocess.run(
                [sys.executable, "-m", "feddb.launch", "--ray-address", address]
                + ["--run-config", rc],
                cwd=PROJECT,
                env=env,
                text=True,
                capture_output=True,
                timeout=400,
            )

        broken = tmp_path / "broken.py"
        broken.write_text(
            "from fssl.methods.fixmatch import FixMatch\n\n\nclass Broken(FixMatch):\n"
            "    def fit(self, *args, **kwargs):\n        raise RuntimeError('boom in fit')\n"
        )
        failed = launch(tmp_path / "failed", f"method='{broken}:Broken' ")
        assert failed.returncode == 3, failed.stdout[-3000:] + failed.stderr[-3000:]
        # the first cause, in one line; the ServerApp's traceback not shown
        assert "error: run failed: round 1 trained no client" in failed.stderr
        assert "boom in fit" in failed.stderr and "Traceback" not in failed.stdout
        assert not flower_pids(tmp_path / "flwr-home")
        out = tmp_path / "run"
        res = launch(out)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert len(json.loads((out / "metrics.jsonl").read_text())["clients"]) == 4
        # the cluster's actor table: Flower's client actors ran there, on both nodes; only the
        # completed run's (the newest job's), not those the failed run had started
        probe = (
            "import json, ray; ray.init(address='" + address + "', logging_level='ERROR');"
            "a = [x for x in ray._private.state.actors().values() "
            "if x['ActorClassName'] == 'ClientAppActor'];"
            "job = lambda x: int.from_bytes(bytes.fromhex(x['JobID']), 'little');"
            "last = max(map(job, a));"
            "print(json.dumps(sorted({x['Address']['NodeID'] for x in a if job(x) == last})))"
        )
        actors = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
        )
        assert len(json.loads(actors.stdout.strip().splitlines()[-1])) == 2, actors.stderr[-2000:]
    finally:
        for proc in (worker, head):
            if proc is not None:
                stop_group(proc, 15.0, 5.0)
        shutil.rmtree(temp, ignore_errors=True)
    assert not group_alive(head.pid) and not (worker and group_alive(worker.pid))


@pytest.mark.slow
def test_a_superlink_restart_mid_run_ends_with_every_round_recorded_once(tmp_path):
    """The SuperLink killed once round 1 is recorded and started again on its state database
    (TLS and authentication on): the run goes on, or, where its ServerApp did not outlive the
    SuperLink, is resumed from its checkpoint on the same SuperNodes (`flwr run ...
    --run-config "resume='<run dir>'"`); either way each of the 2 rounds is recorded once."""
    out = tmp_path / "run"
    res = deploy(
        tmp_path,
        f"num-server-rounds=2 seed=2 output-dir='{out}' "
        f"overrides='{TINY} fl.num_clients=2 checkpoint.every=1'",
        "--restart-superlink-after-round",
        "1",
        nodes=2,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "restarted the SuperLink after round 1" in res.stdout
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in recs] == [1, 2]
    assert (tmp_path / "w" / "superlink-state.db").is_file()
    assert not flower_pids(tmp_path / "w")


def test_a_run_left_without_rounds_after_a_superlink_restart_is_stopped_for_the_resume_path(
    tmp_path, monkeypatch
):
    """Under load a restarted SuperLink kept a run `running` whose ServerApp had died with the
    old one, and the drill waited for it forever. Once the bound passes with no new round in
    metrics.jsonl, `follow` stops the run (`flwr stop`) and returns a status that is not
    `finished:completed`, which sends `run_local` down its resume path. No Flower process here:
    the SuperLink's answers are the ones seen in that hang."""
    from feddb import deploy as deploy_mod

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"round": 1}\n')
    calls = []
    monkeypatch.setattr(deploy_mod, "STALE_AFTER_RESTART", 1.0)
    monkeypatch.setattr(deploy_mod, "flwr_bin", lambda name: shutil.which("true"))

    def flwr(args, env):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(deploy_mod, "_flwr", flwr)
    dep = LocalDeployment(tmp_path / "w", insecure=True)
    dep.restart_superlink = lambda: calls.append(["restart"])
    t0 = time.monotonic()  # without the bound, the run "finishes" after 6 s and the test fails
    dep.run_status = lambda run_id: {
        "status": "running" if time.monotonic() - t0 < 6 else "finished:completed"
    }
    status = dep.follow(7, restart_after_round=(1, metrics))
    assert status["status"].startswith("stale")
    assert calls == [["restart"], ["stop", "7", "deploy"]]
