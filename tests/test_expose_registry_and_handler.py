"""The registry's suffix-aware duplicate check and the listener's routing as a pure function.

Every family and request here is constructed (no server, no socket): the rules under test are
Prometheus's exposition rules and cachemon's routing table."""
from __future__ import annotations

import threading

import pytest

from cachemon.expose.registry import DuplicateFamilyError, Registry, sample_names
from cachemon.expose.render import Family
from cachemon.web.handler import Request, Route, handle, parse_request
from cachemon.web.web_config import WebConfig


class _Fams:
    """Constructed collector: one family per (name, type)."""

    def __init__(self, *fams: tuple[str, str]) -> None:
        self.fams = fams

    def collect(self) -> list[Family]:
        out = []
        for name, type_ in self.fams:
            f = Family(name, type_, "constructed")
            if type_ == "histogram":
                f.add_histogram("", [(1.0, 1.0)], 1.0, 1.0)
            else:
                f.add("", 1.0)
            out.append(f)
        return out


@pytest.mark.parametrize(("first", "second"), [
    (("x", "counter"), ("x_total", "gauge")),          # counter x renders x_total
    (("x", "counter"), ("x_created", "gauge")),        # ... and x_created in OpenMetrics
    (("x_total", "gauge"), ("x", "counter")),          # either order
    (("y", "histogram"), ("y_bucket", "gauge")),
    (("y", "histogram"), ("y_count", "counter")),
    (("z", "info"), ("z_info", "gauge")),
    (("x", "gauge"), ("x", "counter")),                # the bare name, whatever the types
])
def test_a_family_whose_sample_names_clash_with_a_registered_one_is_refused(first, second):
    reg = Registry()
    reg.register(_Fams(first))
    with pytest.raises(DuplicateFamilyError, match="already registered by _Fams"):
        reg.register(_Fams(second))
    assert len(reg.collectors) == 1


def test_a_collector_whose_own_families_clash_is_refused_and_leaves_nothing_behind():
    reg = Registry()
    with pytest.raises(DuplicateFamilyError, match="more than once: x, x_total"):
        reg.register(_Fams(("x", "counter"), ("x_total", "gauge")))
    assert reg.collectors == []
    reg.register(_Fams(("x", "counter"), ("x_ratio", "gauge")))      # no clash: both served
    page = reg.render().decode()
    assert "x_total 1.0" in page and "x_ratio 1.0" in page


def test_names_that_only_share_a_prefix_do_not_clash():
    reg = Registry()
    reg.register(_Fams(("x", "counter")))
    reg.register(_Fams(("x_totals", "gauge"), ("x_bucket", "gauge"), ("xx", "counter")))
    assert sample_names("x", "counter") == ("x", "x_total", "x_created")
    assert len(reg.collectors) == 2


def test_concurrent_registrations_of_one_name_let_exactly_one_through():
    reg = Registry()
    errors: list[Exception] = []
    barrier = threading.Barrier(8)

    def register() -> None:
        barrier.wait()
        try:
            reg.register(_Fams(("same", "counter")))
        except DuplicateFamilyError as e:
            errors.append(e)

    threads = [threading.Thread(target=register) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reg.collectors) == 1 and len(errors) == 7


# --- handle(): the routing table, pure ------------------------------------------------------------

def _req(method: str = "GET", path: str = "/metrics", close: bool = False) -> Request:
    return parse_request(f"{method} {path} HTTP/1.1\r\nHost: x{chr(13) + chr(10) + 'Connection: close' if close else ''}"
                         .encode())


CONF = WebConfig(headers={"X-Constructed": "1"})


@pytest.mark.parametrize(("method", "path", "auth", "route", "status"), [
    ("GET", "/metrics", True, Route.METRICS, None),
    ("HEAD", "/metrics", True, Route.METRICS, None),
    ("GET", "/-/ready", False, Route.READY, None),          # probes need no credentials
    ("GET", "/-/healthy", False, Route.REPLY, b"200"),
    ("GET", "/", True, Route.REPLY, b"200"),
    ("GET", "/nope", True, Route.REPLY, b"404"),
    ("POST", "/metrics", True, Route.REPLY, b"405"),
    ("GET", "/metrics", False, Route.REPLY, b"401"),
    ("GET", "/nope", False, Route.REPLY, b"401"),           # 401 before 404: paths are not disclosed
    ("GET", "/metrics", object(), Route.VERIFY, None),      # outcome unknown: the bcrypt thread decides
])
def test_handle_routes_every_request_without_side_effects(method, path, auth, route, status):
    req = _req(method, path)
    first = handle(req, CONF, None, auth)
    assert first.route is route
    if status is None:
        assert first.reply == b""
    else:
        assert first.reply.startswith(b"HTTP/1.1 " + status)
        again = handle(req, CONF, None, auth)            # same input, same reply (bar the Date header)
        strip = [ln for ln in again.reply.split(b"\r\n") if not ln.startswith(b"Date:")]
        assert strip == [ln for ln in first.reply.split(b"\r\n") if not ln.startswith(b"Date:")]


def test_the_401_carries_the_challenge_and_the_configured_headers_and_head_has_no_body():
    get = handle(_req("GET", "/metrics"), CONF, None, False).reply
    head = handle(_req("HEAD", "/metrics"), CONF, None, False).reply
    assert b'WWW-Authenticate: Basic realm="cachemon"' in get and b"X-Constructed: 1" in get
    assert get.endswith(b"\r\n\r\nUnauthorized\n")
    assert head.endswith(b"\r\n\r\n") and b"Content-Length: 13" in head


def test_a_broken_web_config_refuses_what_needs_it_but_not_the_probes():
    assert handle(_req("GET", "/metrics"), CONF, "constructed error", True).reply.startswith(b"HTTP/1.1 500")
    assert handle(_req("GET", "/-/healthy"), CONF, "constructed error", True).reply.startswith(b"HTTP/1.1 200")
    assert handle(_req("GET", "/-/ready"), CONF, "constructed error", True).route is Route.READY


def test_connection_close_is_echoed():
    assert b"Connection: close" in handle(_req("GET", "/", close=True), CONF, None, True).reply
    assert b"Connection: close" not in handle(_req("GET", "/"), CONF, None, True).reply
