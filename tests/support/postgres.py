"""A real PostgreSQL server for the tests, started from the binaries on the machine, or the one given.

`LEAKPROBE_TEST_POSTGRES_URL` (a role that may create databases) wins.  Otherwise `initdb` and `postgres`
from the machine's PostgreSQL (PATH, `pg_config --bindir`, or /usr/lib/postgresql/*/bin) run in a temporary
directory -- as the `postgres` user when the tests run as root, since PostgreSQL refuses to run as root --
listening on a free loopback port with password (SCRAM) authentication.  Each test gets a fresh database.
Where neither is available the tests skip with how to get one, except under CI, where they fail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from tests.support.ports import free_port
from tests.support.tools import terminate, unavailable
from tests.support.waiting import wait_for

URL_ENV = "LEAKPROBE_TEST_POSTGRES_URL"
USER = "leakprobe"
PASSWORD = "pw-" + uuid.uuid4().hex[:16]


@dataclass
class PostgresServer:
    admin_url: str  # connects to the maintenance database with rights to create databases

    def create_database(self) -> str:
        """A fresh, empty database; its URL (password included)."""
        name = "lp_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return urlsplit(self.admin_url)._replace(path="/" + name).geturl()


def _bindir() -> Path | None:
    if shutil.which("initdb") and shutil.which("postgres"):
        return Path(shutil.which("initdb") or "").parent
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out and (Path(out) / "initdb").exists():
            return Path(out)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    return found[0].parent if found else None


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    given = os.environ.get(URL_ENV)
    if given:
        yield PostgresServer(given)
        return
    bindir = _bindir()
    if bindir is None:
        unavailable(f"no PostgreSQL binaries (apt-get install postgresql, or set {URL_ENV})")
        return
    as_root = os.geteuid() == 0
    run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
    root = Path(tempfile.mkdtemp(prefix="leakprobe-pg-"))  # not under pytest's root-only tmp: postgres reads it
    data = root / "data"
    (root / "pwfile").write_text(PASSWORD + "\n")
    if as_root:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(root / "pwfile", "postgres", "postgres")
    port = free_port()
    process: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "-U", USER, "-A", "scram-sha-256",
                        f"--pwfile={root / 'pwfile'}", "--no-sync", "-E", "UTF8", "--locale=C"],
                       check=True, capture_output=True)
        with (root / "log").open("wb") as log:
            process = subprocess.Popen(
                [*run_as, str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root),
                 "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"],
                stdout=subprocess.DEVNULL, stderr=log)
        url = f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port}/postgres"
        server = process

        def accepts() -> bool:
            if server.poll() is not None:
                raise RuntimeError("PostgreSQL exited: " + (root / "log").read_text()[-2000:])
            try:
                psycopg.connect(url, connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                return False
        wait_for(accepts, "PostgreSQL to accept connections", idle_s=60,
                 context=lambda: (root / "log").read_text()[-2000:])
        yield PostgresServer(url)
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        unavailable(f"cannot start PostgreSQL from {bindir}: {exc} {detail.decode(errors='replace')[-500:]}")
    finally:
        if process is not None:
            terminate(process, grace_s=10)  # smart shutdown; then killed
        shutil.rmtree(root, ignore_errors=True)
