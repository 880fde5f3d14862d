"""Command line: ``agentpark serve | db upgrade | db cleanup | token ... | status | drain |
bench ... | make-model | vllm serve``.

``--config FILE`` may come before the subcommand or after it (``agentpark serve --config
FILE``); ``status`` and ``drain`` talk to the daemon through ``agentpark.client`` (with
``--token``, default ``$AGENTPARK_TOKEN``); ``db`` and ``token`` work on the state dir's
database directly, whether a daemon runs on it or not. Everything after a ``--`` goes to
vLLM unchanged (``agentpark vllm serve MODEL -- ARGS``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentpark.config import Settings, load_settings
from agentpark.errors import ConfigError

if TYPE_CHECKING:
    import uvicorn

    from agentpark.auth import TokenStore

__all__ = ["main", "parse_args"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parse_args(parser, sys.argv[1:] if argv is None else argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"agentpark: {exc.message}", file=sys.stderr)
        return 2


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; what follows the first ``--`` is kept, unparsed, in ``extra_args``.

    Split here, not by argparse: Python 3.11's drops or refuses a second ``--``, and vLLM's
    own arguments must arrive exactly as given. Only ``vllm serve`` takes them.
    """
    words = list(argv)
    passthrough: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, passthrough = words[:at], words[at + 1 :]
    args = parser.parse_args(words)
    if passthrough and not getattr(args, "passthrough", False):
        parser.error("arguments after -- are only for `agentpark vllm serve`")
    args.extra_args = passthrough
    return args


CONFIG_HELP = "TOML config file (default: $AGENTPARK_CONFIG, else none)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentpark", description=__doc__)
    parser.add_argument("--config", type=Path, default=None, help=CONFIG_HELP)
    # Every subcommand takes --config too (after its name). SUPPRESS: one not given there
    # leaves the namespace alone, so a --config before the subcommand still counts; given
    # in both places, the later one wins.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, default=argparse.SUPPRESS, help=CONFIG_HELP)
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", help="daemon URL (default: from the config's server section)")
    client.add_argument(
        "--token",
        default=None,
        help="sent as 'Authorization: Bearer TOKEN' (default: $AGENTPARK_TOKEN)",
    )

    def add(
        subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        *parents: argparse.ArgumentParser,
        **kwargs: Any,
    ) -> argparse.ArgumentParser:
        return subparsers.add_parser(name, parents=[common, *parents], **kwargs)

    sub = parser.add_subparsers(title="commands")

    serve = add(sub, "serve", help="run the daemon (migrates the database first)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="bind port (default 8470; 0 picks one)")
    serve.add_argument(
        "--tier-files",
        choices=("refuse", "adopt", "discard"),
        help="tier files with data next to a database that knows no session: refuse to "
        "start (default), adopt them (every slot free) or discard them (moved aside); "
        "overrides reliability.tier_files",
    )
    serve.set_defaults(run=_serve)

    db = add(sub, "db", help="database maintenance")
    db.set_defaults(run=lambda _args: _print_help(db))
    db_sub = db.add_subparsers(title="db commands")
    db_up = add(db_sub, "upgrade", help="apply alembic migrations up to head")
    db_up.set_defaults(run=_db_upgrade)
    db_clean = add(
        db_sub,
        "cleanup",
        help="list moved-aside and orphaned tier files (shm, disk) and remove them",
    )
    db_clean.add_argument("--dry-run", action="store_true", help="list only")
    db_clean.add_argument("--yes", action="store_true", help="remove without asking")
    db_clean.add_argument(
        "--include-stopped",
        action="store_true",
        help="also remove files of stopped daemons whose state dir still exists (their "
        "parked sessions are recomputed at the next start)",
    )
    db_clean.add_argument(
        "--shm-dir", type=Path, default=Path("/dev/shm"), help="where shm tier files live"
    )
    db_clean.set_defaults(run=_db_cleanup)

    _token_commands(sub, add)

    drain = add(
        sub,
        "drain",
        client,
        help="park every session of a running daemon into shm/disk, then stop it",
    )
    drain.set_defaults(run=_drain)

    status = add(sub, "status", client, help="print a running daemon's /v1/host as a table")
    status.set_defaults(run=_status)

    bench = add(sub, "bench", help="benchmarks (print ratios measured in one run)")
    bench.set_defaults(run=lambda _args: _print_help(bench))
    bench_sub = bench.add_subparsers(title="benchmarks")
    transfer = add(
        bench_sub, "transfer", help="pause/restore GB/s vs np.copyto at 64 MiB, 256 MiB, 1 GiB"
    )
    transfer.add_argument(
        "--tier", choices=("dram", "shm", "disk"), default="dram", help="tier to park into"
    )
    transfer.add_argument(
        "--sizes", default="64MiB,256MiB,1GiB", help="comma-separated KV sizes per session"
    )
    transfer.add_argument("--repeats", type=int, default=5, help="runs per size (median)")
    transfer.add_argument(
        "--copy-threads",
        type=int,
        default=1,
        help="host_copy's dma.copy_threads; >1 adds ratios to an np.copyto over that many threads",
    )
    transfer.add_argument(
        "--hash-thread",
        action="store_true",
        help="host_copy's dma.hash_thread: the checksum is hashed on a second thread while "
        "the copy runs (the copy-alone table times the other path too)",
    )
    transfer.add_argument(
        "--no-native-copy",
        dest="native_copy",
        action="store_false",
        help="host_copy's dma.native_copy = false: numpy copies and xxhash instead of the "
        "native kernel (the copy-alone tables time both either way, where it is built)",
    )
    transfer.add_argument(
        "--backend",
        choices=("host_copy", "jax_memkind", "tpu_sync"),
        default="host_copy",
        help="DMA backend: jax_memkind moves blocks device <-> pinned_host with "
        "jax.device_put and is judged against a plain pinned device_put of the same bytes "
        "(the GPU check, deploy/gpu-check.sh; on JAX's CPU platform too); tpu_sync runs TPU "
        "Sync's KVCacheManager (agentpark[tpu]; on JAX's CPU platform too); both dram tier "
        "only, --copy-threads 1 only",
    )
    transfer.add_argument(
        "--dir",
        type=Path,
        help="where the tier's temporary directory goes (disk: default the current "
        "directory, never tmpfs; shm: default /dev/shm)",
    )
    transfer.set_defaults(run=_bench_transfer)
    resume = add(
        bench_sub, "resume", help="resume from dram and shm vs re-prefill from the token log"
    )
    resume.add_argument(
        "--contexts", default="1024,4096,16384", help="comma-separated context lengths (tokens)"
    )
    resume.add_argument("--repeats", type=int, default=3, help="runs per context (median)")
    resume.set_defaults(run=_bench_resume)
    control = add(
        bench_sub,
        "control",
        help="get/list/pause/resume//v1/host latency p50/p99 with many sessions, over HTTP",
    )
    control.add_argument("--sessions", type=int, default=10_000, help="sessions to create")
    control.add_argument("--samples", type=int, default=500, help="timed calls per operation")
    control.add_argument("--seed", type=int, default=0, help="which sessions are sampled")
    control.set_defaults(run=_bench_control)
    connector = add(
        bench_sub,
        "connector-control",
        help="the vLLM connector's control calls (match, park, restore) p50/p99 over the "
        "daemon's unix socket, with many parked sessions",
    )
    connector.add_argument("--sessions", type=int, default=1000, help="parked sessions")
    connector.add_argument("--samples", type=int, default=2000, help="timed calls per operation")
    connector.add_argument("--tokens", type=int, default=2048, help="tokens per session")
    connector.set_defaults(run=_bench_connector)
    agents = add(
        bench_sub,
        "agents",
        help="N agents with tool calls on one pool: keep-all, always-recompute, always-park "
        "and the adaptive policy, on a real daemon",
    )
    agents.add_argument("--agents", type=int, default=24, help="concurrent agents (default 24)")
    agents.add_argument("--turns", type=int, default=8, help="turns per agent (default 8)")
    agents.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    agents.add_argument(
        "--time-scale",
        type=float,
        default=0.1,
        help="multiplies every tool duration and the policy's times (default 0.1)",
    )
    agents.add_argument(
        "--pool-ratio",
        type=float,
        default=3.0,
        help="the agents' KV at their final lengths over the pool size (default 3)",
    )
    agents.add_argument(
        "--policies",
        default="keep-all,always-recompute,always-park,adaptive",
        help="comma-separated policies to run, in order",
    )
    agents.add_argument(
        "--plot",
        type=Path,
        default=Path("bench-agents.png"),
        help="PNG of sessions in the pool over time (needs matplotlib: the bench extra)",
    )
    agents.set_defaults(run=_bench_agents)
    bench_vllm = add(
        bench_sub,
        "vllm",
        help="agents on one vLLM with too small a KV cache: plain, with agentpark, and a roomy "
        "plain reference (needs agentpark[vllm])",
    )
    bench_vllm.add_argument("--agents", type=int, default=6, help="concurrent agents (default 6)")
    bench_vllm.add_argument("--turns", type=int, default=4, help="turns per agent (default 4)")
    bench_vllm.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    bench_vllm.add_argument(
        "--time-scale", type=float, default=0.5, help="multiplies every tool pause (default 0.5)"
    )
    bench_vllm.add_argument(
        "--new-tokens", type=int, default=16, help="tokens generated per turn (default 16)"
    )
    bench_vllm.add_argument(
        "--blocks",
        type=int,
        help="the small KV cache, in blocks of 128 tokens (default 48: 1.5 contexts of 4096)",
    )
    bench_vllm.add_argument(
        "--max-num-seqs",
        type=int,
        help="vLLM's --max-num-seqs for every run (default: vLLM's); 1 runs one request at "
        "a time, so every run batches alike and each turn must equal the reference's to "
        "the bit (the exactness check)",
    )
    bench_vllm.add_argument(
        "--model", type=Path, help="a model dir (default: make-model, 8 layers, hidden 512)"
    )
    bench_vllm.add_argument(
        "--runs", default="reference,plain,agentpark", help="comma-separated runs, in order"
    )
    bench_vllm.set_defaults(run=_bench_vllm)

    make_model = add(
        sub,
        "make-model",
        help="write a small random-weight Llama checkpoint with a tokenizer and chat "
        "template trained here (no hub), for vLLM (needs agentpark[vllm])",
    )
    make_model.add_argument("dir", type=Path, help="directory to write the model into")
    make_model.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    make_model.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    make_model.add_argument(
        "--heads", type=int, default=2, help="attention heads; hidden/heads >= 32 (default 2)"
    )
    make_model.add_argument("--kv-heads", type=int, help="key/value heads (default: heads)")
    make_model.add_argument("--vocab", type=int, default=2048, help="tokens (default 2048)")
    make_model.add_argument(
        "--max-positions", type=int, default=4096, help="longest context (default 4096)"
    )
    make_model.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    make_model.add_argument("--force", action="store_true", help="write into a non-empty dir")
    make_model.set_defaults(run=_make_model)

    vllm = add(sub, "vllm", help="vLLM with agentpark's KV connector (needs agentpark[vllm])")
    vllm.set_defaults(run=lambda _args: _print_help(vllm))
    vllm_sub = vllm.add_subparsers(title="vllm commands")
    vllm_serve = add(
        vllm_sub,
        "serve",
        help="start vLLM's OpenAI server with the connector set for a daemon; "
        "arguments after -- go to vLLM unchanged",
        usage="agentpark vllm serve MODEL [--daemon URL] [--token T] [--no-connector] "
        "[--dry-run] [-- VLLM_ARGS ...]",
    )
    vllm_serve.add_argument("model", help="model directory or name, vLLM's --model")
    vllm_serve.add_argument(
        "--daemon", help="the agentpark daemon's URL (default: from the config's server section)"
    )
    vllm_serve.add_argument(
        "--token",
        help="bearer token (sessions scope) the connector sends to the daemon (default: "
        "$AGENTPARK_TOKEN; none on a loopback daemon without tokens)",
    )
    vllm_serve.add_argument(
        "--no-connector", action="store_true", help="plain vLLM, same environment, no connector"
    )
    vllm_serve.add_argument(
        "--dry-run", action="store_true", help="print the environment and command; start nothing"
    )
    vllm_serve.set_defaults(run=_vllm_serve, passthrough=True)
    return parser


def _token_commands(sub: Any, add: Any) -> None:
    token = add(sub, "token", help="bearer tokens: create, list, revoke, export, import")
    token.set_defaults(run=lambda _args: _print_help(token))
    token_sub = token.add_subparsers(title="token commands")
    create = add(
        token_sub, "create", help="make a token for a tenant; prints it once (stored hashed)"
    )
    create.add_argument("--tenant", required=True, help="the tenant the token acts as")
    create.add_argument(
        "--scope",
        required=True,
        help="comma-separated: sessions (its tenant's sessions), operator (read-only host "
        "views of every tenant), admin (drain, reload)",
    )
    create.set_defaults(run=_token_create)
    listing = add(token_sub, "list", help="every token: id, tenant, scopes, created, last used")
    listing.set_defaults(run=_token_list)
    revoke = add(token_sub, "revoke", help="revoke a token; a running daemon refuses it at once")
    revoke.add_argument("id", help="the token's id (apk_<id>_...), as `token list` shows it")
    revoke.set_defaults(run=_token_revoke)
    export = add(
        token_sub,
        "export",
        help="print the active tokens as hashed lines (no secrets) for `token import`",
    )
    export.set_defaults(run=_token_export)
    load = add(
        token_sub,
        "import",
        help="add the tokens of a `token export` file (a Kubernetes Secret, a systemd credential)",
    )
    load.add_argument("file", type=Path, help="the file of hashed tokens; '-' reads stdin")
    load.set_defaults(run=_token_import)


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0..65535")
    return port


def _settings(args: argparse.Namespace) -> Settings:
    settings = load_settings(args.config)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    return settings


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    """The uvicorn config ``agentpark serve`` runs ``app`` with (``[server]`` settings)."""
    import uvicorn

    server = settings.server
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level=settings.log_level,
        # Longer than the idle time of clients' connection pools, so a client never reuses
        # a connection uvicorn is closing (its default, 5 s, is below most of them).
        timeout_keep_alive=server.keep_alive_s,
    )
    # Leave room for the drain: uvicorn first waits this long for requests in flight.
    config.timeout_graceful_shutdown = 10
    return config


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from agentpark.app import create_app
    from agentpark.dma import select_transfer
    from agentpark.statedir import StateLock

    settings = _settings(args)
    server = settings.server.model_copy(
        update={k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    )
    settings = settings.model_copy(update={"server": server})
    if args.tier_files is not None:
        reliability = settings.reliability.model_copy(update={"tier_files": args.tier_files})
        settings = settings.model_copy(update={"reliability": reliability})
    if settings.dma.backend != "tpu_sync":  # tpu_sync is checked when the engine exists
        select_transfer(settings.dma.backend)  # refuse what this host cannot run, before binding
    # One daemon per state dir: a second one stops here, naming the holder's pid, before
    # it binds the port. The runtime owns the lock from its start and drops it at shutdown.
    lock = StateLock.acquire(settings.state_dir)
    try:
        if not _tokens_allow_bind(settings):
            return 2
        app = create_app(settings, args.config or _env_config(), state_lock=lock)
        config = uvicorn_config(app, settings)
        daemon = uvicorn.Server(config)
        app.state.request_shutdown = lambda: setattr(daemon, "should_exit", True)
        # What start-up made lives as long as the daemon: out of the GC once warm (the
        # app's warm-up freezes it; agentpark.app.freeze_heap says why).
        app.state.freeze_heap = True
        try:
            daemon.run()  # uvicorn exits (SystemExit 3) when the lifespan fails to start
        except SystemExit:
            if getattr(app.state, "startup_error", None) is None:
                raise
        error = getattr(app.state, "startup_error", None)
        if error is not None:
            raise error  # main() prints it and exits 2
    finally:
        lock.release()  # idempotent; a startup that failed leaves it to this
    return 0


def _tokens_allow_bind(settings: Settings) -> bool:
    """A non-loopback bind needs a token in the database: anyone could act as any tenant."""
    from agentpark.auth import is_loopback

    host = settings.server.host
    if is_loopback(host):
        return True
    with _token_store(settings) as store:
        if store.active_count():
            return True
    print(
        f"agentpark: refusing to serve on {host}:{settings.server.port} without a token: "
        "anyone who can reach it could act as any tenant and stop the daemon. Make one "
        "first (the daemon need not run):\n"
        "  agentpark [--config FILE] token create --tenant NAME --scope sessions\n"
        "or import them (agentpark token import FILE), or bind 127.0.0.1.",
        file=sys.stderr,
    )
    return False


@contextmanager
def _token_store(settings: Settings) -> Iterator[TokenStore]:
    """The state dir's token table (migrated first: a new state dir works too)."""
    from agentpark.auth import TokenStore
    from agentpark.statedir import private_dir
    from agentpark.store.migrate import upgrade

    private_dir(settings.state_dir)
    upgrade(settings.database_url)
    store = TokenStore.open(settings.database_url)
    try:
        yield store
    finally:
        store.close()


def _token_create(args: argparse.Namespace) -> int:
    from agentpark.auth import parse_scopes, valid_tenant

    settings = _settings(args)
    try:
        scopes = parse_scopes(args.scope)
    except ValueError as exc:
        print(f"agentpark: --scope: {exc}", file=sys.stderr)
        return 2
    if not valid_tenant(args.tenant):
        print(
            f"agentpark: --tenant {args.tenant!r}: 1-128 letters, digits or ._-, "
            "starting with a letter or digit",
            file=sys.stderr,
        )
        return 2
    with _token_store(settings) as store:
        token, info = store.create(args.tenant, scopes)
    print(token)
    print(
        f"token {info.id}: tenant {info.tenant}, scopes {','.join(info.scopes)}. "
        "It is shown once; the database keeps only its hash.",
        file=sys.stderr,
    )
    return 0


def _when(at: float | None) -> str:
    import time

    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _token_list(args: argparse.Namespace) -> int:
    settings = _settings(args)
    with _token_store(settings) as store:
        tokens = store.entries()
    rows = [("ID", "TENANT", "SCOPES", "CREATED", "LAST USED", "REVOKED")]
    rows += [
        (
            t.id,
            t.tenant,
            ",".join(t.scopes),
            _when(t.created_at),
            _when(t.last_used_at),
            _when(t.revoked_at),
        )
        for t in tokens
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _token_revoke(args: argparse.Namespace) -> int:
    settings = _settings(args)
    with _token_store(settings) as store:
        info = store.revoke(args.id)
    if info is None:
        print(f"agentpark: no token {args.id!r} (agentpark token list)", file=sys.stderr)
        return 1
    print(f"token {info.id} (tenant {info.tenant}) revoked at {_when(info.revoked_at)}")
    return 0


def _token_export(args: argparse.Namespace) -> int:
    settings = _settings(args)
    with _token_store(settings) as store:
        lines = store.export_lines()
    print("# agentpark tokens: <id> <tenant> <scopes> sha256:<hash>; no secrets")
    for line in lines:
        print(line)
    return 0


def _token_import(args: argparse.Namespace) -> int:
    settings = _settings(args)
    try:
        text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text()
    except OSError as exc:
        print(f"agentpark: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    with _token_store(settings) as store:
        try:
            added, same = store.import_lines(text.splitlines())
        except ValueError as exc:
            print(f"agentpark: {args.file}: {exc}; nothing imported", file=sys.stderr)
            return 2
    print(f"imported {added} token(s) from {args.file}; {same} already there")
    return 0


def _db_upgrade(args: argparse.Namespace) -> int:
    from agentpark.statedir import private_dir
    from agentpark.store.migrate import upgrade

    settings = _settings(args)
    private_dir(settings.state_dir)
    upgrade(settings.database_url)
    print(f"database at head: {settings.database_url}")
    return 0


def _db_cleanup(args: argparse.Namespace) -> int:
    from agentpark.cleanup import run_cleanup

    settings = load_settings(args.config)
    tiers = settings.tiers
    roots = [settings.state_dir]
    roots += [p.parent for p in (tiers.shm.path, tiers.disk.path) if p is not None]
    return run_cleanup(
        roots,
        shm_root=args.shm_dir,
        dry_run=args.dry_run,
        yes=args.yes,
        include_stopped=args.include_stopped,
    )


def _status(args: argparse.Namespace) -> int:
    from agentpark.status import print_status

    settings = _settings(args)
    url = args.url or f"http://{settings.server.host}:{settings.server.port}"
    return print_status(url, token=_token(args))


def _token(args: argparse.Namespace) -> str | None:
    """--token, else $AGENTPARK_TOKEN, else none (the loopback default)."""
    import os

    from agentpark.auth import TOKEN_ENV

    return args.token or os.environ.get(TOKEN_ENV) or None


def _env_config() -> Path | None:
    import os

    from agentpark.config import CONFIG_ENV

    value = os.environ.get(CONFIG_ENV)
    return Path(value) if value else None


def _drain(args: argparse.Namespace) -> int:
    import httpx

    from agentpark.client import AgentparkAPIError, AgentparkClient

    settings = _settings(args)
    url = args.url or f"http://{settings.server.host}:{settings.server.port}"
    timeout = settings.shutdown.deadline_s + 30
    try:
        with AgentparkClient(url, token=_token(args), timeout=timeout) as client:
            summary = client.drain()
    except (httpx.HTTPError, AgentparkAPIError) as exc:
        print(f"agentpark: drain of {url} failed: {exc}", file=sys.stderr)
        return 1
    print(
        f"drained {url}: {summary.parked} parked, {summary.moved} moved to shm/disk, "
        f"{summary.already_safe} already safe, {summary.lost} will be recomputed"
    )
    return 0 if summary.lost == 0 else 1


def _bench_transfer(args: argparse.Namespace) -> int:
    from agentpark.bench.transfer import run_transfer_bench

    sizes = [_parse_size(s) for s in args.sizes.split(",") if s.strip()]
    return run_transfer_bench(
        sizes,
        repeats=args.repeats,
        tier=args.tier,
        directory=args.dir,
        copy_threads=args.copy_threads,
        backend=args.backend,
        hash_thread=args.hash_thread,
        native_copy=args.native_copy,
    )


def _bench_resume(args: argparse.Namespace) -> int:
    from agentpark.bench.resume import run_resume_bench

    try:
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        raise SystemExit(f"agentpark: cannot read --contexts {args.contexts!r}") from None
    return run_resume_bench(contexts, repeats=args.repeats)


def _bench_control(args: argparse.Namespace) -> int:
    from agentpark.bench.control import run_control_bench

    return run_control_bench(args.sessions, samples=args.samples, seed=args.seed)


def _bench_connector(args: argparse.Namespace) -> int:
    from agentpark.bench.connector import run_connector_bench

    return run_connector_bench(args.sessions, samples=args.samples, tokens=args.tokens)


def _bench_agents(args: argparse.Namespace) -> int:
    from agentpark.bench.agents import WorkloadSpec, run_agents_bench

    spec = WorkloadSpec(
        agents=args.agents,
        turns=args.turns,
        seed=args.seed,
        time_scale=args.time_scale,
        pool_ratio=args.pool_ratio,
    )
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    return run_agents_bench(spec, policies=policies, plot=args.plot)


def _bench_vllm(args: argparse.Namespace) -> int:
    from agentpark.bench.vllm import VllmBenchSpec, run_vllm_bench

    spec = VllmBenchSpec(
        agents=args.agents,
        turns=args.turns,
        seed=args.seed,
        time_scale=args.time_scale,
        new_tokens=args.new_tokens,
        blocks=args.blocks,
        max_num_seqs=args.max_num_seqs,
    )
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    return run_vllm_bench(spec, runs=runs, model=args.model)


def _make_model(args: argparse.Namespace) -> int:
    from agentpark.vllm_tools.model import ModelSpec, make_model

    spec = ModelSpec(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        vocab=args.vocab,
        max_positions=args.max_positions,
        seed=args.seed,
    )
    make_model(args.dir, spec, force=args.force)
    return 0


def _vllm_serve(args: argparse.Namespace) -> int:
    from agentpark.vllm_tools.launch import local_daemon_url, serve

    daemon: str | None = None
    if not args.no_connector:
        if args.daemon:
            daemon = args.daemon
        else:
            server = load_settings(args.config).server
            daemon = local_daemon_url(server.host, server.port)
    return serve(
        args.model,
        daemon_url=daemon,
        token=args.token or os.environ.get("AGENTPARK_TOKEN") or None,
        extra_args=args.extra_args,
        dry_run=args.dry_run,
    )


def _parse_size(text: str) -> int:
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(ByteSize).validate_python(text.strip()))
    except ValidationError:
        raise SystemExit(f"agentpark: cannot read size {text!r} (e.g. 64MiB, 1GiB)") from None
