"""Putting agents and trackers onto machines: `kiln deploy` over SSH (paramiko), systemd units,
a compose file for tracker + Redis.

    inventory   the TOML inventory of hosts
    ssh         connections with checked host keys, key auth, a deadline on every step
    bundle      the agent's wheel and its dependencies' wheels for a host's platform
    services    systemd (system or --user) and a supervised process, per host
    units       systemd unit files (ExecStart quoting, hardening)
    operations  up, upgrade, restart, status, down over many hosts in parallel
    testing     real sshd "hosts" and a tracker on 127.0.0.1 for tests and benchmarks

Imports only `protos` of ours (to ask the tracker whether what it started registered).
"""
