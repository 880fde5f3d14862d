"""A transition's writes as SQL compiled once: the hot path of :class:`SessionStore`.

SQLAlchemy Core builds a statement, derives its cache key and looks it up on every
``conn.execute(update(...))``: most of a transition's bookkeeping (``SessionStore.save``
of a pause, an UPDATE, an event's INSERT and the COMMIT: 0.34-0.47 ms that way on this
machine, 0.12 ms this way). Here each statement is
compiled by SQLAlchemy for the engine's dialect the first time a set of columns is written
(a handful of sets exist: what a pause, a resume, a generate changes), then run with
``exec_driver_sql``: the SQL text and the column types' own bind processors (the JSON
columns' serialiser), so the bytes stored are the ones ``conn.execute`` would store, and a
refusal is still SQLAlchemy's ``DBAPIError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Dialect, Table, bindparam, insert, update

__all__ = ["PreparedWrites"]

_Processor = Callable[[Any], Any] | None


class _Compiled:
    """One statement's SQL and the order its parameters go in."""

    __slots__ = ("order", "sql")

    def __init__(self, sql: str, order: tuple[str, ...] | None) -> None:
        self.sql = sql
        self.order = order  # positional dialects (SQLite's qmark); None: named

    def params(self, named: dict[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        if self.order is None:
            return named
        return tuple(named[name] for name in self.order)


class PreparedWrites:
    """UPDATE of a row's changed columns and INSERT ... RETURNING of new rows, per table."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._updates: dict[tuple[Table, tuple[str, ...]], _Compiled] = {}
        self._inserts: dict[tuple[Table, tuple[str, ...]], _Compiled] = {}
        self._processors: dict[tuple[Table, str], _Processor] = {}

    def update(
        self, conn: Connection, table: Table, key: str, ident: Any, values: dict[str, Any]
    ) -> None:
        """``UPDATE table SET <values> WHERE <key> = ident`` (values by column name)."""
        columns = tuple(values)
        compiled = self._updates.get((table, columns))
        if compiled is None:
            stmt = update(table).where(table.c[key] == bindparam("p_key"))
            stmt = stmt.values({c: bindparam(f"p_{c}") for c in columns})
            compiled = self._updates[(table, columns)] = self._compile(stmt)
        named = self._named(table, values)
        named["p_key"] = ident
        conn.exec_driver_sql(compiled.sql, compiled.params(named))

    def insert(self, conn: Connection, table: Table, returning: str, values: dict[str, Any]) -> Any:
        """``INSERT INTO table <values> RETURNING <returning>``: the new row's key."""
        compiled = self.prepare_insert(table, returning, tuple(values))
        result = conn.exec_driver_sql(compiled.sql, compiled.params(self._named(table, values)))
        return result.scalar_one()

    def prepare_insert(self, table: Table, returning: str, columns: tuple[str, ...]) -> _Compiled:
        """The INSERT of ``columns``, compiled the first time (a start warms it up)."""
        compiled = self._inserts.get((table, columns))
        if compiled is None:
            stmt = insert(table).values({c: bindparam(f"p_{c}") for c in columns})
            compiled = self._inserts[(table, columns)] = self._compile(
                stmt.returning(table.c[returning])
            )
        return compiled

    def _compile(self, stmt: Any) -> _Compiled:
        compiled = stmt.compile(dialect=self._dialect)
        order: Sequence[str] | None = compiled.positiontup if self._dialect.positional else None
        return _Compiled(compiled.string, None if order is None else tuple(order))

    def _named(self, table: Table, values: dict[str, Any]) -> dict[str, Any]:
        named = {}
        for column, value in values.items():
            process = self._processor(table, column)
            # None too: a JSON column stores None as JSON 'null', as conn.execute would.
            named[f"p_{column}"] = value if process is None else process(value)
        return named

    def _processor(self, table: Table, column: str) -> _Processor:
        try:
            return self._processors[(table, column)]
        except KeyError:
            process = table.c[column].type.bind_processor(self._dialect)
            self._processors[(table, column)] = process
            return process
