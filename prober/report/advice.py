"""What to do about each finding kind, in one line: the first thing an on-call engineer reads under an
incident in a report (docs/auditing.md's finding-kinds table says the same at more length)."""

from __future__ import annotations

from prober.domain.types import FindingKind

WHAT_TO_DO: dict[FindingKind, str] = {
    FindingKind.CROSS_TENANT_ECHO: "Treat it as a data breach: stop routing prompts over the KV pool to this engine "
                                   "(cap the advertised context at the pool, or drain it), then find the hand-off or "
                                   "cache that crossed tenants. Keep the ledger: it proves whose canary reached whom.",
    FindingKind.PLACEHOLDER_SUBSTITUTION: "Treat it as a data breach: the answer was computed over pages the prompt "
                                          "never wrote. Refuse over-capacity prompts before the scheduler; make the "
                                          "abort reach the prefill-to-decode hand-off.",
    FindingKind.BOUNDARY_ACCEPTED: "Cap the advertised context at what the KV pool holds (SGLang --context-length, "
                                   "vLLM --max-model-len), or refuse longer prompts at the gateway, before it leaks.",
    FindingKind.CROSS_TENANT_CACHE_HIT: "Salt the prefix cache per tenant (vLLM cache_salt), give tenants their own "
                                        "slots, or turn prompt caching off for untrusted tenants.",
    FindingKind.CROSS_TENANT_CACHE_TIMING: "The prefix cache is shared between these tenants (their prompts answer "
                                           "sooner): salt it per tenant, and check that the gateway sends the salt.",
    FindingKind.PHANTOM_CACHE_HIT: "Treat it as a data breach: the engine skipped computing KV it never had and "
                                   "decoded over whatever its pages held. Check the KV connector or hand-off that "
                                   "reported these tokens as received (the engine's external-hit counters are in "
                                   "the evidence), and route around it.",
    FindingKind.COUNTED_FAILURE: "The engine aborted a request (or lost its KV transfer) while the client got HTTP "
                                 "200: find where the abort is not passed on (the scheduler to the hand-off, the "
                                 "hand-off to the answer), and treat the answers of that window as suspect.",
    FindingKind.CROSS_REQUEST_ECHO: "Answers were mixed between concurrent requests: check the engine's batching and "
                                    "the gateway's response routing before another tenant's answer is mixed in.",
    FindingKind.FOREIGN_CONTENT: "Read the masked excerpt: data that is not a canary (another tenant's real text), or "
                                 "a model wandering; a leak at the same boundary makes the first likely.",
    FindingKind.GARBLED_OUTPUT: "The engine corrupted what the model read or wrote (KV restored from an offload tier "
                                "before its copy landed, tokens handed to the wrong request): compare with the same "
                                "prompt with offloading and speculative decoding off; its answers can carry other "
                                "requests' data.",
    FindingKind.ENGINE_ERROR: "The engine fails at this length or concurrency instead of answering or refusing (a "
                              "5xx, or an answer that would not end): read its logs, and the gateway's, at that time.",
    FindingKind.STREAM_ERROR: "An error inside an HTTP-200 stream, or a stream that would not end: clients that check "
                              "only the status code take it for an answer; have the engine (or gateway) fail with a "
                              "status, and end what it cannot finish.",
    FindingKind.ODD_FINISH_REASON: "Check what ended the request (an abort the client was not told about).",
    FindingKind.UNEXPECTED_REFUSAL: "The capacity numbers are off, or a gateway refuses: set capacity: in the config, "
                                    "check the model name and the credentials. That boundary went untested.",
    FindingKind.PATH_JITTER: "Nothing to fix in the engine: a gateway's prompt that changes per request (a date, a "
                             "request reference) moved this prompt across the limit. Give the tenant's requests a "
                             "fixed operator prompt to test that boundary exactly.",
    FindingKind.CROSS_TENANT_RESPONSE_CACHE: "Treat it as a data breach: a cache in front of the engine keys answers "
                                             "without the caller. Scope its key per tenant (LiteLLM: a cache "
                                             "namespace per caller, set in a pre-call hook) or turn it off.",
    FindingKind.TENANT_RESPONSE_CACHE: "Nothing to fix: a cache in front answers each tenant from its own earlier "
                                       "answers only. Its copies say nothing about the engine; the checks judge the "
                                       "engine by the answers it made.",
    FindingKind.ROUTE_DEPENDENT_CACHE: "Read the cache map route by route: the gateway scopes (or keeps) its cache "
                                       "on some routes and not others, so a fix tested on one route proves nothing "
                                       "for the rest (LiteLLM CVE-2026-89032: chat scoped, the Responses API "
                                       "shared). Scope every route the gateway serves, or close those it need not.",
    FindingKind.IMPLAUSIBLE_USAGE: "The engine's (or a gateway's) token accounting cannot be trusted: budgets and the "
                                   "placeholder check ignored its figures; find who rewrites usage.",
}
