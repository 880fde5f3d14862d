"""The target's batch routes: one begin and one commit for many sessions of a drain, and
the data-port ticket for all of their missing blocks.

Each session of a batch is its own import (agentpark.moving.imports): refused alone (507
no room, 409 another layout, ...) without failing the others, and committed with the
others in one SQLite transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentpark.errors import AgentparkError
from agentpark.moving.dataport import DataPort
from agentpark.moving.imports import Importer
from agentpark.moving.landing import flat_rows
from agentpark.moving.ticket import Plan
from agentpark.moving.wire import (
    BatchBegin,
    BatchBeginAnswer,
    BatchCommit,
    BatchCommitAnswer,
    BeginItem,
    CommitItem,
    DataOffer,
    Refusal,
)

__all__ = ["BatchImports", "refusal"]


def refusal(exc: AgentparkError) -> Refusal:
    return Refusal(status=exc.status, code=exc.code, message=exc.message)


class BatchImports:
    """An importer's batch begin and commit; ``data``: the data port, if served."""

    def __init__(self, importer: Importer, data: DataPort | None) -> None:
        self.importer = importer
        self.data = data
        if data is not None:  # a batch's commit can be asked on its data connection too
            data.committer = self._commit_json

    def begin(self, body: BatchBegin) -> BatchBeginAnswer:
        items: list[BeginItem] = []
        plan: Plan = []
        to_commit: list[str] = []
        contiguous = True
        for manifest in body.manifests:
            move_id = manifest.move_id
            try:
                answer = self.importer.begin(manifest)
            except AgentparkError as exc:
                items.append(BeginItem(move_id=move_id, refused=refusal(exc)))
                continue
            items.append(BeginItem(move_id=move_id, begin=answer))
            landing = self.importer.landing(move_id)
            if not answer.committed and landing is not None:
                plan += [(move_id, i) for i in answer.missing]
                to_commit.append(move_id)
                contiguous = contiguous and flat_rows(landing.tier) is not None
        offer = self._offer(body, plan, to_commit, contiguous)
        return BatchBeginAnswer(items=items, data=offer)

    def _offer(
        self, body: BatchBegin, plan: Plan, to_commit: list[str], contiguous: bool
    ) -> DataOffer | None:
        if not (body.data and plan and contiguous) or self.data is None:
            return None
        tickets = self.data.tickets
        return DataOffer(
            port=self.data.port,
            ticket=tickets.issue(plan, to_commit),
            expires_s=tickets.ttl_s,
            nbytes=len(plan) * self.importer.core.geometry.block_nbytes,
            commit=True,
        )

    def commit(self, body: BatchCommit) -> BatchCommitAnswer:
        items: list[CommitItem] = []
        answers = self.importer.commit_many(body.move_ids)
        for move_id, answer in zip(body.move_ids, answers, strict=True):
            if isinstance(answer, AgentparkError):
                items.append(CommitItem(move_id=move_id, refused=refusal(answer)))
            else:
                items.append(CommitItem(move_id=move_id, commit=answer))
        return BatchCommitAnswer(items=items)

    def _commit_json(self, move_ids: Sequence[str]) -> bytes:
        """:meth:`commit` asked on a data connection: its answer as the route's body."""
        return self.commit(BatchCommit(move_ids=list(move_ids))).model_dump_json().encode()
