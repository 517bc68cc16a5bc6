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
