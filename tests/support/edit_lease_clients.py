"""A staff member's browser as an OS process of its own, for the edit lease's race (issue 47).

``tests/editing/test_edit_lease_processes.py`` spawns one per user: each logs
in to its own server of the example shop and keeps its cookies, then runs
the requests the test sends it over a pipe. A ``race`` request opens its
connection first and is sent once every racer has reached the shared
barrier, so two users' requests leave two processes at the same moment
(an event, never a sleep, lines them up). Only the standard library: the
process never sets Django up.
"""

from __future__ import annotations

import http.client
import re
import traceback
import urllib.parse
from http.cookies import SimpleCookie
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import Any

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
#: What a request answers, as the test reads it: status, ``Location``, body.
Reply = tuple[int, str, str]


class Browser:
    """One user's cookies against one server."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cookies: dict[str, str] = {}

    def connection(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.connect()
        return conn

    def send(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        path: str,
        fields: dict[str, str] | None = None,
    ) -> Reply:
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}
        body = None
        if fields is not None:
            body = urllib.parse.urlencode(fields)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read().decode()
        finally:
            conn.close()
        for header in response.headers.get_all("Set-Cookie") or ():
            for name, morsel in SimpleCookie(header).items():
                if morsel["max-age"] == "0" or not morsel.value:
                    self.cookies.pop(name, None)  # Django deletes a cookie this way
                else:
                    self.cookies[name] = morsel.value
        return response.status, response.getheader("Location") or "", text

    def request(self, method: str, path: str, fields: dict[str, str] | None = None) -> Reply:
        return self.send(self.connection(), method, path, fields)

    def log_in(self, username: str) -> None:
        status, _, page = self.request("GET", "/admin/login/?next=/admin/")
        token = CSRF.search(page)
        assert status == 200 and token, page[-2000:]
        fields = {"csrfmiddlewaretoken": token.group(1), "username": username, "password": "pw"}
        status, location, page = self.request("POST", "/admin/login/?next=/admin/", fields)
        assert status == 302 and location.endswith("/admin/"), (status, page[-2000:])


def serve(port: int, username: str, pipe: Connection, barrier: Barrier) -> None:
    """Log ``username`` in, then answer the test's requests until it sends ``None``.

    A request is ``(kind, method, path, fields)``, ``kind`` ``"now"`` or
    ``"race"``; the answer is ``("ok", reply)`` or ``("error", traceback)``."""
    browser = Browser(port)
    try:
        browser.log_in(username)
        pipe.send(("ok", (200, "", "logged in")))
    except Exception:
        pipe.send(("error", traceback.format_exc()))
        return
    while (command := pipe.recv()) is not None:
        kind, method, path, fields = command
        try:
            if kind == "race":
                conn = browser.connection()  # connected before the barrier: only the send is left
                barrier.wait(60)
                answer: Any = ("ok", browser.send(conn, method, path, fields))
            else:
                answer = ("ok", browser.request(method, path, fields))
        except Exception:
            answer = ("error", traceback.format_exc())
        pipe.send(answer)
