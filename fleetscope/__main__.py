from fleetscope.cli import main

raise SystemExit(main())
