"""quantization-tool-errors: a model quantised too aggressively writes malformed tool-call
arguments.

Condition: tool calls with outcome `bad_arguments` above 5 % of a model's calls.
"""

from __future__ import annotations

from ..fleet import Add, FleetFault, Set
from ..model import EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Rate, Selector, Sum

RANK = 10
BAD_ARGUMENTS_RATIO = 0.05  # tool calls with malformed arguments, per model

_BY_MODEL = (*NODE, "pool", "model")
_BAD_RATIO = (Sum(Rate(Selector("agent_tool_calls_total", {"outcome": "bad_arguments"}),
                       WINDOW), by=_BY_MODEL)
              / Sum(Rate(Selector("agent_tool_calls_total"), WINDOW), by=_BY_MODEL))


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.kp_scenario(
        "quantization-tool-errors", "agent-kp-08",
        "a canary moved half the sessions to a Q2_K quantisation of the 7B model (to fit two "
        "models in memory); it produces malformed tool-call arguments",
        "agent_tool_calls_total outcome=bad_arguments: 16 % of calls for "
        "qwen2.5-7b-instruct-q2_k against 1 % for the Q4_K_M model",
        uptime_days=7.7, procs=k.daemons(k.KUNPENG) + k.workers(k.KUNPENG, k.ONLINE_KP, 1.15,
                                                          threads=(6, 6, 6, 6)),
        background=k.background(k.KUNPENG, 0.1, 0.03),
        agent=k.AgentPlan(sessions=14.0, models={"qwen2.5-7b-instruct-q2_k": 0.5,
                                               "qwen2.5-7b-instruct-q4_k_m": 0.5},
                        bad_args={"qwen2.5-7b-instruct-q2_k": 0.16,
                                  "qwen2.5-7b-instruct-q4_k_m": 0.011},
                        queue=[3, 4, 3, 2, 4, 3, 3, 4],
                        heartbeat=[0.7, 0.9, 1.3, 0.6, 1.1, 0.8, 1.2, 0.9]))


RULE = Rule(
    id="quantization-tool-errors",
    severity="warning",
    explains=EXPLAINS_POOL,  # its model's tool calls
    symptom="tool-call arguments sometimes malformed",
    cause="the model is quantised too aggressively (e.g. Q2_K) to produce valid tool-call "
          "arguments",
    action="compare tool-call success of Q4_K_M against Q8_0 on a test set; move the pool to "
           "the better quantisation",
    summary="model {model} in pool {pool}: {value:.0%} of tool calls had malformed arguments",
    condition=_BAD_RATIO > BAD_ARGUMENTS_RATIO,
    evidence=(Evidence("tool calls with bad arguments", _BAD_RATIO, BAD_ARGUMENTS_RATIO,
                       "ratio"),),
    confidence=0.7,
    views=(
        Panel("Tool calls with malformed arguments, per model", _BAD_RATIO, "ratio",
              BAD_ARGUMENTS_RATIO, narrow=False),
    ),
    fleet=FleetFault(("chat",), "rack", 100, effects=(
        # a 2-bit quantization of the model garbles the tool calls' arguments
        Set("tool_model", "qwen2.5-7b-instruct-q2_k"),
        Set("tool_bad_arguments_share", 0.16),
        Add("tool_call_stretch", 0.3),
    )),
    proof=Proof(scenario, summary=r"model qwen2\.5-7b-instruct-q2_k in pool chat-online: 1\d% "
                                  r"of tool calls had malformed arguments"),
)
