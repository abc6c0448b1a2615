"""A FIPS-mode Python refuses SHA-1 (and MD5) for security, and the app still runs.

A Lua script's SHA1 is a name, never security: it is how ``EVALSHA`` finds
the script on the server. So the script loader asks for it with
``usedforsecurity=False``, which a FIPS-mode OpenSSL honours. The stand-in
here refuses SHA-1 and MD5 asked for without it, as a FIPS-mode hashlib
does. The package's other digests are SHA-256, which FIPS allows: the
operator tools' holder digests keep tokens off pages (a security use), and
``@idempotent``'s body fingerprint and key names.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from django_redislock.backend.scripts import LOCK_ACQUIRE, Script
from django_redislock.ops.inspection import holders_signature

#: What a FIPS-mode hashlib refuses for security.
REFUSED = ("sha1", "md5")

FIPS_HASHLIB = """
import hashlib

def refusing(real):
    def hash(*args, usedforsecurity=True, **kwargs):
        if usedforsecurity:
            raise ValueError("[digital envelope routines] unsupported (FIPS mode)")
        return real(*args, usedforsecurity=False, **kwargs)
    return hash

for name in {names!r}:
    setattr(hashlib, name, refusing(getattr(hashlib, name)))
"""


def _refusing(real: Callable[..., Any]) -> Callable[..., Any]:
    def fips_hash(*args: Any, usedforsecurity: bool = True, **kwargs: Any) -> Any:
        if usedforsecurity:
            raise ValueError("[digital envelope routines] unsupported (FIPS mode)")
        return real(*args, usedforsecurity=False, **kwargs)

    return fips_hash


@pytest.fixture
def fips(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hashlib`` as in FIPS mode: a hash for security is a ``ValueError``."""
    for name in REFUSED:
        monkeypatch.setattr(hashlib, name, _refusing(getattr(hashlib, name)))
    with pytest.raises(ValueError, match="FIPS"):
        hashlib.sha1(b"the stand-in refuses")


def test_a_script_built_in_fips_mode_has_the_sha_redis_names_it_by(fips: None) -> None:
    script = Script("lock_acquire.lua", keys=LOCK_ACQUIRE.key_names, args=LOCK_ACQUIRE.arg_names)
    assert script.text == LOCK_ACQUIRE.text
    # EVALSHA finds the script by this SHA1 of its text, the one Redis computes on SCRIPT LOAD
    assert script.sha == LOCK_ACQUIRE.sha
    assert script.sha == hashlib.sha1(script.text.encode(), usedforsecurity=False).hexdigest()
    assert Script("wake.lua", prelude=False).sha


def test_holders_signature_in_fips_mode(fips: None) -> None:
    """SHA-256, which FIPS allows for security: nothing to declare."""
    held = SimpleNamespace(holders=[SimpleNamespace(token="b-token"), SimpleNamespace(token="a")])
    signature = holders_signature(held)  # type: ignore[arg-type]
    assert len(signature.split(",")) == 2
    assert all(len(digest) == 16 for digest in signature.split(","))


def test_the_package_imports_in_fips_mode() -> None:
    """Every module-level ``Script`` is built at import: a fresh interpreter
    with a FIPS-mode hashlib imports the package and its scripts."""
    code = FIPS_HASHLIB.format(names=REFUSED) + textwrap.dedent(
        """
        import django_redislock
        from django_redislock.backend import scripts
        built = [s for s in vars(scripts).values() if isinstance(s, scripts.Script) and s.text]
        assert len(built) > 10, built
        print(len(built))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 10
