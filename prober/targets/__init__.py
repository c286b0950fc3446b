"""Talking to endpoints the way their users do: one `Target` per API (OpenAI-compatible, Workers AI) over one
transport and its policy, credentials, the engine's own metrics, and an outbox of every prompt sent.  Knows nothing of
canaries or detection."""

from prober.targets.api import Api
from prober.targets.base import HTTPTarget, Media, Prompt, Target
from prober.targets.credentials import CredentialSource, Secret
from prober.targets.openai import OpenAICompatible
from prober.targets.result import Completion, ErrorKind, TargetError, Usage
from prober.targets.transport import Transport, TransportPolicy
from prober.targets.workers_ai import WorkersAI

__all__ = ["Api", "Completion", "CredentialSource", "ErrorKind", "HTTPTarget", "Media", "OpenAICompatible",
           "Prompt", "Secret", "Target", "TargetError", "Transport", "TransportPolicy", "Usage", "WorkersAI"]
