"""The listener's loop: the order of one select batch, and the Date header of every reply."""
from __future__ import annotations

import selectors
import socket
from email.utils import parsedate_to_datetime

from cachemon.web.connection import Conn, ConnState
from cachemon.web.handler import response_head
from cachemon.web.listener import _turn


def _key(data: object) -> tuple[selectors.SelectorKey, int]:
    return selectors.SelectorKey(None, 0, selectors.EVENT_READ, data), selectors.EVENT_READ  # type: ignore[arg-type]


def test_a_batch_serves_replies_then_kept_alive_connections_then_new_ones():
    a, b = socket.socketpair()
    try:
        fresh = Conn(a, "10.0.0.1:1", ConnState.READ, 0.0)
        scraper = Conn(b, "10.0.0.2:2", ConnState.IDLE, 0.0)
        scraper.served = 3
        batch = [_key(None), _key(fresh), _key(scraper), _key("wake")]
        batch.sort(key=_turn)
        assert [k.data for k, _ in batch] == ["wake", scraper, fresh, None]
    finally:
        a.close()
        b.close()


def test_the_date_header_is_an_http_date_of_now():
    import time
    head = response_head(429, 0).decode("latin-1")
    date = next(line.split(": ", 1)[1] for line in head.split("\r\n") if line.startswith("Date: "))
    assert date.endswith(" GMT")
    assert abs(parsedate_to_datetime(date).timestamp() - time.time()) <= 2
