"""The reference engine's default tenants as the tests name them: each key in an environment variable (as an
operator gives them), and the `--tenant` arguments that point at those variables."""

from __future__ import annotations

KEYS = {"LP_A": "testbed-key-a", "LP_B": "testbed-key-b"}
TENANT_ARGS = ("--tenant", "tenant-a=LP_A", "--tenant", "tenant-b=LP_B")
BEARER_A = {"Authorization": "Bearer testbed-key-a"}
BEARER_B = {"Authorization": "Bearer testbed-key-b"}
