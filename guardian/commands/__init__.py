"""guardian's commands: one module per command (or per family), each with the function ``cli`` dispatches to.

The product's core (sources, analysis, policy, actions, daemon) knows nothing
of these; they are its tools: the demo, offline analysis of nvidia-smi logs,
reports and replays of recorded runs, the tuning search, and the operator's
commands that talk to a running guardian.
"""
