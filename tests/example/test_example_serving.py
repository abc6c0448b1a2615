"""The example shop as people run it: under gunicorn and uvicorn with several
workers (on the suite's real Redis), its static files, and its embedded
fakeredis server shared with the project's other commands, never copied."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
MANAGE = str(ROOT / "example_project" / "manage.py")
#: What must not leak from the suite's environment into the shop's.
SHOP_VARIABLES = ("REDIS_URL", "DJANGO_SETTINGS_MODULE", "SHOP_EMBEDDED_REDIS_PORT")


def shop_env(tmp_path: Path, redis_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SHOP_VARIABLES}
    env.update(SHOP_DATABASE=str(tmp_path / "shop.sqlite3"), PYTHONPATH=str(ROOT))
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, MANAGE, *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def seeded(env: dict[str, str], stock: int) -> None:
    """A migrated shop database whose first SKU has ``stock``."""
    for args in (("migrate", "--noinput", "-v", "0"), ("seed_shop",)):
        result = manage(env, *args)
        assert result.returncode == 0, result.stderr
    result = manage(env, "shell", "-c", f"{FIRST_SKU}; sku.stock = {stock}; sku.save()")
    assert result.returncode == 0, result.stderr


FIRST_SKU = "from example_project.shop.models import SKU; sku = SKU.objects.order_by('pk')[0]"


def stock_and_orders(env: dict[str, str]) -> tuple[int, int]:
    code = f"{FIRST_SKU}; print('stock', sku.stock, sku.orders.count())"
    result = manage(env, "shell", "-c", code)
    assert result.returncode == 0, result.stderr
    found = re.search(r"^stock (\d+) (\d+)$", result.stdout, re.M)
    assert found, result.stdout
    return int(found.group(1)), int(found.group(2))


@contextmanager
def serving(command: list[str], env: dict[str, str], port: int) -> Iterator[list[str]]:
    """Run a server until the block ends; yields its output so far (one string)."""
    proc = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert proc.poll() is None, "".join(output)
                assert time.monotonic() < deadline, "the server never listened"
                time.sleep(0.1)  # polling a port: nothing to wait on
        yield output
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        reader.join(10)
        if proc.stdout is not None:
            proc.stdout.close()


def request(
    port: int, method: str, path: str, body: str = "", headers: dict[str, str] | None = None
) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def csrf(port: int) -> tuple[str, str]:
    """A CSRF cookie and the form token that goes with it, from the shop page."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/")
    response = conn.getresponse()
    page = response.read().decode()
    conn.close()
    assert response.status == 200, page
    cookie = re.search(r"csrftoken=([^;]+)", response.getheader("Set-Cookie") or "")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert cookie and token, page
    return cookie.group(1), token.group(1)


def buy_all_at_once(port: int, buyers: int, path: str = "/buy/1/") -> Counter[str]:
    """``buyers`` purchases of the first SKU, released together: their outcomes."""
    cookie, token = csrf(port)
    barrier = threading.Barrier(buyers)
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def buy() -> None:
        barrier.wait(30)
        response = request(
            port, "POST", path, urllib.parse.urlencode({"csrfmiddlewaretoken": token}),
            {"Cookie": f"csrftoken={cookie}",
             "Content-Type": "application/x-www-form-urlencoded"},
        )  # fmt: skip
        outcome = response.getheader("X-Shop-Outcome") or str(response.status)
        with lock:
            outcomes[outcome] += 1

    threads = [threading.Thread(target=buy) for _ in range(buyers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sum(outcomes.values()) == buyers, outcomes
    return outcomes


def needs(module: str) -> None:
    if subprocess.run([sys.executable, "-c", f"import {module}"], check=False).returncode:
        pytest.skip(f"{module} is not installed (the shop extra: pip install -e '.[shop]')")


@pytest.mark.slow
def test_gunicorn_with_two_workers_sells_exactly_the_stock(tmp_path: Path, redis_url: str) -> None:
    needs("gunicorn")
    env = shop_env(tmp_path, redis_url)
    seeded(env, stock=12)
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "--workers", "2", "--bind",
               f"127.0.0.1:{port}", "example_project.wsgi"]  # fmt: skip
    with serving(command, env, port) as output:
        outcomes = buy_all_at_once(port, buyers=30)
        static = request(port, "GET", "/static/admin/css/base.css")
        dashboard_js = request(port, "GET", "/static/django_redislock/dashboard.js")
    print(f"gunicorn, 2 workers, 30 buyers at once for a stock of 12: {dict(outcomes)}")
    log = "".join(output)
    assert len(re.findall(r"Booting worker with pid", log)) >= 2, log
    stock, orders = stock_and_orders(env)
    # every buyer got an answer: bought, sold out, or (after BLOCKING_TIMEOUT) 423
    assert set(outcomes) <= {"bought", "sold out", "423"}, outcomes
    assert stock == 12 - outcomes["bought"] >= 0, (stock, outcomes)
    assert orders == outcomes["bought"], (orders, outcomes)
    if not outcomes["423"]:
        assert outcomes["bought"] == 12, outcomes
    # the admin's CSS and the dashboard's JS, served by WhiteNoise (no collectstatic)
    assert static.status == 200 and dashboard_js.status == 200


@pytest.mark.slow
def test_uvicorn_with_two_workers_serves_the_shop(tmp_path: Path, redis_url: str) -> None:
    needs("uvicorn")
    env = shop_env(tmp_path, redis_url)
    seeded(env, stock=5)
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "--workers", "2", "--port", str(port),
               "example_project.asgi:application"]  # fmt: skip
    with serving(command, env, port):
        outcomes = buy_all_at_once(port, buyers=8)
        static = request(port, "GET", "/static/admin/css/base.css")
    assert outcomes["bought"] == 5 - stock_and_orders(env)[0] > 0, outcomes
    assert static.status == 200


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/buy/1/", "/abuy/1/"], ids=["sync", "async"])
def test_two_hundred_buyers_on_two_uvicorn_workers_meet_no_503_while_redis_is_healthy(
    tmp_path: Path, redis_url: str, path: str
) -> None:
    """200 buyers at once on one SKU, over 2 uvicorn workers, the cache pool
    at its default size: each waiter once held a pool connection, past 100
    per process the pool ran dry, and 20-104 buyers a run were told that the
    lock service was unavailable (503) while Redis idled. Now a process's
    waiters share one wake-up connection: every buyer is answered bought or
    sold out (or 423 after a full wait), and the stock is exact."""
    needs("uvicorn")
    env = shop_env(tmp_path, redis_url)
    seeded(env, stock=50)
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "--workers", "2", "--port", str(port),
               "example_project.asgi:application"]  # fmt: skip
    with serving(command, env, port) as output:
        outcomes = buy_all_at_once(port, buyers=200, path=path)
    print(f"uvicorn, 2 workers, 200 buyers at once on {path} for a stock of 50: {dict(outcomes)}")
    assert set(outcomes) <= {"bought", "sold out", "423"}, (outcomes, "".join(output)[-3000:])
    stock, orders = stock_and_orders(env)
    assert stock == 50 - outcomes["bought"] >= 0 and orders == outcomes["bought"], outcomes
    if not outcomes["423"]:
        assert outcomes["bought"] == 50, outcomes


def test_gunicorn_without_redis_url_refuses_to_start(tmp_path: Path) -> None:
    """Each worker started an embedded fakeredis of its own: locks were not
    shared between workers, and nothing said so."""
    needs("gunicorn")
    env = shop_env(tmp_path)
    seeded(env, stock=1)
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "gunicorn", "--workers", "2", "--bind", f"127.0.0.1:{port}",
         "example_project.wsgi"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "no REDIS_URL and runs under gunicorn" in result.stderr, result.stderr
    assert "Set REDIS_URL=redis://HOST:6379/0" in result.stderr


def test_an_asgi_worker_without_redis_url_refuses_to_start(tmp_path: Path) -> None:
    needs("uvicorn")
    result = subprocess.run(
        [sys.executable, "-c", "import uvicorn, example_project.asgi"],
        env=shop_env(tmp_path), cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "no REDIS_URL and runs under uvicorn" in result.stderr, result.stderr


HOLD = (
    "from django_redislock import Lock; "
    "assert Lock('demo:held', timeout=120, auto_renew=False).acquire(blocking=False); "
    "import os; os._exit(0)"  # no release: the lease stays, as a crashed holder's would
)


@pytest.mark.slow
def test_manage_locks_finds_the_running_shops_embedded_server(tmp_path: Path) -> None:
    """``manage.py locks`` beside a running shop inspected an empty fakeredis of
    its own and answered "Nothing is held."; now it finds the shop's, and
    with no shop running it says that what it looks at is its own, empty."""
    env = shop_env(tmp_path)
    seeded(env, stock=1)
    port = free_port()
    shop = [sys.executable, MANAGE, "runserver", f"127.0.0.1:{port}"]  # with its autoreloader
    with serving(shop, env, port) as output:
        held = manage(env, "shell", "-c", HOLD)
        assert held.returncode == 0, held.stderr
        found = manage(env, "locks")
        load = manage(env, "shop_load", "--seconds", "1", "--buyers", "1")
    assert "inside this runserver" in "".join(output), output
    assert found.returncode == 0, found.stderr
    assert "demo:held" in found.stdout, found.stdout + found.stderr
    assert "the embedded fakeredis server at 127.0.0.1:" in found.stderr
    assert "(the running shop, pid " in found.stderr
    assert "of its own" not in load.stderr, load.stderr  # the load went to the shop too
    alone = manage(env, "locks")  # the shop has stopped: its file's lock went with it
    assert alone.returncode == 0, alone.stderr
    assert "Nothing is held." in alone.stdout
    assert "no running shop found" in alone.stderr, alone.stderr
    assert "empty embedded fakeredis server of this command's own" in alone.stderr


@pytest.mark.slow
def test_a_second_server_process_uses_the_first_ones_embedded_server(tmp_path: Path) -> None:
    """Two shops on one project share one embedded server (and their locks)."""
    env = shop_env(tmp_path)
    seeded(env, stock=1)
    first, second = free_port(), free_port()
    noreload = [sys.executable, MANAGE, "runserver", "--noreload"]
    with (
        serving([*noreload, f"127.0.0.1:{first}"], env, first) as one,
        serving([*noreload, f"127.0.0.1:{second}"], env, second) as two,
    ):
        pass
    assert "inside this runserver" in "".join(one), one
    owner = re.search(r"at 127\.0\.0\.1:(\d+), inside", "".join(one))
    assert owner, one
    assert f"fakeredis server at 127.0.0.1:{owner.group(1)} of process " in "".join(two), two
