from outrig.service.cli import main

raise SystemExit(main())
