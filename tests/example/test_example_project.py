"""The example shop's management commands, run as a user would run them."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def manage(
    tmp_path: Path, *args: str, timeout: float = 300, pythonpath: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    path = str(ROOT) if pythonpath is None else f"{pythonpath}{os.pathsep}{ROOT}"
    env.update(SHOP_DATABASE=str(tmp_path / "shop.sqlite3"), PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, str(ROOT / "example_project" / "manage.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_scripts_shop_says_once_which_redis_it_uses(tmp_path: Path) -> None:
    """Found by a review of the example shop: every command of
    ``scripts/shop`` (migrate, seed_shop, runserver) started an embedded
    fakeredis and announced it, three ports of which only the last was the
    shop's."""
    from tests.support.servers import free_port
    from tests.test_dev_scripts import stamp_name

    venv = tmp_path / "venv"  # scripts/_venv.sh finds it installed: no pip
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / stamp_name("shop")).touch()
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE", "SHOP_EMBEDDED_REDIS_PORT")
    }
    env.update(VENV=str(venv), SHOP_ADDR=f"127.0.0.1:{port}",
               SHOP_DATABASE=str(tmp_path / "shop.sqlite3"))  # fmt: skip
    shop = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "shop")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the autoreloader's child goes with it
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert shop.poll() is None, shop.communicate()[0]
                assert time.monotonic() < deadline, "the shop did not start"
                time.sleep(0.1)
    finally:
        os.killpg(shop.pid, signal.SIGTERM)
        output = shop.communicate(timeout=30)[0]
    assert output.count("embedded fakeredis server") == 1, output
    assert output.count("Demo admin login") == 1, output
    assert "find it through shop.sqlite3.redis, or with SHOP_EMBEDDED_REDIS_PORT=" in output, output


def test_seed_shop_prints_the_demo_login(tmp_path: Path) -> None:
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    first = manage(tmp_path, "seed_shop")
    assert first.returncode == 0, first.stderr
    assert "username 'admin', password 'redislock-demo'" in first.stdout
    again = manage(tmp_path, "seed_shop")  # idempotent
    assert "0 SKU(s) created, 3 in total" in again.stdout


ORDER_TIMES = """
import datetime
from django.conf import settings
from django.test import Client
from example_project.shop.models import Order, SKU

order = Order.objects.create(sku=SKU.objects.order_by("pk").first(), buyer="tz")
print("zone", settings.TIME_ZONE, settings.USE_TZ)
stored = order.created_at.astimezone(datetime.timezone.utc)
print("stored", stored.strftime("%Y-%m-%d %H:%M:%S UTC"))
print(Client(SERVER_NAME="127.0.0.1").get("/orders/").content.decode())
"""


def test_order_times_are_shown_in_utc(tmp_path: Path) -> None:
    """Found by a review of the example shop: with no ``TIME_ZONE`` the shop
    ran on Django's default, America/Chicago, so the orders page, the
    dashboard and runserver's log showed Chicago's time, unlabelled."""
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    assert manage(tmp_path, "seed_shop").returncode == 0
    result = manage(tmp_path, "shell", "-c", ORDER_TIMES)
    assert result.returncode == 0, result.stderr
    assert "zone UTC True" in result.stdout
    stored = re.search(r"^stored (.+)$", result.stdout, re.M)
    assert stored, result.stdout
    assert f"<td>{stored.group(1)}</td>" in result.stdout, result.stdout


LOOPBACK_HOSTS = """
from django.test import Client
for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000"):
    print(host, Client(HTTP_HOST=host, raise_request_exception=False).get("/").status_code)
"""


def test_the_shop_answers_on_every_loopback_address(tmp_path: Path) -> None:
    """Found by a review of the example shop: the docs say to keep
    ``SHOP_ADDR`` on the loopback interface, and on IPv6's, ``[::1]``, every
    page was a 400 (``DisallowedHost``)."""
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    result = manage(tmp_path, "shell", "-c", LOOPBACK_HOSTS)
    assert result.returncode == 0, result.stderr
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000"):
        assert f"{host} 200" in result.stdout, result.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary")
def test_oversell_demo_shows_naive_overselling_and_deduct_not(tmp_path: Path) -> None:
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    result = manage(
        tmp_path,
        "oversell_demo",
        "--workers", "4", "--stock", "10", "--attempts", "10", "--think-ms", "5",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Started a private redis-server" in result.stdout
    row = re.search(r"^oversold\s+(\d+)\s+(\d+)\s*$", result.stdout, re.MULTILINE)
    assert row, result.stdout
    naive, ours = int(row.group(1)), int(row.group(2))
    assert naive > 0, result.stdout
    assert ours == 0, result.stdout
    sold = re.search(r"^sold \(orders\)\s+(\d+)\s+(\d+)\s*$", result.stdout, re.MULTILINE)
    assert sold and int(sold.group(2)) == 10


SLOW_EXIT = """
import atexit, sys, time
if "--multiprocessing-fork" in sys.argv:  # a spawned worker
    atexit.register(time.sleep, 6)
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary")
def test_oversell_demo_waits_for_workers_slow_to_exit(tmp_path: Path) -> None:
    """Found by a review of the example shop: 32 workers on two cores took
    seconds to exit, were killed after five and reported as failed, with no
    error to see. Here every worker takes six seconds to exit."""
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SLOW_EXIT)
    result = manage(
        tmp_path,
        "oversell_demo",
        "--workers", "2", "--stock", "2", "--attempts", "2", "--think-ms", "1",
        pythonpath=str(tmp_path / "site"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(r"^sold \(orders\)\s+\d+\s+2\s*$", result.stdout, re.MULTILINE), result.stdout


DIE_AT_START = """
import os, sys
if "--multiprocessing-fork" in sys.argv:  # a spawned worker
    os._exit(3)
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary")
def test_oversell_demo_stops_at_once_when_a_worker_dies_before_the_start(tmp_path: Path) -> None:
    """Noticed in a review of the example shop: a worker that died before its
    first purchase left the demo waiting two minutes for it, then ending in a
    ``BrokenBarrierError`` traceback. Here every worker exits at start-up."""
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(DIE_AT_START)
    started = time.monotonic()
    result = manage(
        tmp_path,
        "oversell_demo",
        "--workers", "2", "--stock", "2", "--attempts", "2",
        pythonpath=str(tmp_path / "site"),
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    error = "2 naive worker(s) exited before the run started (exit code 3); see the errors above."
    assert error in result.stderr
    assert "Traceback" not in result.stderr
    assert elapsed < 60  # the start's own limit is 120 s


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--workers", "0"), "--workers must be between 1 and 32, not 0."),
        (("--workers", "33"), "--workers must be between 1 and 32, not 33."),
        (("--stock", "1" + "0" * 23), f"--stock must be between 1 and 1000000, not 1{'0' * 23}."),
        (("--attempts", "1001"), "--attempts must be between 1 and 1000, not 1001."),
        (("--think-ms", "nan"), "--think-ms must be between 0 and 2000, not nan."),
        (("--think-ms", "inf"), "--think-ms must be between 0 and 2000, not inf."),
        (("--think-ms", "-1"), "--think-ms must be between 0 and 2000, not -1.0."),
    ],
)
def test_oversell_demo_rejects_bad_arguments(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    """Found by a review of the example shop: nan or inf think-ms failed
    every worker with a traceback, a stock past SQLite's integers was a
    traceback, and --workers had no upper bound (a process each)."""
    result = manage(tmp_path, "oversell_demo", *args)
    assert result.returncode == 1
    assert result.stderr == f"CommandError: {message}\n"


def test_shop_load_runs_buyers_on_the_embedded_redis(tmp_path: Path) -> None:
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    assert manage(tmp_path, "seed_shop").returncode == 0
    result = manage(tmp_path, "shop_load", "--seconds", "2", "--buyers", "3", "--think-ms", "50")
    assert result.returncode == 0, result.stderr
    assert "this run has an embedded fakeredis server of its own" in result.stderr
    assert "3 buyers for 2 s" in result.stdout
    assert "[##############################]" in result.stdout  # the progress bar ends full
    done = re.search(
        r"^Done: (\d+) bought, (\d+) answered 423(, \d+ x sold out)?\.$", result.stdout, re.M
    )
    assert done, result.stdout
    assert int(done.group(1)) > 0


def test_shop_load_ends_its_progress_with_the_final_count(tmp_path: Path) -> None:
    """Found by a review of the example shop: off a terminal the full bar was
    printed when time was up, while the buyers' last purchases (a second of
    payment here) were still going, so it disagreed with the "Done:" line."""
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    assert manage(tmp_path, "seed_shop").returncode == 0
    result = manage(tmp_path, "shop_load", "--seconds", "1", "--buyers", "3", "--think-ms", "1000")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    full = "[" + "#" * 30 + "]   1.0/1 s  "
    assert [line for line in lines if line.startswith(full)] == [lines[-2]], result.stdout
    assert lines[-2] == full + lines[-1].removeprefix("Done: ").removesuffix("."), result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--seconds", "0"), "--seconds must be between 0 and 3600, not 0."),
        (("--buyers", "100"), "--buyers must be between 1 and 64, not 100."),
        (("--seconds", "nan"), "--seconds must be between 0 and 3600, not nan."),
        (("--seconds", "inf"), "--seconds must be between 0 and 3600, not inf."),
        (("--think-ms", "2001"), "--think-ms must be between 0 and 2000, not 2001."),
    ],
)
def test_shop_load_rejects_bad_arguments(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = manage(tmp_path, "shop_load", *args)
    assert result.returncode == 1
    assert result.stderr == f"CommandError: {message}\n"


SHOP_EDGES = """
import threading
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django_redislock import Lock, Semaphore
from example_project.shop.models import Order, SKU

client = Client(SERVER_NAME="127.0.0.1", raise_request_exception=False)
sku = SKU.objects.order_by("pk").first()
buy = reverse("shop:buy", args=[sku.pk])
for odd in ("\\u00b2", "9" * 5000, "-1", "1.5"):  # ignored, never a 500
    assert client.post(buy, {"think_ms": odd}).status_code == 302, odd

held, done = threading.Event(), threading.Event()
def hold(*primitives):
    for p in primitives:
        p.acquire()
    held.set()
    done.wait(60)
    for p in primitives:
        p.release()
holder = threading.Thread(target=hold, args=(Semaphore("payment-provider", 2),))
other = threading.Thread(target=hold, args=(Semaphore("payment-provider", 2), Lock("report:daily")))
holder.start(); held.wait(10); held.clear(); other.start(); held.wait(10)
orders = Order.objects.count()
answer = client.post(buy, {"think_ms": "1"})  # the provider stays busy
print("busy", answer.status_code, answer["Retry-After"], Order.objects.count() - orders)
try:
    call_command("shop_load", "--seconds", "1", "--buyers", "1")
except CommandError as exc:
    print("second run:", exc)
done.set(); holder.join(); other.join()
out = client.post(buy)
print("outcome", out.status_code, out["X-Shop-Outcome"])
"""


def test_shop_edges_answer_instead_of_crashing(tmp_path: Path) -> None:
    """Found by a review of the example shop: odd ``think_ms`` values and a
    busy payment provider were 500s, a second ``shop_load`` a traceback."""
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    assert manage(tmp_path, "seed_shop").returncode == 0
    result = manage(tmp_path, "shell", "-c", SHOP_EDGES)
    assert result.returncode == 0, result.stderr
    assert "busy 503 " in result.stdout and "Traceback" not in result.stderr
    assert re.search(r"^busy 503 \d+ 0$", result.stdout, re.M), result.stdout  # nothing sold
    assert "second run: Another shop_load run is going" in result.stdout
    assert "outcome 302 bought" in result.stdout


LOAD_FLASH = """
from unittest import mock
from django.test import Client
from django.urls import reverse
from example_project.shop import load

with mock.patch.object(load, "start_in_background", return_value=True):  # no real run
    page = Client(SERVER_NAME="127.0.0.1").post(reverse("shop:load"), follow=True)
print(page.status_code, page.content.decode())
"""


def test_the_load_flash_links_to_the_dashboard(tmp_path: Path) -> None:
    """ "Make some load" said "watch /admin/django_redislock/heldlock/." as
    plain text: now the dashboard is a link (the name itself escaped)."""
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    result = manage(tmp_path, "shell", "-c", LOAD_FLASH)
    assert result.returncode == 0, result.stderr
    assert "\n200 <!doctype html>" in "\n" + result.stdout, result.stdout[:300]
    assert (
        '8 buyers are shopping for 60 s: watch <a href="/admin/django_redislock/heldlock/">'
        "the lock dashboard</a>." in result.stdout
    ), result.stdout


INVOICES = """
import functools
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django_redislock import Semaphore
from example_project.shop.management.commands.seed_shop import DEMO_USERNAME
from example_project.shop.models import Order, SKU

sku = SKU.objects.order_by("pk").first()
demo = User.objects.get(username=DEMO_USERNAME)
plain = User.objects.create_user("plain", password="x")
mine = Order.objects.create(sku=sku, buyer="plain")
theirs = Order.objects.create(sku=sku, buyer=DEMO_USERNAME)
url = lambda order: reverse("shop:invoice", args=[order.pk])

Client = functools.partial(Client, SERVER_NAME="127.0.0.1")
anonymous = Client().get(url(theirs))
print("anonymous", anonymous.status_code, anonymous["Location"].split("?")[0])
staff, other = Client(), Client()
staff.force_login(demo)
other.force_login(plain)
ok = staff.get(url(theirs))
print("ok", ok.status_code, ok["Content-Disposition"], ok.content.decode().splitlines()[0])
print("link", url(theirs) in staff.get(reverse("shop:orders")).content.decode())
print("not theirs", other.get(url(theirs)).status_code)
slots = Semaphore(f"invoice:{demo.pk}", 2)
slots.acquire(); slots.acquire()  # two downloads of the demo user's under way
busy = staff.get(url(theirs))
print("busy", busy.status_code, busy["Retry-After"])
print("others", other.get(url(mine)).status_code)
slots.release(); slots.release()
print("again", staff.get(url(theirs)).status_code)
"""


def test_invoices_are_limited_to_two_at_once_per_user(tmp_path: Path) -> None:
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    assert manage(tmp_path, "seed_shop").returncode == 0
    result = manage(tmp_path, "shell", "-c", INVOICES)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "anonymous 302 /admin/login/" in out, out
    assert re.search(
        r'^ok 200 attachment; filename="invoice-\d+.txt" Invoice for order #\d+$', out, re.M
    ), out
    assert "link True" in out and "not theirs 404" in out, out
    busy = re.search(r"^busy 429 (\d+)$", out, re.M)
    assert busy and 1 <= int(busy.group(1)) <= 10, out  # the shop's 10 s lease at most
    assert "others 200" in out and "again 200" in out, out


SHOP_RETRY = """
from django.test import Client
from django.urls import reverse
from example_project.shop.models import Order, SKU

client = Client(SERVER_NAME="127.0.0.1")
sku = SKU.objects.order_by("pk").first()
buy = reverse("shop:buy", args=[sku.pk])
before, orders = sku.stock, Order.objects.count()
answers = [client.post(buy, headers={"Idempotency-Key": "tap-1"}) for _ in range(3)]
sku.refresh_from_db()
print("answers", [a.status_code for a in answers], [a.get("Idempotent-Replayed") for a in answers])
print("sold", before - sku.stock, Order.objects.count() - orders)
"""


def test_the_shops_buy_view_buys_once_per_idempotency_key(tmp_path: Path) -> None:
    """A client retrying a purchase with one ``Idempotency-Key`` (docs/once.md)."""
    assert manage(tmp_path, "migrate", "--noinput", "-v", "0").returncode == 0
    assert manage(tmp_path, "seed_shop").returncode == 0
    result = manage(tmp_path, "shell", "-c", SHOP_RETRY)
    assert result.returncode == 0, result.stderr
    assert "answers [302, 302, 302] [None, 'true', 'true']" in result.stdout, result.stdout
    assert "sold 1 1" in result.stdout
