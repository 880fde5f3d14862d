"""One vLLM worker process, for the restart test: ``python -m tests.connectors.tpu_real.child
'{"socket": ..., "shm_dir": ..., "seed": ..., "do": "park" | "load", ...}'``.

It builds its runner's KV caches from ``seed``, starts the TPU worker with TPU Sync's shm
mode in ``shm_dir`` and registers with the daemon at ``socket``; then, playing the
scheduler side too, parks ``blocks`` of a session ("park") or loads the session's parked
copy into ``targets`` and saves those blocks' bits to ``out`` ("load"). It prints one JSON
line: the worker's pool id, what the daemon answered, the plan.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from agentpark.connectors.client import ControlClient
from agentpark.connectors.protocol import encode_tokens
from agentpark.connectors.steps import LoadMeta, StoreMeta
from agentpark.connectors.tpu import TpuWorker
from tests.connectors.tpu_real.kv import (
    BLOCK,
    HOST_BYTES,
    MODEL_UID,
    Runner,
    blocks_of,
    make_caches,
)


def main(raw: str) -> dict[str, Any]:
    args = json.loads(raw)
    client = ControlClient(None, socket_path=args["socket"], timeout_s=10.0)
    runner = Runner(make_caches(args["seed"]))
    worker = TpuWorker(
        client,
        runner,
        block_size=BLOCK,
        model_uid=MODEL_UID,
        host_bytes=HOST_BYTES,
        shm_dir=Path(args["shm_dir"]),
    )
    answer = client.call(
        "register", layout=worker.layout.to_wire(), held=worker.held.to_wire(), wait_s=30.0
    )
    assert answer is not None and answer["ok"], answer
    tokens = args["tokens"]
    report: dict[str, Any] = {"pool_id": worker.pool_id, "register": answer["held"]}
    if args["do"] == "park":
        plan = client.call(
            "prepare_store",
            encode_tokens(tokens),
            tenant="default",
            session_id=args["session_id"],
            block_ids=args["blocks"],
            expected_resume_s=60.0,
        )
        assert plan is not None and plan["decision"] == "parked", plan
        blocks = args["blocks"]
        meta = StoreMeta("r1", plan["store_id"], blocks, plan["slots"], False, plan["pool_id"])
        assert worker.run_stores([meta]) == {"r1"}
        report["slots"] = plan["slots"]
    else:
        turn = [*tokens, 1]
        load = client.call(
            "begin_load",
            encode_tokens(turn),
            tenant="default",
            session_id=args["session_id"],
            start_block=0,
            block_ids=args["targets"],
        )
        assert load is not None and load["ok"], load
        meta = LoadMeta(
            "r2",
            load["load_id"],
            args["targets"],
            load["slots"],
            load["digests"] if any(load["digests"]) else None,
            load["pool_id"],
        )
        report["invalid"] = sorted(worker.run_loads([meta]))
        np.save(args["out"], np.stack(blocks_of(runner, args["targets"])))
    client.close()
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
