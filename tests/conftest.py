import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config, items):
    """Tests that need Prometheus, Alertmanager or a container image build are slow by nature:
    `make test-fast` (-m "not slow") leaves them out with the tests marked slow in their files."""
    for item in items:
        if any(item.get_closest_marker(m) for m in ("prometheus", "alertmanager", "image")):
            item.add_marker("slow")
