"""Putting agents and trackers onto machines: SSH with paramiko, systemd units, a compose file.

Empty until the deploy issue; imports only `protos` (to health-check what it started).
"""
