"""The `outrig` command: `main` parses the command line and runs one command (cli/commands.py).

The commands' own modules sit beside it: `admin` (inspecting a space), `health` (probing a
server's gRPC health service), `security` (`outrig certs`, `outrig keys`, `outrig token`).
`outrig serve` runs the server of outrig.service.transport.server in this process, or, with
`--workers N`, N of them under the supervisor of outrig.service.supervisor.
"""

from outrig.service.cli.commands import main

__all__ = ["main"]
