"""The documented import path of the agent-runtime instrumentation (docs/exporter.md):

    from fleetscope.agent_signals import AgentSignals, BadToolArguments

It lives in fleetscope/agent_runtime/signals.py; this module re-exports it unchanged.
"""

from fleetscope.agent_runtime.signals import (  # noqa: F401
    CLASSES,
    EXPOSITION_CONTENT_TYPE,
    GENAI_DURATION_BUCKETS,
    GENAI_TOKEN_BUCKETS,
    OUTCOMES,
    SCOPE,
    SESSION_BUCKETS,
    SESSION_OUTCOMES,
    STAGE_BUCKETS,
    STAGES,
    AgentSignals,
    BadToolArguments,
    Inference,
    Session,
    ToolCall,
    classify_exception,
    parse_request_start,
    session_outcome,
)
