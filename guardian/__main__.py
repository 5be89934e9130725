from guardian.cli import main

raise SystemExit(main())
