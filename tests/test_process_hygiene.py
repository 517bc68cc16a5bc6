"""The suite's own check that a test leaves no process behind can fail."""

import subprocess
import sys

from conftest import children_left, set_child_subreaper


def test_a_grandchild_orphaned_by_its_parent_is_found_and_stopped():
    set_child_subreaper(True)
    try:
        # the child starts a sleeper in a session of its own and exits at once: an orphan
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import subprocess; subprocess.Popen(['sleep', '60'], start_new_session=True)",
            ],
            check=True,
        )
    finally:
        set_child_subreaper(False)
    assert children_left(grace=0.5) == ["sleep 60"]
    assert children_left(grace=0.0) == []


def test_a_deployment_stops_what_a_node_that_exited_early_left_behind(
    tmp_path, no_process_left_behind
):
    """A SuperNode refused by the SuperLink exits at once; the SuperExec it had started lives on
    unless `close` stops it (a CI run found one, 2026-11-27): here a 'node' that starts a
    sleeper and exits, before the deployment is closed."""
    from feddb.deploy import LocalDeployment

    dep = LocalDeployment(tmp_path, insecure=True)
    node = dep._start(
        "node", [sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '60'])"]
    )
    assert node.wait(timeout=30) == 0
    dep.close()
