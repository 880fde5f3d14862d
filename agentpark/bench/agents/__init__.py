"""``agentpark bench agents``: many agents, one pool, four ways to treat an agent's KV.

A synthetic agentic workload drives a real daemon (uvicorn on 127.0.0.1, started by the bench,
with a temporary state directory and a temporary /dev/shm directory for the shm tier) over
real HTTP, one thread per agent. The same seeded workload runs under four policies, each on a
fresh daemon with the same model and the same pool, so the rows differ only in what happens
to an agent's KV while its tool runs.

**Workload.** N agents start together. Agent *i* sends a prompt (a system prompt and a task:
``prompt_tokens`` random tokens), then runs ``turns`` turns: a turn sends its input (the
prompt, or the previous tool's result: ``result_tokens`` tokens) and generates
``new_tokens`` tokens; between two turns the agent calls a tool and waits for it. The tool
is drawn per call (weights below) and its duration from the tool's log-normal distribution
(median, sigma, capped at ``cap`` x median), all multiplied by ``time_scale`` so a run takes
minutes: at the default 0.1 a web search of a median 8 s takes 0.8 s. Contexts grow to
several hundred to ~1k tokens; the reference model is big enough that a prefill of that is
hundreds of milliseconds on a CPU. The pool is sized so the agents' whole KV (each at its
final length) is ``pool_ratio`` times the pool.

**Policies.**

* ``keep-all``: no parking (the daemon has no tier, so nothing can be parked, not even by
  pressure relief) and no pause calls. Sessions only grow and hold their KV until the agent
  is done, so an agent is admitted when the pool has room for its whole context: FIFO, a
  block reservation in the bench, as an engine without preemption must do (admitting on
  current size deadlocks once every holder needs one more block). Waiting for admission
  counts in the makespan; a generate that still finds no room retries on 507 with a backoff.
* ``always-recompute``: drop the KV at every tool call and prefill it again when the tool
  returns: ``DELETE`` the session, then create a new one and generate with the whole token
  history (prompt, every generated token, every tool result) as ``prompt_tokens``. That is
  exactly "drop the KV, re-prefill", done by the real daemon's prefill path and measured end
  to end. No tiers either; a generate that finds no room waits on 507, and an agent whose
  follow-up call finds no room drops its KV and re-prefills later (recompute preemption).
* ``always-park``: ``pause`` with ``force: true`` at every tool call, the policy loop off (no
  idle, pressure-watermark or prefetch actions); the next generate restores the session.
* ``adaptive``: agentpark's policy, with its defaults (idle timeout, min_pause_s, watermark,
  prefetch lead, demotion, tick) scaled by ``time_scale`` like the workload, and per-tool
  priors set to each tool's median, as an operator who knows the tools would. ``pause``
  names the tool and, for the tools an orchestrator can estimate (``hinted``: its own
  services, web search and code run), gives ``expected_resume_s`` = the tool's median, so
  prefetch can restore the session before it returns; a human approval and a file read get
  no estimate, so the daemon's learned pauses (priors until it has seen some) decide. Short
  pauses are kept by break-even; a generate that finds no room parks idle sessions least
  recently used first.

**Metrics.** *Makespan*: from the start until the last agent has finished (its session
deleted). *Turns/s*: agents x turns / makespan. *TTFT* (time to first token after a tool
returns): the API does not stream, so each turn after a tool is two calls, ``generate(tool
result, max_new_tokens=1)`` then ``generate(max_new_tokens=new_tokens-1)``; TTFT is the time
from the tool's return (its drawn duration after the call started, even if a slow pause
call outlasted it) until the first call answered: waiting for room (507 retries), the
restore or re-prefill, the prefill of the result and one decode step. *Peak agents in
pool*: the most sessions holding KV in the pool at once, rebuilt from the daemon's events
(a session holds KV from the start of its first generate or restore to its pause or
delete). *HBM reclaimed*: byte-seconds of parked KV (each parked interval's bytes times its
length, from the events); KV that always-recompute drops is not "parked" and counts 0.
``/v1/host`` is sampled every 50 ms for the peak pool use and the plot's parked-KV panel.

**Checks.** The bench exits 1 when an agent did not complete all its turns, a generate
returned fewer tokens than asked, a session did not end with its whole context, or an
agent's tokens under always-park or adaptive differ from keep-all's (a restore is bit-exact,
so greedy decoding must give the same tokens). Re-prefill computes the log in different
chunks, so always-recompute's tokens are reported, not required, to match. Targets are
printed as met or not; they do not change the exit status.
"""

# The package, one job a module, arrows down: run (the bench) -> policy_run (one policy on
# one daemon), report, plot -> agent (one agent's HTTP loop), setup (the daemons' shared
# settings) -> results -> timeline, workload.
from agentpark.bench.agents.agent import BlockBudget
from agentpark.bench.agents.results import PolicyResult
from agentpark.bench.agents.run import run_agents_bench
from agentpark.bench.agents.setup import BENCH_MODEL, adaptive_policy
from agentpark.bench.agents.timeline import (
    parked_byte_seconds,
    pool_timeline,
    time_average,
    undone_pressure_parks,
)
from agentpark.bench.agents.workload import (
    ADAPTIVE,
    ALWAYS_PARK,
    DEFAULT_TOOLS,
    KEEP_ALL,
    PARKING_POLICIES,
    POLICIES,
    RECOMPUTE,
    AgentPlan,
    ToolCall,
    ToolSpec,
    WorkloadSpec,
    make_workload,
)

__all__ = [
    "ADAPTIVE",
    "ALWAYS_PARK",
    "BENCH_MODEL",
    "DEFAULT_TOOLS",
    "KEEP_ALL",
    "PARKING_POLICIES",
    "POLICIES",
    "RECOMPUTE",
    "AgentPlan",
    "BlockBudget",
    "PolicyResult",
    "ToolCall",
    "ToolSpec",
    "WorkloadSpec",
    "adaptive_policy",
    "make_workload",
    "parked_byte_seconds",
    "pool_timeline",
    "run_agents_bench",
    "time_average",
    "undone_pressure_parks",
]
