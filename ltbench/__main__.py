from ltbench.cli import main

raise SystemExit(main())
