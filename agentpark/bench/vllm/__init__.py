"""``agentpark bench vllm``: agents on one real vLLM server whose KV cache is too small for
them all: plain vLLM, vLLM with agentpark (once per client), and a roomy plain reference.

**Workload** (seeded; the same requests in every run). N agents start together. Agent *i*
sends a system prompt and a task (``context`` tokens of standard-library text in all, drawn
per agent), then plays ``turns`` turns: a turn is one streamed, greedy chat completion of
``new_tokens`` tokens (``ignore_eos``); between two turns the agent runs a tool: the client
writes the assistant's tool call itself (a random-weight model never emits a parseable one,
and an orchestrator replays the same), waits the tool's drawn pause (log-normal around the
tool's median, times ``time_scale``) and appends the tool's result (``result`` tokens of
text). The model's own answers are recorded, not fed back, so every run sends the very same
prompts and the tokens of a turn can be compared across runs. Each request names its
session in ``kv_transfer_params.agentpark`` with the tool that follows and its median as
``expected_resume_s`` (ignored by plain vLLM).

**Clients** (``--client``, several for one agentpark run each): how a request names its
session. ``agentpark``: ``kv_transfer_params.agentpark`` as above; ``session-id``: only the
``X-Session-ID`` header (vLLM's multi-turn benchmark with --send-conversation-id; vLLM 0.32
reads it as ``request.session_id``); ``none``: only the messages. Plain vLLM (reference and
plain) is sent the messages only. Runs are named ``agentpark/<client>``.

**Workloads** (``--workload``). ``agents``: as above. ``shared-prefix``: the same agents all
sending one system prompt of ``--system-tokens`` (then a task of their own): the pool should
hold it once, so the second table sets the bytes parked at the end (the tiers' bytes in use
from ``/v1/host``, after less before) against one copy per session (every parked session's
KV counted whole: ``reclaimed_bytes``), and sessions parked per GiB of pool both ways.
``multi-turn``: conversations shaped like vLLM's own KV-offloading benchmark
(agentpark.bench.vllm.conversations), sent by ``--concurrency`` clients in turn, no pauses.

**Runs.** ``reference``: plain vLLM, prefix caching on, a KV cache with room for every
agent: its cache hits are the exact keep-all. ``plain``: the same under pressure
(``--num-gpu-blocks-override``, default: room for about 1.5 agents at their longest):
idle agents' blocks are evicted and recomputed. ``agentpark``: the same pressure with
agentpark's connector and a daemon in vLLM mode (a child process, temporary state dir
and pool): parked sessions are restored instead, with the daemon's default turn-end
rule. The turn-end rules of issue 20 are runs of their own, the same pressure, each with
its daemon told its rule (``AGENTPARK_VLLM__TURN_END``; spec.TURN_ENDS): ``park``
(always park, as agentpark did before pins), ``pin`` (pin every turn for the fixed
``--pin-ttl-s``, drop what has no room and never park: Continuum's rule) and
``adaptive`` (keep = pin / park / drop chosen per turn); the default ``--runs`` is
reference, plain, park, pin, adaptive. Each run gets a fresh server (and daemon).

**Figures** per run: prefill tokens computed (sum of ``usage.prompt_tokens -
prompt_tokens_details.cached_tokens``), p50/p99 time to first token of the turns after a
tool returned (from the end of the pause to the first streamed token), makespan (first
request to last answer), bytes parked and restored (the daemon's ``/v1/host`` counters), and
turns whose tokens differ from the reference's (tokens, then logprobs to the bit). With
more than one agentpark run, a table sets the rules side by side: prefill against plain and
against the reference, p50/p99 TTFT after a tool, and the turn ends by kind (pinned,
parked, dropped, kept; pins released under pressure; pins ended by cause) from the
daemon's events, then the adaptive rule's targets, each said met or not. Plain's
recomputed turns may differ by rounding (batched prefill and decode round differently):
they are counted, not hidden; so are agentpark's later turns that vLLM computed (a kept
session whose blocks it evicted). Which turns agentpark restored comes from the daemon's
``resume`` events of the agent's session (none for the ``none`` client: its sessions are
anonymous). In the multi-turn workload a later turn's TTFT counts from when a client picked
the conversation up. Batched (vLLM's default ``--max-num-seqs``) the servers batch the same
requests differently, and that alone moves logprobs and now and then a greedy token, first
turns included (nothing cached or restored there): those differences are printed per kind
of turn, not judged. ``--max-num-seqs 1`` runs one request at a time, so every run batches
alike: the exactness check, where a restored turn must equal the reference to the bit. The
bench exits 1 when a request failed or, in that mode, a restored turn differs.
"""

# The package, one job a module, arrows down: run (the bench, one run) -> drive (the agents
# over the OpenAI API), daemon (the agentpark daemon child), report -> compare (turns against
# the reference), parked (the pool's figures) -> workload -> conversations (multi-turn) ->
# plan, results -> spec; report -> variants (the turn-end rules side by side) -> compare.
from agentpark.bench.vllm.compare import breakdown, decisions, failed, mark_restored
from agentpark.bench.vllm.results import RunResult, TurnResult
from agentpark.bench.vllm.run import run_vllm_bench
from agentpark.bench.vllm.spec import CLIENTS, RUNS, WORKLOADS, VllmBenchSpec

__all__ = [
    "CLIENTS",
    "RUNS",
    "WORKLOADS",
    "RunResult",
    "TurnResult",
    "VllmBenchSpec",
    "breakdown",
    "decisions",
    "failed",
    "mark_restored",
    "run_vllm_bench",
]
