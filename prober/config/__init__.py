"""The configuration file: its schema (targets, tenants, loading with environment and flags) and its sections
(the audit's, detection's, each check's, the daemon's)."""
