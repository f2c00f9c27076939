"""The container image for real: built from the Containerfile with buildah, run as UID 65534.

The base is a Debian bookworm image made by mmdebstrap from Debian's own packages
(`scripts/image debian-base`, kept between runs), so no registry is needed. The container
runs with `buildah run` (chroot isolation, host network) against a ReplayServer on
127.0.0.1 serving real vLLM 0.32.0 captures, and its /metrics is scraped from the host.
Needs the Debian packages `buildah` and `mmdebstrap` (`make test` installs them as root);
skipped without them locally, a failure under CI.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
import requests
import yaml

from cachemon.demo.replay import ReplayServer, bundled_pages
from helpers import free_port, require_binary, samples, value, wait_until

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[1]
BUILDAH = ["buildah", "--storage-driver", "vfs"]
DEBIAN_BASE = "localhost/cachemon-base:bookworm"
IMAGE = "localhost/cachemon:test"
LOCAL = {"upstream": "demo", "model_name": "tiny", "engine": "0", "cache": "local"}
# Paths a process in the image may write: tmpfs / volumes in compose and Kubernetes. buildah itself
# writes /run (.containerenv) and the resolver files when it starts a container.
WRITABLE = ("tmp", "var/lib/cachemon", "run", "dev", "proc", "sys", "etc/hosts", "etc/resolv.conf", "etc/hostname")


def buildah(*args: str, timeout: float = 120) -> str:
    r = subprocess.run([*BUILDAH, *args], capture_output=True, text=True, check=False, timeout=timeout)
    assert r.returncode == 0, f"buildah {' '.join(args)}: {r.stderr}"
    return r.stdout.strip()


@pytest.fixture(scope="module")
def image() -> str:
    require_binary("buildah", "buildah")
    require_binary("mmdebstrap", "mmdebstrap")
    if os.geteuid() != 0:
        pytest.skip("buildah with the vfs driver and chroot isolation needs root here")
    # The wheels are built by this Python; the Debian base has 3.11, so they must match.
    if sys.version_info[:2] != (3, 11):
        pytest.skip(f"wheels from Python {sys.version_info[0]}.{sys.version_info[1]} do not fit the bookworm base (3.11)")
    env = dict(os.environ, BASE=DEBIAN_BASE, DEBIAN_BASE=DEBIAN_BASE, IMAGE=IMAGE, PYTHON=sys.executable)
    for step in ("debian-base", "build"):
        r = subprocess.run([str(ROOT / "scripts" / "image"), step], env=env, capture_output=True, text=True, check=False,
                           timeout=900)
        assert r.returncode == 0, f"scripts/image {step}: {r.stdout}{r.stderr}"
    return IMAGE


@pytest.fixture
def container(image: str):
    ctr = buildah("from", "--quiet", image)
    yield ctr
    buildah("rm", ctr)


def test_image_config_is_non_root_with_cachemon_entrypoint_and_oci_labels(image):
    config = json.loads(buildah("inspect", "--type", "image", image))["OCIv1"]["config"]
    assert config["User"] == "65534:65534"
    assert config["Entrypoint"] == ["cachemon"] and config["Cmd"] == ["run"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.base.name"] == DEBIAN_BASE
    assert labels["org.opencontainers.image.version"] == metadata.version("cachemon")
    assert labels["org.opencontainers.image.revision"] not in ("", "unknown")
    assert {"title", "source", "url", "documentation"} <= {k.rsplit(".", 1)[-1] for k in labels}


def test_image_runs_as_65534_and_holds_the_sidecar_only(container):
    # No --user: the image's own USER applies.
    out = buildah("run", "--isolation", "chroot", container, "--", "python3", "-c",
                  "import os, importlib.util as u; print(os.getuid(), os.getgid(), "
                  "u.find_spec('bcrypt') is not None, u.find_spec('tokenizers') is not None, "
                  "u.find_spec('pip') is not None, u.find_spec('zmq') is not None, u.find_spec('msgspec') is not None)")
    assert out == "65534 65534 True False False True True"      # the kv-events extra is in by default


def test_image_runs_the_compiled_isolation_index(container):
    """scripts/image builds cachemon-native's wheel for the host's architecture and the image installs it
    (where this venv has it, make setup could build it: the same compiler builds the image's)."""
    try:
        import cachemon_native  # noqa: F401
    except ImportError:
        if os.environ.get("CACHEMON_REQUIRE_NATIVE"):
            pytest.fail("cachemon-native is not installed in this venv")
        pytest.skip("cachemon-native is not installed here (no C compiler at make setup)")
    out = buildah("run", "--isolation", "chroot", container, "--", "python3", "-c",
                  "from cachemon.state.ledger.index import implementation; print(implementation())")
    assert out == "compiled"


@pytest.mark.slow
def test_the_arm64_image_runs_the_compiled_isolation_index():
    """The release's second platform, built here under qemu-user-static: `scripts/image` with ARCH=arm64
    compiles cachemon-native in an arm64 container of the base (Debian's gcc) and NATIVE=required fails the
    build unless the image's index is the compiled one. Slow: the arm64 base and the build run emulated
    (measured 2026-12-06: 10.3 min for the base and 7.0 min for the first build, which keeps its compiler
    container as an image; 2.8 min for a build after that)."""
    require_binary("buildah", "buildah")
    require_binary("mmdebstrap", "mmdebstrap")
    if os.geteuid() != 0:
        pytest.skip("buildah with the vfs driver and chroot isolation needs root here")
    if os.uname().machine != "x86_64":
        pytest.skip("checks the foreign platform of an x86-64 host")
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").is_file():
        msg = "no qemu-aarch64 in binfmt_misc (apt-get install -y qemu-user-static binfmt-support)"
        if os.environ.get("CACHEMON_REQUIRE_ARM64"):
            pytest.fail(msg)
        pytest.skip(msg)
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the cachemon wheel's dependencies are downloaded for this Python: bookworm's is 3.11")
    base, image = "localhost/cachemon-base:bookworm-arm64", "localhost/cachemon:test-arm64"
    env = dict(os.environ, ARCH="arm64", BASE=base, DEBIAN_BASE=base, IMAGE=image, NATIVE="required",
               PYTHON=sys.executable)
    for step in ("debian-base", "build"):
        r = subprocess.run([str(ROOT / "scripts" / "image"), step], env=env, capture_output=True, text=True,
                           check=False, timeout=3600)
        assert r.returncode == 0, f"scripts/image {step}: {r.stdout}{r.stderr}"
    assert f"built {image} on {base} for arm64 (isolation index: compiled)" in r.stdout, r.stdout + r.stderr
    ctr = buildah("from", "--quiet", image)
    try:
        out = buildah("run", "--isolation", "chroot", ctr, "--", "python3", "-c",
                      "import platform; from cachemon.state.ledger.index import implementation; "
                      "print(platform.machine(), implementation())", timeout=300)
    finally:
        buildah("rm", ctr)
    assert out == "aarch64 compiled"


def test_image_serves_real_counters_and_writes_only_to_its_volume_and_tmp(container, tmp_path):
    replay = ReplayServer(bundled_pages()).start()
    replay.show(1)                                          # static system prompt: 13296 / 11520
    port = free_port()
    rootfs = Path(buildah("mount", container))
    started = time.time() - 1                               # mtime granularity
    # An (empty) vLLM log file too, so the log tailer persists its state where the image says.
    state = tmp_path / "state"                              # the /var/lib/cachemon volume, as compose mounts it
    state.mkdir()
    os.chown(state, 65534, 65534)
    cmd = [*BUILDAH, "run", "--isolation", "chroot", "--user", "65534:65534", "-v", f"{state}:/var/lib/cachemon",
           container, "--",
           "sh", "-c", (f": > /tmp/vllm.log && exec cachemon run --upstream demo={replay.url} "
                        f"--listen 127.0.0.1:{port} --poll-interval 200ms --log-file /tmp/vllm.log")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> dict:
        try:
            return samples(requests.get(url, timeout=2).text)
        except requests.RequestException:
            return {}

    try:
        assert wait_until(lambda: value(scrape(), "cachemon_prefix_cache_query_tokens_total", **LOCAL) == 13296, 60,
                          0.2), "no counters from the container within 60 s"
        replay.show(2)                                      # timestamp at the head: queries grow, hits don't
        assert wait_until(lambda: value(scrape(), "cachemon_prefix_cache_query_tokens_total", **LOCAL) == 26880, 20,
                          0.2)
        m = scrape()
        assert value(m, "cachemon_prefix_cache_hit_tokens_total", **LOCAL) == 11520
        assert value(m, "cachemon_upstream_up", upstream="demo") == 1
        # The compose file's healthcheck, run in the image (python3, no curl there), on our port.
        check = yaml.safe_load((ROOT / "deploy/compose/compose.yaml").read_text())["services"]["cachemon"]["healthcheck"]
        assert check["test"][0] == "CMD"
        buildah("run", "--isolation", "chroot", container, "--",
                *[a.replace(":9867/", f":{port}/") for a in check["test"][1:]])
        (rootfs / "tmp" / "vllm.log").write_text("INFO 11-30 22:00:00 [loggers.py:123] a line\n")
        assert wait_until(lambda: list(state.glob("logs-*.json")), 20), \
            "the log tailer's state file never appeared in /var/lib/cachemon"
    finally:
        proc.terminate()
        try:
            out = proc.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        replay.stop()
        buildah("umount", container)
    assert "Traceback" not in out, out
    written = subprocess.run(["find", str(rootfs), "-xdev", "-newermt", f"@{started}"],
                             capture_output=True, text=True, check=True).stdout.split()
    outside = [p for p in (os.path.relpath(w, rootfs) for w in written)
               if p != "." and not any(p == w or p.startswith(w + "/") for w in WRITABLE)]
    assert outside == [], f"the container wrote to its root filesystem: {outside}"


def test_a_registry_failure_is_explained_with_the_way_around_it():
    """`make image` with an unreachable registry: buildah's error, then what to do (make image-debian)."""
    require_binary("buildah", "buildah")
    make = require_binary("make", "make")
    plan = subprocess.run([make, "-n", "image", "VENV=/nonexistent", "ARCH=arm64"], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=60).stdout
    assert "ARCH=arm64" in plan and "scripts/image build" in plan
    # .invalid never resolves (RFC 2606): the same failure as a machine without DNS or registry access.
    env = dict(os.environ, BASE="registry.invalid/cachemon-test/python:3.11-slim", IMAGE="localhost/cachemon:never",
               PYTHON=sys.executable)
    r = subprocess.run([str(ROOT / "scripts" / "image"), "build"], env=env, capture_output=True, text=True, check=False,
                       timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "registry.invalid" in r.stderr                       # buildah's own error first
    assert "could not pull the base image registry.invalid/cachemon-test/python:3.11-slim" in r.stderr
    assert "make image-debian" in r.stderr and "Traceback" not in r.stderr
