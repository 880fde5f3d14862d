"""`agentpark token create|list|revoke|export|import` on a state dir's database, and the
refusal of `agentpark serve` on a non-loopback address with no token."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agentpark import cli
from agentpark.auth import TOKEN_ENV, TokenStore, hash_token, is_loopback
from agentpark.cli.serve import tokens_allow_bind
from agentpark.client import TOKEN_ENV as CLIENT_TOKEN_ENV
from agentpark.config import load_settings
from agentpark.errors import UnauthenticatedError

TOKEN_RE = re.compile(r"^apk_([0-9a-f]{12})_[A-Za-z0-9_-]{43}$")


def _config(tmp_path: Path, name: str = "state") -> Path:
    config = tmp_path / f"{name}.toml"
    config.write_text(f'state_dir = "{tmp_path / name}"\n')
    return config


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _store(config: Path) -> TokenStore:
    return TokenStore.open(load_settings(config).database_url)


def test_create_prints_the_token_once_and_stores_only_its_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)  # a new state dir: the command migrates it first
    code, out, err = _run(
        capsys, "token", "create", "--config", str(config), "--tenant", "team-a", "--scope",
        "sessions,operator",
    )  # fmt: skip
    assert code == 0, err
    token = out.strip()
    match = TOKEN_RE.match(token)
    assert match, token
    assert f"token {match[1]}" in err and "shown once" in err
    database = tmp_path / "state" / "agentpark.db"
    raw = b"".join(p.read_bytes() for p in database.parent.glob("agentpark.db*"))  # + -wal
    assert token.encode() not in raw and token.split("_", 2)[2].encode() not in raw
    with sqlite3.connect(database) as conn:
        rows = conn.execute("SELECT id, tenant, scopes, token_hash FROM api_tokens").fetchall()
    assert rows == [(match[1], "team-a", "operator,sessions", hash_token(token))]
    store = _store(config)
    try:
        identity = store.authenticate(token)
    finally:
        store.close()
    assert (identity.tenant, sorted(identity.scopes)) == ("team-a", ["operator", "sessions"])


def test_list_shows_ids_tenants_scopes_and_times_never_a_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(_config(tmp_path))
    tokens = []
    for tenant, scope in (("a", "sessions"), ("ops", "operator,admin")):
        code, out, _ = _run(capsys, "--config", config, "token", "create", "--tenant", tenant,
                            "--scope", scope)  # fmt: skip
        assert code == 0
        tokens.append(out.strip())
    code, out, _ = _run(capsys, "--config", config, "token", "list")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "TENANT", "SCOPES", "CREATED", "LAST", "USED", "REVOKED"]
    ids = [TOKEN_RE.match(t)[1] for t in tokens]  # type: ignore[index]
    assert [r.split()[:3] for r in rows] == [
        [ids[0], "a", "sessions"],
        [ids[1], "ops", "admin,operator"],
    ]
    assert all(t.split("_", 2)[2] not in out for t in tokens)
    assert all(r.split()[-1] == "-" for r in rows)  # nothing revoked


def test_revoke_refuses_the_token_and_is_idempotent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(_config(tmp_path))
    _, out, _ = _run(capsys, "token", "create", "--config", config, "--tenant", "a", "--scope",
                     "sessions")  # fmt: skip
    token = out.strip()
    token_id = token.split("_")[1]
    code, out, _ = _run(capsys, "token", "revoke", "--config", config, token_id)
    assert code == 0 and f"token {token_id} (tenant a) revoked" in out
    first = out
    code, out, _ = _run(capsys, "token", "revoke", "--config", config, f"apk_{token_id}")
    assert code == 0 and out == first  # the first revocation's time stays
    store = _store(Path(config))
    try:
        with pytest.raises(UnauthenticatedError, match="revoked"):
            store.authenticate(token)
    finally:
        store.close()
    code, _, err = _run(capsys, "token", "revoke", "--config", config, "0123456789ab")
    assert code == 1 and "no token" in err
    _, out, _ = _run(capsys, "token", "list", "--config", config)
    assert out.splitlines()[1].split()[-2:] != ["-", "-"]  # revoked at a time


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "a", "--scope", "root"], "unknown scope 'root'"),
        (["--tenant", "a", "--scope", ","], "at least one scope"),
        (["--tenant", "a b", "--scope", "sessions"], "--tenant 'a b'"),
        (["--tenant", ".hidden", "--scope", "sessions"], "--tenant '.hidden'"),
    ],
)
def test_create_refuses_a_bad_scope_or_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    config = _config(tmp_path)
    code, out, err = _run(capsys, "token", "create", "--config", str(config), *args)
    assert code == 2 and out == "" and message in err


def test_export_then_import_gives_another_host_the_same_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    here, there = str(_config(tmp_path, "here")), str(_config(tmp_path, "there"))
    _, out, _ = _run(capsys, "token", "create", "--config", here, "--tenant", "a", "--scope",
                     "sessions")  # fmt: skip
    token = out.strip()
    _, gone, _ = _run(capsys, "token", "create", "--config", here, "--tenant", "b", "--scope",
                      "operator")  # fmt: skip
    _run(capsys, "token", "revoke", "--config", here, gone.split("_")[1])
    code, exported, _ = _run(capsys, "token", "export", "--config", here)
    assert code == 0
    assert token.split("_", 2)[2] not in exported  # hashes only
    lines = [x for x in exported.splitlines() if not x.startswith("#")]
    assert lines == [f"{token.split('_')[1]} a sessions sha256:{hash_token(token)}"]  # no revoked
    file = tmp_path / "tokens"
    file.write_text(exported)
    code, out, err = _run(capsys, "token", "import", "--config", there, str(file))
    assert code == 0 and "imported 1 token(s)" in out, err
    code, out, _ = _run(capsys, "token", "import", "--config", there, str(file))
    assert code == 0 and "imported 0 token(s)" in out and "1 already there" in out
    store = _store(Path(there))
    try:
        assert store.authenticate(token).tenant == "a"
    finally:
        store.close()
    # Revoked on this host, then imported again: it stays revoked.
    _run(capsys, "token", "revoke", "--config", there, token.split("_")[1])
    _run(capsys, "token", "import", "--config", there, str(file))
    store = _store(Path(there))
    try:
        with pytest.raises(UnauthenticatedError, match="revoked"):
            store.authenticate(token)
    finally:
        store.close()


def test_import_refuses_a_bad_or_conflicting_file_and_imports_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(_config(tmp_path))
    _, out, _ = _run(capsys, "token", "create", "--config", config, "--tenant", "a", "--scope",
                     "sessions")  # fmt: skip
    token_id = out.strip().split("_")[1]
    good = f"0123456789ab b sessions sha256:{'1' * 64}"
    for text, message in (
        (f"{good}\nnot a line", "line 2"),
        (f"{good}\n0123456789ac b root sha256:{'1' * 64}", "unknown scope"),
        (f"{good}\n{token_id} a sessions sha256:{'2' * 64}", f"token {token_id} exists"),
        ("xyz b sessions sha256:" + "1" * 64, "not 12 hex digits"),
    ):
        file = tmp_path / "bad"
        file.write_text(text)
        code, _, err = _run(capsys, "token", "import", "--config", config, str(file))
        assert code == 2 and message in err and "nothing imported" in err, (text, err)
    _, out, _ = _run(capsys, "token", "list", "--config", config)
    assert len(out.splitlines()) == 2  # the header and the one created token
    code, _, err = _run(capsys, "token", "import", "--config", config, str(tmp_path / "none"))
    assert code == 2 and "cannot read" in err


def test_the_token_env_is_one_name_everywhere() -> None:
    assert TOKEN_ENV == CLIENT_TOKEN_ENV == "AGENTPARK_TOKEN"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("example.com", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def _serve(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPARK_")}
    env["AGENTPARK_STATE_DIR"] = str(state)
    env["AGENTPARK_TIERS__SHM__CAPACITY"] = "0"  # never a tier file in /dev/shm
    return subprocess.run(
        [sys.executable, "-m", "agentpark", "serve", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_serve_on_all_interfaces_without_a_token_exits_2_saying_how_to_make_one(
    tmp_path: Path,
) -> None:
    done = _serve(tmp_path / "state", "--host", "0.0.0.0", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "refusing to serve on 0.0.0.0" in done.stderr
    assert "agentpark [--config FILE] token create --tenant NAME --scope sessions" in done.stderr
    assert "Uvicorn running" not in done.stderr


def test_a_revoked_token_does_not_count_for_the_bind_and_an_active_one_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    settings = load_settings(config).model_copy(
        update={"server": load_settings(config).server.model_copy(update={"host": "0.0.0.0"})}
    )
    assert tokens_allow_bind(settings) is False
    _, out, _ = _run(capsys, "token", "create", "--config", str(config), "--tenant", "a",
                     "--scope", "sessions")  # fmt: skip
    assert tokens_allow_bind(settings) is True
    _run(capsys, "token", "revoke", "--config", str(config), out.split("_")[1])
    assert tokens_allow_bind(settings) is False
    loopback = settings.model_copy(
        update={"server": settings.server.model_copy(update={"host": "127.0.0.1"})}
    )
    assert tokens_allow_bind(loopback) is True
