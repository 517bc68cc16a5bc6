"""The launcher's log filter (feddb.launch.follow_log without --verbose): the project's lines and
errors are shown, Ray's two known-benign metrics-exporter lines are not."""

import io

import feddb.launch as launch

# As the run's log stream carries them (Ray 2.55.1, minimal install, a head started with
# --dashboard-agent-grpc-port): Ray's driver prefixes the component in colour.
GCS = (
    "\x1b[36m(pid=gcs_server)\x1b[0m [2026-11-25 19:46:19,794 E 12104 12104] (gcs_server) "
    "gcs_server.cc:961: Failed to establish connection to the event+metrics exporter agent. "
    "Events and metrics will not be exported. Exporter agent status: RpcError: Running out of "
    "retries to initialize the metrics agent. rpc_code: 14"
)
RAYLET = (
    "\x1b[33m(raylet)\x1b[0m [2026-11-25 19:46:29,211 E 12166 12166] (raylet) main.cc:1077: "
    "Failed to establish connection to the metrics exporter agent. Metrics will not be "
    "exported. Exporter agent status: RpcError: Running out of retries to initialize the "
    "metrics agent. rpc_code: 14"
)

REAL = [
    "[feddb] method=feddb dpl=True dma=True dataset=mnist10k rounds=2",
    "\x1b[91mERROR \x1b[0m:     Traceback (most recent call last):",
    "ConnectionError: Failed to connect to Ray cluster at 192.0.2.2:47391",
    "\x1b[36m(pid=12350)\x1b[0m Fatal Python error: Aborted",
    # the same component and message, but another status: not the known case, so shown
    "(raylet) [2026-11-25 19:46:29,211 E 1 1] (raylet) main.cc:1077: Failed to establish "
    "connection to the metrics exporter agent. Metrics will not be exported. Exporter agent "
    "status: RpcError: Deadline Exceeded",
    # the message quoted by an exception rather than logged by Ray's GCS or raylet
    "RuntimeError: Failed to establish connection to the metrics exporter agent. Metrics will not "
    "be exported. Exporter agent status: RpcError: Running out of retries to initialize the "
    "metrics agent.",
]


def test_benign_ray_metrics_lines_are_hidden_errors_are_not():
    assert not launch.shown(GCS)
    assert not launch.shown(RAYLET)
    for line in REAL:
        assert launch.shown(line), line
    assert not launch.shown("\x1b[92mINFO \x1b[0m:      Starting Flower ServerApp")


class FakeLog:
    """Stands in for the `flwr log --stream` process."""

    def __init__(self, lines):
        self.stdout = io.StringIO("".join(line + "\n" for line in lines))

    def wait(self):
        return 0


def test_follow_log_prints_errors_but_not_the_benign_ray_lines(monkeypatch, capsys):
    lines = [
        REAL[0],
        GCS,
        RAYLET,
        REAL[1],
        REAL[3],
        "[feddb] round   1/2  test acc 0.2860  val acc 0.2590  eta 4s",
    ]
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: FakeLog(lines))
    launch.follow_log(1, {}, verbose=False, procs=[])
    out = capsys.readouterr().out
    assert "exporter agent" not in out
    assert "Traceback (most recent call last):" in out
    assert "Fatal Python error: Aborted" in out
    assert "[feddb] round   1/2" in out and "[feddb] method=feddb" in out

    launch.follow_log(1, {}, verbose=True, procs=[])  # --verbose still shows Ray's lines
    out = capsys.readouterr().out
    assert GCS in out and RAYLET in out
