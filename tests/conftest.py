import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_sessionstart(session):
    # cachemon's build revision is read from git once per process and cached: read it here, so
    # that no test is charged with that one `git rev-parse` by the guard below
    import cachemon
    assert cachemon.__revision__


def pytest_collection_modifyitems(config, items):
    """Tests that need Prometheus, Alertmanager or a container image build are slow by nature:
    `make test-fast` (-m "not slow") leaves them out with the tests marked slow in their files."""
    for item in items:
        if any(item.get_closest_marker(m) for m in ("prometheus", "alertmanager", "image")):
            item.add_marker("slow")


@pytest.fixture(autouse=True)
def _a_test_that_spawns_a_process_is_marked_slow(request, monkeypatch):
    """The rule `make test-fast` relies on, enforced: a test not marked slow that starts a process
    (subprocess, a cachemon child, openssl, git ...) errors, naming the program."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    spawned: list[str] = []
    real_init = subprocess.Popen.__init__

    def init(self, args, *a, **k):
        spawned.append(str(args if isinstance(args, (str, bytes)) else next(iter(args), "?")))
        real_init(self, args, *a, **k)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    yield
    if spawned:
        pytest.fail(f"this test starts a process ({', '.join(sorted(set(spawned)))}): mark it @pytest.mark.slow",
                    pytrace=False)
