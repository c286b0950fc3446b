"""The one-shot uses over the runner: the audit, the demo, the forensic log scan, their progress on a terminal,
and the secrets a run holds.  The CLI and the daemon are the layers above."""
