"""`python -m outrig ...` runs the `outrig` command (the server needs `outrig[server]`)."""

from outrig.service.cli import main

raise SystemExit(main())
