"""Issue 38 (round 6): a 4 MiB web config took 6.8 s per load, on the listener's loop thread (every
request waited). Now the web config is bounded at 256 KiB (a one-line error naming the bound, at
start and on a re-read) and YAML is read with libyaml's safe loader where PyYAML has it: the same
documents, about ten times faster. The oversized files are constructed (bcrypt users)."""
from __future__ import annotations

from pathlib import Path

import bcrypt
import pytest
import requests
import yaml

from cachemon.config import ConfigError
from cachemon.web.web_config import MAX_WEB_CONFIG_BYTES, load_web_config
from helpers import samples, value
from listener_support import serve, stop

ROOT = Path(__file__).resolve().parents[1]


def users_file(p: Path, n: int) -> Path:
    h = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    p.write_text("basic_auth_users:\n" + "".join(f"  user{i:06d}: '{h}'\n" for i in range(n)))
    return p


def test_a_web_config_over_the_bound_is_one_clear_error(tmp_path):
    p = users_file(tmp_path / "web.yml", 4000)          # ~300 KiB: 74d8045 loaded it, in about a second
    assert p.stat().st_size > MAX_WEB_CONFIG_BYTES
    with pytest.raises(ConfigError) as e:
        load_web_config(str(p))
    assert f"larger than {MAX_WEB_CONFIG_BYTES} bytes" in str(e.value) and "\n" not in str(e.value)


def test_a_web_config_at_the_bound_loads_every_user(tmp_path):
    p = users_file(tmp_path / "web.yml", 3000)
    assert p.stat().st_size <= MAX_WEB_CONFIG_BYTES
    assert len(load_web_config(str(p)).auth.users) == 3000


def test_an_oversized_rewrite_fails_closed_and_is_counted(tmp_path):
    p = users_file(tmp_path / "web.yml", 1)
    server = serve(load_web_config(str(p)))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        users_file(p, 4000)
        assert requests.get(url + "/metrics", auth=("user000000", "pw"), timeout=10).status_code == 500
        assert requests.get(url + "/-/healthy", timeout=5).status_code == 200
        users_file(p, 2)
        page = requests.get(url + "/metrics", auth=("user000001", "pw"), timeout=10)
        assert page.status_code == 200
        assert value(samples(page.text), "cachemon_web_config_reloads_total", outcome="failed") == 1
    finally:
        stop(server)


# Helm's templates are Go templates that render to YAML, not YAML (deploy/helm/*/templates).
YAML_FILES = sorted(f for d in ("examples", "deploy") for f in (ROOT / d).rglob("*.y*ml") if "templates" not in f.parts)


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_libyaml_reads_the_shipped_yaml_as_the_pure_loader_does(path):
    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: the pure loader is the only one")
    text = path.read_text(encoding="utf-8")
    assert list(yaml.load_all(text, Loader=yaml.CSafeLoader)) == list(yaml.load_all(text, Loader=yaml.SafeLoader))
